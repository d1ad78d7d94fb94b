// The one conversion of CUDA runtime and cuBLAS error codes to absl::Status (STYLE.md §3).
// Included only by kernels/*.cu.cc: it pulls in the CUDA headers.
//
//   RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(...), "CopyToHost");
//   RETURN_IF_CUBLAS_ERROR(cublasSgemm(...), "Gemm");
//
// Messages carry the operation and the error's name, e.g.
// "CopyToHost: cudaErrorIllegalAddress (an illegal memory access was encountered)".
#ifndef PS_KERNELS_CUDA_STATUS_H_
#define PS_KERNELS_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace ps::kernels {

// OK for cudaSuccess. Codes: RESOURCE_EXHAUSTED for out-of-memory; FAILED_PRECONDITION when
// there is no usable device or driver; INVALID_ARGUMENT for a bad device ordinal; INTERNAL
// for everything else (a kernel fault or a misuse of the API by this code).
inline absl::Status CudaErrorToStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:
      return absl::FailedPreconditionError(message);
    case cudaErrorInvalidDevice:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

// CudaErrorToStatus for the error that a runtime call has just returned, after clearing the
// runtime's last-error slot (cudaGetLastError). A failed call leaves its error there, and
// where the error is not sticky (an allocation that failed, a value the call rejected) the
// next cudaGetLastError would return it: every kernel launcher ends with that call, and would
// report the old error as its launch's. A sticky error (a kernel fault) cannot be cleared and
// fails every later call anyway.
inline absl::Status CudaCallToStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return CudaErrorToStatus(error, what);
}

// OK for CUBLAS_STATUS_SUCCESS. RESOURCE_EXHAUSTED for allocation failures,
// FAILED_PRECONDITION for an uninitialized library or an unsupported architecture, INTERNAL
// otherwise (arguments are validated before cuBLAS is called).
inline absl::Status CublasErrorToStatus(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", cublasGetStatusName(status), " (",
                                           cublasGetStatusString(status), ")");
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace ps::kernels

// For the runtime's calls: also clears a failed call's error (CudaCallToStatus).
#define RETURN_IF_CUDA_ERROR(expr, what) \
  RETURN_IF_ERROR(::ps::kernels::CudaCallToStatus((expr), (what)))
#define RETURN_IF_CUBLAS_ERROR(expr, what) \
  RETURN_IF_ERROR(::ps::kernels::CublasErrorToStatus((expr), (what)))

#endif  // PS_KERNELS_CUDA_STATUS_H_
