// Launchers of the CUDA kernels behind the CUDA backend (cuda_kernels.cu.cc), called by
// cuda_backend.cu.cc. Internal to //kernels, and included only by .cu.cc files (CUDA types).
//
// Every launcher enqueues work on `stream` and returns the launch error (cudaGetLastError);
// execution errors surface at the backend's next synchronization. Arguments are validated by
// the backend before they get here: sizes are >= 0 and pointers non-null where data exists.
//
// Device error flag: kernels that can meet bad input (indices, labels) OR a bit into
// `*error_flags` (host-mapped memory the backend reads after synchronizing) and skip the bad
// element instead of touching memory outside their buffers.
#ifndef PS_KERNELS_INTERNAL_CUDA_KERNELS_H_
#define PS_KERNELS_INTERNAL_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/internal/optimizer_math.h"
#include "kernels/optimizer.h"

namespace ps::kernels::internal {

// Bits of the device error flag.
inline constexpr int kEmbeddingIndexError = 1;
inline constexpr int kLabelError = 2;

// Blocks used by the first pass of a reduction; the size of its partial-sum scratch.
inline constexpr int kMaxReduceBlocks = 1024;

cudaError_t LaunchFill(int64_t n, float value, float* x, cudaStream_t stream);

// c[i][j] = beta * c[i][j] (beta == 0 writes 0) for an m x n matrix with row stride ldc.
cudaError_t LaunchScaleMatrix(int m, int n, float beta, float* c, int ldc, cudaStream_t stream);

cudaError_t LaunchBiasAdd(int64_t rows, int64_t cols, const float* bias, float* x,
                          cudaStream_t stream);
// Sums rows in order, like the CPU backend, so results are bit-identical.
cudaError_t LaunchBiasGrad(int64_t rows, int64_t cols, const float* dy, float* db,
                           cudaStream_t stream);

cudaError_t LaunchActivationForward(Activation act, int64_t n, const float* x, float* y,
                                    cudaStream_t stream);
cudaError_t LaunchActivationBackward(Activation act, int64_t n, const float* y, const float* dy,
                                     float* dx, cudaStream_t stream);

// One warp per row: row_loss[r] = logsumexp(row) - row[label]; row_correct[r] = 1 if the
// argmax (lowest index among ties) equals the label; optional grad_out = (softmax - onehot) *
// grad_scale and probabilities = softmax. A label outside [0, classes) sets kLabelError and
// gives that row loss 0.
cudaError_t LaunchSoftmaxXent(int64_t rows, int64_t classes, const float* logits,
                              const int32_t* labels, float grad_scale, float* grad_out,
                              float* probabilities, double* row_loss, double* row_correct,
                              int* error_flags, cudaStream_t stream);

// elem_loss[i] = binary cross-entropy of logits[i]; optional grad_out = (sigmoid - label) *
// grad_scale and probabilities = sigmoid.
cudaError_t LaunchSigmoidXent(int64_t n, const float* logits, const float* labels,
                              float grad_scale, float* grad_out, float* probabilities,
                              double* elem_loss, cudaStream_t stream);

// *out = sum of x[0..n), deterministic for a given n. `partials` holds kMaxReduceBlocks.
// `out` may be device memory or host-mapped memory.
cudaError_t LaunchSum(int64_t n, const double* x, double* partials, double* out,
                      cudaStream_t stream);

// *out = how many of x[0..n) are NaN or infinite, as a double (exact below 2^53). `partials`
// holds kMaxReduceBlocks; `out` may be device memory or host-mapped memory.
cudaError_t LaunchCountNonFinite(int64_t n, const float* x, double* partials, double* out,
                                 cudaStream_t stream);

cudaError_t LaunchEmbeddingGather(int64_t n, int64_t dim, const float* table, int64_t table_rows,
                                  const int32_t* indices, float* out, int* error_flags,
                                  cudaStream_t stream);
cudaError_t LaunchEmbeddingScatterAdd(int64_t n, int64_t dim, const float* grads,
                                      const int32_t* indices, int64_t out_rows, float* out,
                                      int* error_flags, cudaStream_t stream);

// *sum_sq = squared L2 norm of the decayed, value-clipped gradient (optimizer.h, steps 1-2).
cudaError_t LaunchClippedGradSumSq(const OptimizerConsts& c, int64_t n, const float* w,
                                   const float* g, double* partials, double* sum_sq,
                                   cudaStream_t stream);

// One update of `kind` (slot1 null unless the rule has two slots). If sum_sq is not null the
// gradient is scaled by ClipNormScale(clip_norm, *sum_sq), read on the device.
cudaError_t LaunchOptimizer(OptimizerKind kind, const OptimizerConsts& c, float clip_norm,
                            const double* sum_sq, int64_t n, float* w, const float* g,
                            float* slot0, float* slot1, cudaStream_t stream);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_INTERNAL_CUDA_KERNELS_H_
