// Constructors of the concrete backends, called only by CreateBackend (backend.cc).
//
// CreateCudaBackend, CudaDeviceCount and CudaCompiledIn are defined by cuda_backend.cu.cc in a
// `--config=cuda` build and by cuda_backend_stub.cc otherwise (picked by a config_setting), so
// the default build needs no CUDA toolkit. Internal to //kernels.
#ifndef PS_KERNELS_INTERNAL_BACKEND_FACTORIES_H_
#define PS_KERNELS_INTERNAL_BACKEND_FACTORIES_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace ps::kernels::internal {

// The OpenBLAS backend. REQUIRES options validated by CreateBackend.
std::unique_ptr<Backend> CreateCpuBackend(const BackendOptions& options);

// The cuBLAS backend on options.device_index. FAILED_PRECONDITION when CUDA is not compiled
// in or the device is absent or unusable; other codes for CUDA/cuBLAS errors.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options);

// Number of usable CUDA devices: 0 without CUDA, without a driver, or without devices.
int CudaDeviceCount();

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_INTERNAL_BACKEND_FACTORIES_H_
