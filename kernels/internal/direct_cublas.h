// A bare cuBLAS SGEMM on device buffers, with its own handle on the default stream: the
// reference the benchmarks compare the Backend API's GEMM against on a GPU (as cblas_sgemm is
// on the CPU). Row-major arguments, like Backend::Gemm. Without --config=cuda, Create()
// returns UNIMPLEMENTED.
#ifndef PS_KERNELS_INTERNAL_DIRECT_CUBLAS_H_
#define PS_KERNELS_INTERNAL_DIRECT_CUBLAS_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps::kernels::internal {

class DirectCublas {
 public:
  static absl::StatusOr<std::unique_ptr<DirectCublas>> Create();
  virtual ~DirectCublas() = default;

  // C[m x n] = A[m x k] * B[k x n] (each optionally transposed), then waits for the device.
  virtual absl::Status SgemmAndWait(bool trans_a, bool trans_b, int m, int n, int k, const float* a,
                                    int lda, const float* b, int ldb, float* c, int ldc) = 0;
};

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_INTERNAL_DIRECT_CUBLAS_H_
