// Per-element optimizer math shared by the CPU loops (optimizer.cc) and the CUDA kernels
// (cuda_kernels.cu.cc), so both backends run the same arithmetic in the same order.
//
// Everything that does not depend on the element (bias corrections, 1 - beta, clip bounds)
// is folded into an OptimizerConsts on the host once per call; the element functions are
// branch-free so that the CPU loops vectorize.
//
// Plain C++ when compiled by g++; __host__ __device__ under nvcc. Internal to //kernels.
#ifndef PS_KERNELS_INTERNAL_OPTIMIZER_MATH_H_
#define PS_KERNELS_INTERNAL_OPTIMIZER_MATH_H_

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/optimizer.h"

#if defined(__CUDACC__)
#define PS_KERNELS_HD __host__ __device__ __forceinline__
#else
#define PS_KERNELS_HD inline __attribute__((always_inline))
#endif

namespace ps::kernels::internal {

// Constants of one ApplyOptimizer call, derived from OptimizerParams and the step.
struct OptimizerConsts {
  // Gradient preparation: g = clamp(g + weight_decay * w, clip_lo, clip_hi) * scale.
  // Off settings become identities (bounds of +-inf, scale 1), so no branches are needed.
  float weight_decay;
  float clip_lo;
  float clip_hi;
  float lr;
  // kMomentum: w -= lr * (g_coef * g + v_coef * v).
  float momentum;
  float g_coef;
  float v_coef;
  // kAdam.
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float lr_over_bc1;    // lr / (1 - beta1^t)
  float inv_bc2;        // 1 / (1 - beta2^t)
  float epsilon;
  // kFtrl.
  float l1, l2;
  float inv_lr;         // 1 / lr
  float beta_over_lr;   // ftrl_beta / lr
};

inline OptimizerConsts MakeOptimizerConsts(const OptimizerParams& p, int64_t step) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  OptimizerConsts c;
  c.weight_decay = p.weight_decay;
  c.clip_lo = p.clip_value > 0 ? -p.clip_value : -kInf;
  c.clip_hi = p.clip_value > 0 ? p.clip_value : kInf;
  c.lr = p.learning_rate;
  c.momentum = p.momentum;
  c.g_coef = p.nesterov ? 1.f : 0.f;
  c.v_coef = p.nesterov ? p.momentum : 1.f;
  c.beta1 = p.beta1;
  c.one_minus_beta1 = 1.f - p.beta1;
  c.beta2 = p.beta2;
  c.one_minus_beta2 = 1.f - p.beta2;
  // Powers in double: beta2^t for t in the millions underflows gracefully to 0 either way,
  // but 1 - beta2^t for small t loses digits in float. Only Adam reads them, and a sparse push
  // makes these constants once per row: the two pow calls were a visible part of an SGD row's
  // update, so other rules skip them.
  c.lr_over_bc1 = p.learning_rate;
  c.inv_bc2 = 1.f;
  if (p.kind == OptimizerKind::kAdam) {
    const double t = static_cast<double>(step);
    c.lr_over_bc1 = static_cast<float>(p.learning_rate / (1.0 - std::pow(double{p.beta1}, t)));
    c.inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(double{p.beta2}, t)));
  }
  c.epsilon = p.epsilon;
  c.l1 = p.l1;
  c.l2 = p.l2;
  c.inv_lr = 1.f / p.learning_rate;
  c.beta_over_lr = p.ftrl_beta / p.learning_rate;
  return c;
}

// Factor that brings a gradient of squared norm `sum_sq` down to `clip_norm` (1 if already
// within it, or if clipping is off).
PS_KERNELS_HD float ClipNormScale(float clip_norm, double sum_sq) {
  if (clip_norm <= 0) return 1.f;
  const double norm = std::sqrt(sum_sq);
  return norm > clip_norm ? static_cast<float>(double{clip_norm} / norm) : 1.f;
}

// Written as compare-selects, which compile to maxps/minps on x86 (NaN propagates).
PS_KERNELS_HD float ClampValue(float x, float lo, float hi) {
  x = x < lo ? lo : x;
  return x > hi ? hi : x;
}

// Steps 1-2 of the effective gradient (weight decay, clip_value); the caller multiplies by
// the clip_norm scale.
PS_KERNELS_HD float DecayAndClip(const OptimizerConsts& c, float g, float w) {
  return ClampValue(g + c.weight_decay * w, c.clip_lo, c.clip_hi);
}

PS_KERNELS_HD void SgdElement(const OptimizerConsts& c, float g, float& w) { w -= c.lr * g; }

PS_KERNELS_HD void MomentumElement(const OptimizerConsts& c, float g, float& w, float& v) {
  v = c.momentum * v + g;
  w -= c.lr * (c.g_coef * g + c.v_coef * v);
}

PS_KERNELS_HD void AdagradElement(const OptimizerConsts& c, float g, float& w, float& a) {
  a += g * g;
  w -= c.lr * g / (std::sqrt(a) + c.epsilon);
}

PS_KERNELS_HD void AdamElement(const OptimizerConsts& c, float g, float& w, float& m, float& v) {
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * (g * g);
  w -= c.lr_over_bc1 * m / (std::sqrt(v * c.inv_bc2) + c.epsilon);
}

PS_KERNELS_HD void FtrlElement(const OptimizerConsts& c, float g, float& w, float& z,
                               float& n) {
  const float n_new = n + g * g;
  const float sqrt_n_new = std::sqrt(n_new);
  const float sigma = (sqrt_n_new - std::sqrt(n)) * c.inv_lr;
  z += g - sigma * w;
  n = n_new;
  // sign(z) * l1 without a branch; when |z| <= l1 the select below discards the value.
  const float shrunk = z - std::copysign(c.l1, z);
  const float w_new = -shrunk / (c.beta_over_lr + sqrt_n_new * c.inv_lr + c.l2);
  w = std::fabs(z) <= c.l1 ? 0.f : w_new;
}

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_INTERNAL_OPTIMIZER_MATH_H_
