// CUDA kernels of the CUDA backend and their launchers (declared in internal/cuda_kernels.h).
//
// Elementwise kernels use grid-stride loops with 64-bit indices. Reductions are two fixed
// passes (per-block partial sums in double, then one block over the partials), so a result
// depends only on n, never on scheduling; float atomics appear only in EmbeddingScatterAdd,
// whose summation order the API leaves unspecified.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/internal/cuda_kernels.h"
#include "kernels/internal/optimizer_math.h"

namespace ps::kernels::internal {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;

int BlocksFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t GridStride() {
  return static_cast<int64_t>(blockDim.x) * gridDim.x;
}

// Sum over the block; the result is valid in thread 0. REQUIRES blockDim.x == kThreads.
__device__ double BlockSum(double value) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

// ---- Memory and dense layers ----------------------------------------------------------------

__global__ void FillKernel(int64_t n, float value, float* x) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) x[i] = value;
}

__global__ void ScaleMatrixKernel(int m, int n, float beta, float* c, int ldc) {
  const int64_t total = int64_t{m} * n;
  for (int64_t i = GlobalThread(); i < total; i += GridStride()) {
    float* p = c + (i / n) * ldc + i % n;
    *p = beta == 0.f ? 0.f : beta * *p;
  }
}

__global__ void BiasAddKernel(int64_t rows, int64_t cols, const float* bias, float* x) {
  const int64_t total = rows * cols;
  for (int64_t i = GlobalThread(); i < total; i += GridStride()) x[i] += bias[i % cols];
}

// One thread per column walking down the rows: adjacent threads read adjacent addresses
// (coalesced), and the additions happen in the CPU backend's order.
__global__ void BiasGradKernel(int64_t rows, int64_t cols, const float* dy, float* db) {
  for (int64_t c = GlobalThread(); c < cols; c += GridStride()) {
    float sum = 0.f;
    for (int64_t r = 0; r < rows; ++r) sum += dy[r * cols + c];
    db[c] = sum;
  }
}

template <Activation kAct>
__device__ __forceinline__ float Forward(float x) {
  if constexpr (kAct == Activation::kRelu) {
    return x > 0.f ? x : 0.f;
  } else if constexpr (kAct == Activation::kTanh) {
    return tanhf(x);
  } else {
    return 1.f / (1.f + expf(-x));
  }
}

template <Activation kAct>
__device__ __forceinline__ float Backward(float y, float dy) {
  if constexpr (kAct == Activation::kRelu) {
    return y > 0.f ? dy : 0.f;
  } else if constexpr (kAct == Activation::kTanh) {
    return dy * (1.f - y * y);
  } else {
    return dy * y * (1.f - y);
  }
}

template <Activation kAct>
__global__ void ActivationForwardKernel(int64_t n, const float* x, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) y[i] = Forward<kAct>(x[i]);
}

template <Activation kAct>
__global__ void ActivationBackwardKernel(int64_t n, const float* y, const float* dy,
                                         float* dx) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) dx[i] = Backward<kAct>(y[i], dy[i]);
}

// ---- Losses ---------------------------------------------------------------------------------

constexpr unsigned kFullMask = 0xffffffffu;

// One warp per row; lanes stride over the classes.
__global__ void SoftmaxXentKernel(int64_t rows, int64_t classes, const float* logits,
                                  const int32_t* labels, float grad_scale, float* grad_out,
                                  float* probabilities, double* row_loss, double* row_correct,
                                  int* error_flags) {
  const int64_t row = GlobalThread() / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // Uniform across the warp: all its lanes share `row`.
  const float* x = logits + row * classes;
  const int32_t label = labels[row];
  const bool bad_label = label < 0 || label >= classes;
  // Read before any lane may overwrite the row (grad_out may equal logits).
  const float label_logit = bad_label ? 0.f : x[label];

  // Max and its lowest index; idx < 0 marks "no element seen yet".
  float best = -INFINITY;
  int64_t idx = -1;
  for (int64_t j = lane; j < classes; j += 32) {
    if (idx < 0 || x[j] > best) {
      best = x[j];
      idx = j;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_best = __shfl_xor_sync(kFullMask, best, offset);
    const int64_t other_idx = __shfl_xor_sync(kFullMask, idx, offset);
    if (other_idx >= 0 &&
        (idx < 0 || other_best > best || (other_best == best && other_idx < idx))) {
      best = other_best;
      idx = other_idx;
    }
  }
  float sum = 0.f;
  for (int64_t j = lane; j < classes; j += 32) sum += expf(x[j] - best);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
  __syncwarp();  // All reads of the row are done before the writes below.

  const float inv_sum = 1.f / sum;
  for (int64_t j = lane; j < classes; j += 32) {
    const float p = expf(x[j] - best) * inv_sum;
    if (probabilities != nullptr) probabilities[row * classes + j] = p;
    if (grad_out != nullptr) {
      grad_out[row * classes + j] = (p - (j == label ? 1.f : 0.f)) * grad_scale;
    }
  }
  if (lane == 0) {
    row_loss[row] = bad_label ? 0.0 : double{best} + log(double{sum}) - label_logit;
    row_correct[row] = !bad_label && idx == label ? 1.0 : 0.0;
    if (bad_label) atomicOr(error_flags, kLabelError);
  }
}

__global__ void SigmoidXentKernel(int64_t n, const float* logits, const float* labels,
                                  float grad_scale, float* grad_out, float* probabilities,
                                  double* elem_loss) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const float x = logits[i], y = labels[i];
    elem_loss[i] = fmaxf(x, 0.f) - x * y + log1pf(expf(-fabsf(x)));
    const float p = 1.f / (1.f + expf(-x));
    if (grad_out != nullptr) grad_out[i] = (p - y) * grad_scale;
    if (probabilities != nullptr) probabilities[i] = p;
  }
}

__global__ void PartialSumKernel(int64_t n, const double* x, double* partials) {
  double sum = 0;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) sum += x[i];
  sum = BlockSum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// Per block: how many of x are NaN or infinite (by the bits: every exponent bit set).
__global__ void NonFinitePartialKernel(int64_t n, const float* x, double* partials) {
  double count = 0;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    count += (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u ? 1.0 : 0.0;
  }
  count = BlockSum(count);
  if (threadIdx.x == 0) partials[blockIdx.x] = count;
}

// Single block.
__global__ void FinalSumKernel(int count, const double* partials, double* out) {
  double sum = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  sum = BlockSum(sum);
  if (threadIdx.x == 0) *out = sum;
}

// ---- Embeddings -----------------------------------------------------------------------------

__global__ void EmbeddingGatherKernel(int64_t n, int64_t dim, const float* table,
                                      int64_t table_rows, const int32_t* indices, float* out,
                                      int* error_flags) {
  const int64_t total = n * dim;
  for (int64_t e = GlobalThread(); e < total; e += GridStride()) {
    const int64_t i = e / dim, d = e % dim;
    const int32_t row = indices[i];
    if (row < 0 || row >= table_rows) {
      out[e] = 0.f;
      if (d == 0) atomicOr(error_flags, kEmbeddingIndexError);
    } else {
      out[e] = table[row * dim + d];
    }
  }
}

__global__ void EmbeddingScatterAddKernel(int64_t n, int64_t dim, const float* grads,
                                          const int32_t* indices, int64_t out_rows, float* out,
                                          int* error_flags) {
  const int64_t total = n * dim;
  for (int64_t e = GlobalThread(); e < total; e += GridStride()) {
    const int64_t i = e / dim, d = e % dim;
    const int32_t row = indices[i];
    if (row < 0 || row >= out_rows) {
      if (d == 0) atomicOr(error_flags, kEmbeddingIndexError);
    } else {
      atomicAdd(out + row * dim + d, grads[e]);
    }
  }
}

// ---- Optimizer ------------------------------------------------------------------------------

__global__ void ClippedGradSumSqKernel(OptimizerConsts c, int64_t n, const float* w,
                                       const float* g, double* partials) {
  double sum = 0;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const float e = DecayAndClip(c, g[i], w[i]);
    sum += double{e} * e;
  }
  sum = BlockSum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

template <OptimizerKind kKind>
__global__ void OptimizerKernel(OptimizerConsts c, float clip_norm, const double* sum_sq,
                                int64_t n, float* __restrict__ w, const float* __restrict__ g,
                                float* __restrict__ s0, float* __restrict__ s1) {
  const float scale = sum_sq == nullptr ? 1.f : ClipNormScale(clip_norm, *sum_sq);
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    float wi = w[i];
    const float gi = DecayAndClip(c, g[i], wi) * scale;
    if constexpr (kKind == OptimizerKind::kSgd) {
      SgdElement(c, gi, wi);
    } else if constexpr (kKind == OptimizerKind::kMomentum) {
      MomentumElement(c, gi, wi, s0[i]);
    } else if constexpr (kKind == OptimizerKind::kAdagrad) {
      AdagradElement(c, gi, wi, s0[i]);
    } else if constexpr (kKind == OptimizerKind::kAdam) {
      AdamElement(c, gi, wi, s0[i], s1[i]);
    } else {
      FtrlElement(c, gi, wi, s0[i], s1[i]);
    }
    w[i] = wi;
  }
}

template <OptimizerKind kKind>
void LaunchOptimizerKernel(const OptimizerConsts& c, float clip_norm, const double* sum_sq,
                           int64_t n, float* w, const float* g, float* s0, float* s1,
                           cudaStream_t stream) {
  OptimizerKernel<kKind><<<BlocksFor(n), kThreads, 0, stream>>>(c, clip_norm, sum_sq, n, w, g,
                                                                s0, s1);
}

}  // namespace

cudaError_t LaunchFill(int64_t n, float value, float* x, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<BlocksFor(n), kThreads, 0, stream>>>(n, value, x);
  return cudaGetLastError();
}

cudaError_t LaunchScaleMatrix(int m, int n, float beta, float* c, int ldc, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  ScaleMatrixKernel<<<BlocksFor(int64_t{m} * n), kThreads, 0, stream>>>(m, n, beta, c, ldc);
  return cudaGetLastError();
}

cudaError_t LaunchBiasAdd(int64_t rows, int64_t cols, const float* bias, float* x,
                          cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  BiasAddKernel<<<BlocksFor(rows * cols), kThreads, 0, stream>>>(rows, cols, bias, x);
  return cudaGetLastError();
}

cudaError_t LaunchBiasGrad(int64_t rows, int64_t cols, const float* dy, float* db,
                           cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  BiasGradKernel<<<BlocksFor(cols), kThreads, 0, stream>>>(rows, cols, dy, db);
  return cudaGetLastError();
}

cudaError_t LaunchActivationForward(Activation act, int64_t n, const float* x, float* y,
                                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (act) {
    case Activation::kRelu:
      ActivationForwardKernel<Activation::kRelu><<<BlocksFor(n), kThreads, 0, stream>>>(n, x, y);
      break;
    case Activation::kTanh:
      ActivationForwardKernel<Activation::kTanh><<<BlocksFor(n), kThreads, 0, stream>>>(n, x, y);
      break;
    case Activation::kSigmoid:
      ActivationForwardKernel<Activation::kSigmoid>
          <<<BlocksFor(n), kThreads, 0, stream>>>(n, x, y);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchActivationBackward(Activation act, int64_t n, const float* y, const float* dy,
                                     float* dx, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (act) {
    case Activation::kRelu:
      ActivationBackwardKernel<Activation::kRelu>
          <<<BlocksFor(n), kThreads, 0, stream>>>(n, y, dy, dx);
      break;
    case Activation::kTanh:
      ActivationBackwardKernel<Activation::kTanh>
          <<<BlocksFor(n), kThreads, 0, stream>>>(n, y, dy, dx);
      break;
    case Activation::kSigmoid:
      ActivationBackwardKernel<Activation::kSigmoid>
          <<<BlocksFor(n), kThreads, 0, stream>>>(n, y, dy, dx);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxXent(int64_t rows, int64_t classes, const float* logits,
                              const int32_t* labels, float grad_scale, float* grad_out,
                              float* probabilities, double* row_loss, double* row_correct,
                              int* error_flags, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kThreads / 32;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  SoftmaxXentKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      rows, classes, logits, labels, grad_scale, grad_out, probabilities, row_loss, row_correct,
      error_flags);
  return cudaGetLastError();
}

cudaError_t LaunchSigmoidXent(int64_t n, const float* logits, const float* labels,
                              float grad_scale, float* grad_out, float* probabilities,
                              double* elem_loss, cudaStream_t stream) {
  SigmoidXentKernel<<<BlocksFor(n), kThreads, 0, stream>>>(n, logits, labels, grad_scale,
                                                           grad_out, probabilities, elem_loss);
  return cudaGetLastError();
}

// A two-pass sum into *out: `partial` (a kernel of (n, x, partials)) writes one partial per
// block of at most kMaxReduceBlocks, then one block adds them up.
template <typename T>
cudaError_t ReduceToSum(void (*partial)(int64_t, const T*, double*), int64_t n, const T* x,
                        double* partials, double* out, cudaStream_t stream) {
  const int blocks = BlocksFor(n) < kMaxReduceBlocks ? BlocksFor(n) : kMaxReduceBlocks;
  partial<<<blocks, kThreads, 0, stream>>>(n, x, partials);
  FinalSumKernel<<<1, kThreads, 0, stream>>>(blocks, partials, out);
  return cudaGetLastError();
}

cudaError_t LaunchSum(int64_t n, const double* x, double* partials, double* out,
                      cudaStream_t stream) {
  return ReduceToSum(PartialSumKernel, n, x, partials, out, stream);
}

cudaError_t LaunchCountNonFinite(int64_t n, const float* x, double* partials, double* out,
                                 cudaStream_t stream) {
  return ReduceToSum(NonFinitePartialKernel, n, x, partials, out, stream);
}

cudaError_t LaunchEmbeddingGather(int64_t n, int64_t dim, const float* table, int64_t table_rows,
                                  const int32_t* indices, float* out, int* error_flags,
                                  cudaStream_t stream) {
  if (n == 0 || dim == 0) return cudaSuccess;
  EmbeddingGatherKernel<<<BlocksFor(n * dim), kThreads, 0, stream>>>(
      n, dim, table, table_rows, indices, out, error_flags);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingScatterAdd(int64_t n, int64_t dim, const float* grads,
                                      const int32_t* indices, int64_t out_rows, float* out,
                                      int* error_flags, cudaStream_t stream) {
  if (n == 0 || dim == 0) return cudaSuccess;
  EmbeddingScatterAddKernel<<<BlocksFor(n * dim), kThreads, 0, stream>>>(
      n, dim, grads, indices, out_rows, out, error_flags);
  return cudaGetLastError();
}

cudaError_t LaunchClippedGradSumSq(const OptimizerConsts& c, int64_t n, const float* w,
                                   const float* g, double* partials, double* sum_sq,
                                   cudaStream_t stream) {
  const int blocks = BlocksFor(n) < kMaxReduceBlocks ? BlocksFor(n) : kMaxReduceBlocks;
  ClippedGradSumSqKernel<<<blocks, kThreads, 0, stream>>>(c, n, w, g, partials);
  FinalSumKernel<<<1, kThreads, 0, stream>>>(blocks, partials, sum_sq);
  return cudaGetLastError();
}

cudaError_t LaunchOptimizer(OptimizerKind kind, const OptimizerConsts& c, float clip_norm,
                            const double* sum_sq, int64_t n, float* w, const float* g,
                            float* slot0, float* slot1, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (kind) {
    case OptimizerKind::kSgd:
      LaunchOptimizerKernel<OptimizerKind::kSgd>(c, clip_norm, sum_sq, n, w, g, slot0, slot1,
                                                 stream);
      break;
    case OptimizerKind::kMomentum:
      LaunchOptimizerKernel<OptimizerKind::kMomentum>(c, clip_norm, sum_sq, n, w, g, slot0,
                                                      slot1, stream);
      break;
    case OptimizerKind::kAdagrad:
      LaunchOptimizerKernel<OptimizerKind::kAdagrad>(c, clip_norm, sum_sq, n, w, g, slot0,
                                                     slot1, stream);
      break;
    case OptimizerKind::kAdam:
      LaunchOptimizerKernel<OptimizerKind::kAdam>(c, clip_norm, sum_sq, n, w, g, slot0, slot1,
                                                  stream);
      break;
    case OptimizerKind::kFtrl:
      LaunchOptimizerKernel<OptimizerKind::kFtrl>(c, clip_norm, sum_sq, n, w, g, slot0, slot1,
                                                  stream);
      break;
  }
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
