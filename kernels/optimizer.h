// Optimizer update rules on flat float spans: the CPU reference that the parameter server
// applies to incoming gradients, and that the CUDA backend matches element for element (but
// for subnormal values, below).
//
// A parameter span of n floats carries NumSlots(kind) slot spans of n floats each (optimizer
// state: momentum, accumulators, moments). Callers own all memory; nothing here allocates.
//
// Every update computes an effective gradient first, in this order:
//   1. g = grad + weight_decay * w                 (weight_decay == 0: off)
//   2. g = clamp(g, -clip_value, clip_value)       (clip_value == 0: off)
//   3. g = g * min(1, clip_norm / ||g||_2)         (clip_norm == 0: off; the norm is over the
//                                                   whole span, of the g from step 2)
// and then the rule of `kind` (lr = learning_rate, t = step):
//   kSgd      w -= lr * g
//   kMomentum v = momentum * v + g;  w -= lr * (nesterov ? g + momentum * v : v)
//   kAdagrad  a += g^2;  w -= lr * g / (sqrt(a) + epsilon)
//   kAdam     m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//             w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + epsilon)
//   kFtrl     FTRL-Proximal (McMahan et al., KDD 2013), slots z and n:
//             n' = n + g^2;  sigma = (sqrt(n') - sqrt(n)) / lr;  z += g - sigma * w;  n = n';
//             w = |z| <= l1 ? 0 : -(z - sign(z) * l1) / ((ftrl_beta + sqrt(n)) / lr + l2)
//
// On x86 and AArch64, subnormal values (below FLT_MIN in magnitude) in the spans and the
// parameters read as 0, and results that would be subnormal are written as 0, whatever the
// calling thread's floating-point mode (flush_denormals.h: on x86 each such value costs a
// microcode assist). The CUDA kernels keep subnormals (GPUs run them at full speed), so the
// two backends may differ wherever one is involved: a subnormal divided by a small
// denominator (Adagrad's or Adam's epsilon) moves a weight by far more than 1e-38 on the GPU
// and not at all here, usually below the weight's own rounding.
//
// Thread-safety: the functions are pure apart from the spans they are handed; concurrent calls
// on disjoint spans are safe.
#ifndef PS_KERNELS_OPTIMIZER_H_
#define PS_KERNELS_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ps::kernels {

enum class OptimizerKind { kSgd, kMomentum, kAdagrad, kAdam, kFtrl };

// Lower-case name ("sgd", "momentum", "adagrad", "adam", "ftrl") for logs and messages.
absl::string_view OptimizerKindName(OptimizerKind kind);

// Hyper-parameters of one optimizer. Plain data; check with ValidateOptimizerParams.
struct OptimizerParams {
  // Which rule ApplyOptimizer runs. Default plain SGD.
  OptimizerKind kind = OptimizerKind::kSgd;
  // Step size, all rules. REQUIRES > 0 (and finite).
  float learning_rate = 0.01f;
  // kMomentum: decay of the velocity slot. REQUIRES in [0, 1).
  float momentum = 0.9f;
  // kMomentum: Nesterov's look-ahead form.
  bool nesterov = false;
  // kAdam: decay of the first and second moment estimates. REQUIRES each in [0, 1).
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  // kAdagrad, kAdam: added to the denominator. REQUIRES > 0.
  float epsilon = 1e-8f;
  // kAdagrad: start value of the accumulator slot (SlotInitialValue). REQUIRES >= 0.
  float initial_accumulator = 0.1f;
  // kFtrl: L1 and L2 regularization strengths and the beta of the per-coordinate learning
  // rate. REQUIRES l1 >= 0, l2 >= 0, ftrl_beta >= 0.
  float l1 = 0.f;
  float l2 = 0.f;
  float ftrl_beta = 1.0f;
  // All rules: L2 weight decay folded into the gradient, g += weight_decay * w, before
  // clipping and the rule (not AdamW's decoupled form). 0 = off. REQUIRES >= 0.
  float weight_decay = 0.f;
  // All rules: clamp each gradient element to [-clip_value, clip_value]. 0 = off.
  // REQUIRES >= 0.
  float clip_value = 0.f;
  // All rules: scale the gradient so that its L2 norm over the whole span is <= clip_norm.
  // 0 = off. REQUIRES >= 0. Costs a second pass over the gradient.
  float clip_norm = 0.f;
};

// Number of slot spans the rule keeps per parameter: kSgd 0, kMomentum 1 (velocity),
// kAdagrad 1 (accumulator), kAdam 2 (m, v), kFtrl 2 (z, n).
int NumSlots(OptimizerKind kind);

// Value that slot `slot` must hold before the first update: initial_accumulator for kAdagrad's
// accumulator, 0 otherwise. REQUIRES 0 <= slot < NumSlots(p.kind).
float SlotInitialValue(const OptimizerParams& p, int slot);

// OK, or INVALID_ARGUMENT naming the first offending field (e.g. "learning_rate must be > 0,
// got 0"). Fields that `p.kind` does not use are checked too, so a config cannot carry a
// nonsensical value that becomes live when the kind changes.
[[nodiscard]] absl::Status ValidateOptimizerParams(const OptimizerParams& p);

// Values given as little-endian float32 bytes at any address (e.g. where a network receive
// buffer holds them): the kernels read them without assuming float alignment, so a payload
// need not be copied to an aligned buffer first.
struct FloatBytes {
  const void* data = nullptr;
  int64_t n = 0;  // values (4 bytes each)
  // The bytes lie in memory another process may still write (a worker's shared-memory
  // segment): they were checked before, but a value may have changed since, so each is read
  // once and one that is not finite is taken as 0. Finite values give the same result bit for
  // bit as with this off.
  bool zero_nonfinite = false;
};

// Applies one update in place, as described at the top of this file.
// `step`: 1-based count of updates this span has received, this one included (Adam's bias
// correction; other rules ignore it).
// REQUIRES: ValidateOptimizerParams(p).ok(); step >= 1; grads.size() == params.size();
// slots.size() == NumSlots(p.kind), each slot points at params.size() floats initialized
// with SlotInitialValue before the first step; no span overlaps another.
void ApplyOptimizer(const OptimizerParams& p, int64_t step, absl::Span<float> params,
                    absl::Span<const float> grads, absl::Span<float* const> slots);
// The same with the gradient as bytes (REQUIRES grads.n == params.size()); the result is the
// same bit for bit.
void ApplyOptimizer(const OptimizerParams& p, int64_t step, absl::Span<float> params,
                    FloatBytes grads, absl::Span<float* const> slots);

// SGD as ApplyOptimizer runs it (OptimizerKind::kSgd, no clip_norm), in one pass that also
// copies each parameter's value before the update to `undo` and counts the values of `grads`
// that are not finite. Each gradient value is read once; one that is not finite counts and is
// taken as 0 (as with grads.zero_nonfinite). So the finite check and the update of a push cost
// one read of its bytes, and a caller that finds the count not 0 puts `undo` back: the
// parameters are then bit for bit what they were. With a count of 0 the result is bit for bit
// ApplyOptimizer's. REQUIRES: p.kind == kSgd, p.clip_norm == 0, step >= 1, `undo` holds
// params.size() floats not overlapping params or grads, grads.n == params.size().
size_t SgdCountingNonFinite(const OptimizerParams& p, int64_t step, absl::Span<float> params,
                            FloatBytes grads, float* undo);

// params += scale * delta (merging a local-SGD delta). REQUIRES delta.size() == params.size().
void ApplyDelta(float scale, absl::Span<float> params, absl::Span<const float> delta);
void ApplyDelta(float scale, absl::Span<float> params, FloatBytes delta);

}  // namespace ps::kernels

#endif  // PS_KERNELS_OPTIMIZER_H_
