// The CUDA half of the backend factory in a build without CUDA (the default; see the
// config_setting //bazel:cuda). Linked instead of cuda_backend.cu.cc.
#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/internal/backend_factories.h"

namespace ps::kernels {

bool CudaCompiledIn() { return false; }

namespace internal {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions&) {
  return absl::FailedPreconditionError(
      "device \"cuda\" requested, but this binary was built without CUDA support "
      "(rebuild with `bazel build --config=cuda`, or use device \"cpu\" or \"auto\")");
}

int CudaDeviceCount() { return 0; }

}  // namespace internal
}  // namespace ps::kernels
