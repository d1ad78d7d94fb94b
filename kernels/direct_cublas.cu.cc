#include "kernels/internal/direct_cublas.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>

#include "kernels/cuda_status.h"

namespace ps::kernels::internal {
namespace {

class DirectCublasImpl : public DirectCublas {
 public:
  explicit DirectCublasImpl(cublasHandle_t handle) : handle_(handle) {}
  ~DirectCublasImpl() override { cublasDestroy(handle_); }

  absl::Status SgemmAndWait(bool trans_a, bool trans_b, int m, int n, int k, const float* a,
                            int lda, const float* b, int ldb, float* c, int ldc) override {
    const float alpha = 1.f, beta = 0.f;
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    RETURN_IF_CUBLAS_ERROR(cublasSgemm(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb,
                                       a, lda, &beta, c, ldc),
                           "cublasSgemm");
    RETURN_IF_CUDA_ERROR(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return absl::OkStatus();
  }

 private:
  cublasHandle_t handle_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DirectCublas>> DirectCublas::Create() {
  cublasHandle_t handle;
  RETURN_IF_CUBLAS_ERROR(cublasCreate(&handle), "cublasCreate");
  return std::make_unique<DirectCublasImpl>(handle);
}

}  // namespace ps::kernels::internal
