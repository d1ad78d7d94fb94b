#include "kernels/backend.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/internal/backend_factories.h"

namespace ps::kernels {
namespace {

absl::Status ValidateBackendOptions(const BackendOptions& options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BackendOptions.num_threads must be >= 0, got ", options.num_threads));
  }
  if (options.device_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BackendOptions.device_index must be >= 0, got ", options.device_index));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view device,
                                                       const BackendOptions& options) {
  RETURN_IF_ERROR(ValidateBackendOptions(options));
  if (device == "cpu") return internal::CreateCpuBackend(options);
  if (device == "cuda") return internal::CreateCudaBackend(options);
  if (device == "auto") {
    // A device that is present but fails to initialize is an error worth seeing, not a
    // reason to fall back silently; "auto" only decides on presence.
    if (CudaCompiledIn() && internal::CudaDeviceCount() > 0) {
      return internal::CreateCudaBackend(options);
    }
    return internal::CreateCpuBackend(options);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device \"", device, "\"; expected \"cpu\", \"cuda\" or \"auto\""));
}

}  // namespace ps::kernels
