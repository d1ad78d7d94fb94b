// Each rule is checked against two steps on a 3-element vector whose expected values are
// written out below. The simple rules carry their arithmetic in comments; Adagrad, Adam and
// FTRL were computed independently in float64 from the formulas in optimizer.h (not with
// this code), so a mismatch means the implementation and the documented formula disagree.
#include "kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/flush_denormals.h"

namespace ps::kernels {
namespace {

using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;

constexpr float kTol = 2e-6f;

// Parameters plus their slots, initialized as a server would.
struct Model {
  Model(const OptimizerParams& p, std::vector<float> w) : params(p), weights(std::move(w)) {
    for (int s = 0; s < NumSlots(p.kind); ++s) {
      slots.emplace_back(weights.size(), SlotInitialValue(p, s));
    }
  }

  void Step(const std::vector<float>& grads) {
    std::vector<float*> slot_ptrs;
    for (auto& s : slots) slot_ptrs.push_back(s.data());
    ApplyOptimizer(params, ++step, absl::MakeSpan(weights), grads, slot_ptrs);
  }

  OptimizerParams params;
  std::vector<float> weights;
  std::vector<std::vector<float>> slots;
  int64_t step = 0;
};

OptimizerParams Params(OptimizerKind kind, float lr) {
  OptimizerParams p;
  p.kind = kind;
  p.learning_rate = lr;
  return p;
}

const std::vector<float> kW0 = {0.5f, -1.0f, 2.0f};
const std::vector<float> kG1 = {0.1f, -0.2f, 0.3f};
const std::vector<float> kG2 = {-0.05f, 0.4f, 0.0f};

TEST(OptimizerTest, SlotCountsAndInitialValues) {
  EXPECT_EQ(NumSlots(OptimizerKind::kSgd), 0);
  EXPECT_EQ(NumSlots(OptimizerKind::kMomentum), 1);
  EXPECT_EQ(NumSlots(OptimizerKind::kAdagrad), 1);
  EXPECT_EQ(NumSlots(OptimizerKind::kAdam), 2);
  EXPECT_EQ(NumSlots(OptimizerKind::kFtrl), 2);
  OptimizerParams p = Params(OptimizerKind::kAdagrad, 0.1f);
  p.initial_accumulator = 0.25f;
  EXPECT_EQ(SlotInitialValue(p, 0), 0.25f);
  p.kind = OptimizerKind::kAdam;
  EXPECT_EQ(SlotInitialValue(p, 0), 0.f);
  EXPECT_EQ(SlotInitialValue(p, 1), 0.f);
}

TEST(OptimizerTest, SgdTwoSteps) {
  Model m(Params(OptimizerKind::kSgd, 0.1f), kW0);
  m.Step(kG1);  // w - 0.1 * g = {0.5 - 0.01, -1 + 0.02, 2 - 0.03}
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.49f, -0.98f, 1.97f}));
  m.Step(kG2);  // {0.49 + 0.005, -0.98 - 0.04, 1.97 - 0}
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.495f, -1.02f, 1.97f}));
}

TEST(OptimizerTest, MomentumTwoSteps) {
  OptimizerParams p = Params(OptimizerKind::kMomentum, 0.1f);
  p.momentum = 0.9f;
  Model m(p, kW0);
  m.Step(kG1);  // v = g1; w -= 0.1 * v
  EXPECT_THAT(m.slots[0], Pointwise(FloatNear(kTol), {0.1f, -0.2f, 0.3f}));
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.49f, -0.98f, 1.97f}));
  m.Step(kG2);  // v = 0.9 v + g2 = {0.04, 0.22, 0.27}; w -= 0.1 v
  EXPECT_THAT(m.slots[0], Pointwise(FloatNear(kTol), {0.04f, 0.22f, 0.27f}));
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.486f, -1.002f, 1.943f}));
}

TEST(OptimizerTest, NesterovMomentumTwoSteps) {
  OptimizerParams p = Params(OptimizerKind::kMomentum, 0.1f);
  p.momentum = 0.9f;
  p.nesterov = true;
  Model m(p, kW0);
  m.Step(kG1);  // v = g1; w -= 0.1 (g1 + 0.9 v) = 0.1 * 1.9 g1
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.481f, -0.962f, 1.943f}));
  m.Step(kG2);  // v = {0.04, 0.22, 0.27}; w -= 0.1 (g2 + 0.9 v) = 0.1 {-0.014, 0.598, 0.243}
  EXPECT_THAT(m.slots[0], Pointwise(FloatNear(kTol), {0.04f, 0.22f, 0.27f}));
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.4824f, -1.0218f, 1.9187f}));
}

TEST(OptimizerTest, AdagradTwoSteps) {
  OptimizerParams p = Params(OptimizerKind::kAdagrad, 0.1f);
  p.initial_accumulator = 0.1f;
  Model m(p, kW0);
  m.Step(kG1);  // a = 0.1 + g^2 = {0.11, 0.14, 0.19}; w -= 0.1 g / sqrt(a)
  EXPECT_THAT(m.slots[0], Pointwise(FloatNear(kTol), {0.11f, 0.14f, 0.19f}));
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.469848866f, -0.946547753f, 1.93117528f}));
  m.Step(kG2);
  EXPECT_THAT(m.slots[0], Pointwise(FloatNear(kTol), {0.1125f, 0.3f, 0.19f}));
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.484755986f, -1.01957743f, 1.93117528f}));
}

TEST(OptimizerTest, AdamTwoStepsWithBiasCorrection) {
  Model m(Params(OptimizerKind::kAdam, 0.01f), kW0);  // beta1 0.9, beta2 0.999, eps 1e-8
  m.Step(kG1);  // bias-corrected first step moves each weight by lr * sign(g)
  EXPECT_THAT(m.slots[0], Pointwise(FloatNear(kTol), {0.01f, -0.02f, 0.03f}));
  // 1 - 0.999f is 0.00099998713f, so v is off by 1.3e-5 relative from the decimal value.
  EXPECT_THAT(m.slots[1], Pointwise(FloatNear(5e-9f), {1e-05f, 4e-05f, 9e-05f}));
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.49f, -0.99f, 1.99f}));
  m.Step(kG2);
  EXPECT_THAT(m.slots[0], Pointwise(FloatNear(kTol), {0.004f, 0.022f, 0.027f}));
  EXPECT_THAT(m.slots[1], Pointwise(FloatNear(5e-9f), {1.249e-05f, 0.00019996f, 8.991e-05f}));
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.487336631f, -0.993661036f, 1.98329942f}));
}

TEST(OptimizerTest, FtrlTwoStepsWithL1Sparsity) {
  OptimizerParams p = Params(OptimizerKind::kFtrl, 0.1f);
  p.l1 = 0.01f;
  p.l2 = 0.1f;
  p.ftrl_beta = 1.0f;
  Model m(p, {0.0f, 0.5f, -1.0f});
  // Element 0: z = 0.005 then 0.006, both within l1, so its weight stays exactly 0.
  m.Step({0.005f, 0.2f, -0.3f});
  EXPECT_THAT(m.slots[0], Pointwise(FloatNear(kTol), {0.005f, -0.8f, 2.7f}));
  EXPECT_THAT(m.slots[1], Pointwise(FloatNear(kTol), {2.5e-05f, 0.04f, 0.09f}));
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.f, 0.0652892562f, -0.205343511f}));
  m.Step({0.001f, -0.1f, 0.2f});
  EXPECT_THAT(m.slots[0], Pointwise(FloatNear(4e-6f), {0.006f, -0.915412703f, 3.02434603f}));
  EXPECT_THAT(m.slots[1], Pointwise(FloatNear(kTol), {2.6e-05f, 0.05f, 0.13f}));
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.f, 0.0733955669f, -0.219936139f}));
  EXPECT_EQ(m.weights[0], 0.f);
}

TEST(OptimizerTest, WeightDecayAddsToGradient) {
  OptimizerParams p = Params(OptimizerKind::kSgd, 0.1f);
  p.weight_decay = 0.01f;
  Model m(p, kW0);
  m.Step(kG1);  // g = g1 + 0.01 w0 = {0.105, -0.21, 0.32}
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.4895f, -0.979f, 1.968f}));
  m.Step(kG2);  // g = g2 + 0.01 {0.4895, -0.979, 1.968}
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.4940105f, -1.018021f, 1.966032f}));
}

TEST(OptimizerTest, ClipValueClampsEachElement) {
  OptimizerParams p = Params(OptimizerKind::kSgd, 0.1f);
  p.clip_value = 0.25f;
  Model m(p, kW0);
  m.Step({0.1f, -0.4f, 0.3f});  // clipped to {0.1, -0.25, 0.25}
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.49f, -0.975f, 1.975f}));
  m.Step({-0.05f, 0.4f, -2.0f});  // clipped to {-0.05, 0.25, -0.25}
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.495f, -1.0f, 2.0f}));
}

TEST(OptimizerTest, ClipNormScalesOnlyWhenAboveThreshold) {
  OptimizerParams p = Params(OptimizerKind::kSgd, 0.1f);
  p.clip_norm = 0.2f;
  Model m(p, kW0);
  m.Step({0.3f, -0.4f, 0.0f});  // norm 0.5 -> g scaled by 0.4 to {0.12, -0.16, 0}
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.488f, -0.984f, 2.0f}));
  m.Step({0.03f, 0.0f, -0.04f});  // norm 0.05 <= 0.2: unchanged
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.485f, -0.984f, 2.004f}));
}

// Found in review, 2026-12-05: the squared norm was summed in float lanes, so a finite
// gradient element beyond about 1.8e19 made it infinite and the clip scale 0: the update
// vanished instead of being rescaled to clip_norm.
TEST(OptimizerTest, ClipNormRescalesAHugeFiniteGradient) {
  OptimizerParams p = Params(OptimizerKind::kSgd, 0.1f);
  p.clip_norm = 1.0f;
  Model m(p, kW0);
  m.Step({3e20f, -4e20f, 0.0f});  // norm 5e20 -> scaled to {0.6, -0.8, 0}
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.44f, -0.92f, 2.0f}));
  // Long enough for the blocked float loop (and past one 256-element block).
  std::vector<float> w(1000, 0.0f), g(1000, 0.0f);
  g[7] = 1e30f;
  g[700] = -1e30f;
  ApplyOptimizer(p, 1, absl::MakeSpan(w), g, {});
  EXPECT_NEAR(w[7], -0.1f * 0.70710678f, 1e-6);
  EXPECT_NEAR(w[700], 0.1f * 0.70710678f, 1e-6);
}

TEST(OptimizerTest, DecayThenClipValueThenClipNorm) {
  OptimizerParams p = Params(OptimizerKind::kSgd, 0.1f);
  p.weight_decay = 0.1f;
  p.clip_value = 0.35f;
  p.clip_norm = 0.3f;
  Model m(p, kW0);
  // g + 0.1 w = {0.35, -0.5, 0.2} -> clip_value {0.35, -0.35, 0.2} -> norm sqrt(0.285) > 0.3
  // -> scaled by 0.3 / sqrt(0.285) = {0.196683, -0.196683, 0.112390}.
  m.Step({0.3f, -0.4f, 0.0f});
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.480331698f, -0.980331698f, 1.98876097f}));
  m.Step({0.03f, 2.0f, -0.04f});
  EXPECT_THAT(m.weights, Pointwise(FloatNear(kTol), {0.47436301f, -1.00710289f, 1.97660868f}));
}

TEST(OptimizerTest, ClipNormIsOverTheWholeSpan) {
  // 1000 elements of 0.01 have norm sqrt(0.1) ~ 0.316; with clip_norm 0.1 each element is
  // scaled by 0.1 / 0.316 even though every single element is tiny.
  OptimizerParams p = Params(OptimizerKind::kSgd, 1.0f);
  p.clip_norm = 0.1f;
  Model m(p, std::vector<float>(1000, 0.f));
  m.Step(std::vector<float>(1000, 0.01f));
  const float expected = -0.01f * 0.1f / 0.316227766f;
  for (float w : m.weights) ASSERT_NEAR(w, expected, 1e-5f * -expected);
}

TEST(OptimizerTest, LongSpanMatchesElementwiseRule) {
  // Exercises the vectorized body and the scalar tail of the loop (n not a multiple of 4/8).
  OptimizerParams p = Params(OptimizerKind::kAdam, 0.01f);
  const int n = 1003;
  std::vector<float> w(n), g(n);
  for (int i = 0; i < n; ++i) {
    w[i] = 0.001f * i;
    g[i] = (i % 2 == 0 ? 0.1f : -0.2f);
  }
  Model m(p, w);
  m.Step(g);
  for (int i = 0; i < n; ++i) {
    ASSERT_NEAR(m.weights[i], w[i] - (i % 2 == 0 ? 0.01f : -0.01f), 1e-6f) << i;
  }
}

// Bytes another process may still write (FloatBytes::zero_nonfinite): finite values give the
// plain result bit for bit; NaN and infinities of either sign are read as 0, for every rule
// (clip_norm's sum included) and for deltas.
TEST(OptimizerTest, ZeroNonFiniteReadsFiniteValuesAsIsAndTheOthersAsZero) {
  const int n = 517;
  std::vector<float> w(n), g(n), poisoned(n), zeroed(n);
  for (int i = 0; i < n; ++i) {
    w[i] = 0.001f * i - 0.3f;
    g[i] = std::sin(0.37f * i);
    poisoned[i] = g[i];
    zeroed[i] = g[i];
  }
  const float bad[] = {
      std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()};
  for (int k = 0; k < 4; ++k) {
    for (int i : {k, 100 + k, n - 1 - k}) {
      poisoned[i] = bad[k];
      zeroed[i] = 0.0f;
    }
  }
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdagrad,
                             OptimizerKind::kAdam, OptimizerKind::kFtrl}) {
    for (bool clip : {false, true}) {
      OptimizerParams p = Params(kind, 0.01f);
      if (clip) p.clip_norm = 3.0f;
      const std::string what = std::string(OptimizerKindName(kind)) + (clip ? " clipped" : "");
      auto run = [&](const std::vector<float>& grad, bool zero) {
        Model m(p, w);
        for (int step = 1; step <= 2; ++step) {
          std::vector<float*> slots;
          for (auto& s : m.slots) slots.push_back(s.data());
          FloatBytes bytes{grad.data(), n};
          bytes.zero_nonfinite = zero;
          ApplyOptimizer(p, step, absl::MakeSpan(m.weights), bytes, slots);
        }
        return m.weights;
      };
      const std::vector<float> plain = run(g, false);
      EXPECT_EQ(std::memcmp(run(g, true).data(), plain.data(), n * sizeof(float)), 0) << what;
      const std::vector<float> expected = run(zeroed, false);
      EXPECT_EQ(std::memcmp(run(poisoned, true).data(), expected.data(), n * sizeof(float)), 0)
          << what;
      const std::vector<float> unguarded = run(poisoned, false);
      EXPECT_FALSE(
          std::all_of(unguarded.begin(), unguarded.end(), [](float v) { return std::isfinite(v); }))
          << what << ": the poisoned gradient should break the plain update";
    }
  }
  std::vector<float> a = w, b = w;
  FloatBytes delta{poisoned.data(), n};
  delta.zero_nonfinite = true;
  ApplyDelta(0.5f, absl::MakeSpan(a), delta);
  ApplyDelta(0.5f, absl::MakeSpan(b), absl::MakeConstSpan(zeroed));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
}

// A gradient read where a network buffer holds it (any byte offset) gives the aligned
// result bit for bit, for every rule, with decay and both clips on (clip_norm sums the span).
// The one-pass SGD of a push (check and update): ApplyOptimizer's bits, the old values kept,
// and every value that is not finite counted and taken as 0, at any alignment.
TEST(OptimizerTest, SgdCountingNonFiniteIsApplyOptimizerThatKeepsTheOldValues) {
  OptimizerParams p;
  p.kind = OptimizerKind::kSgd;
  p.learning_rate = 0.3f;
  p.weight_decay = 0.02f;
  p.clip_value = 0.9f;
  const int64_t n = 1000;  // several vectors and a tail
  std::vector<float> w(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    w[i] = std::cos(0.1f * i);
    g[i] = 2.f * std::sin(0.7f * i);
  }
  std::vector<char> bytes(n * sizeof(float) + 1);
  std::memcpy(bytes.data() + 1, g.data(), n * sizeof(float));  // an odd address
  std::vector<float> want = w;
  ApplyOptimizer(p, 1, absl::MakeSpan(want), g, {});
  std::vector<float> got = w, undo(n);
  EXPECT_EQ(
      SgdCountingNonFinite(p, 1, absl::MakeSpan(got), FloatBytes{bytes.data() + 1, n}, undo.data()),
      0u);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(undo.data(), w.data(), n * sizeof(float)), 0);

  std::vector<float> bad = g;
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  bad[500] = std::numeric_limits<float>::infinity();
  bad[999] = -std::numeric_limits<float>::infinity();
  std::vector<float> zeroed = g;
  zeroed[3] = zeroed[500] = zeroed[999] = 0.f;
  want = w;
  ApplyOptimizer(p, 1, absl::MakeSpan(want), zeroed, {});
  got = w;
  EXPECT_EQ(SgdCountingNonFinite(p, 1, absl::MakeSpan(got), FloatBytes{bad.data(), n}, undo.data()),
            3u);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(undo.data(), w.data(), n * sizeof(float)), 0);
}

TEST(OptimizerTest, UnalignedGradientBytesMatchTheAlignedSpanBitwise) {
  const int n = 1003;
  std::vector<float> w(n), g(n);
  for (int i = 0; i < n; ++i) {
    w[i] = 0.001f * i - 0.3f;
    g[i] = std::sin(0.37f * i);
  }
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdagrad,
                             OptimizerKind::kAdam, OptimizerKind::kFtrl}) {
    for (bool clip : {false, true}) {
      OptimizerParams p = Params(kind, 0.01f);
      p.weight_decay = 0.001f;
      if (clip) {
        p.clip_value = 0.5f;
        p.clip_norm = 3.0f;
      }
      Model aligned(p, w);
      aligned.Step(g);
      aligned.Step(g);
      for (size_t offset = 1; offset < sizeof(float); ++offset) {
        std::vector<unsigned char> bytes(n * sizeof(float) + offset);
        std::memcpy(bytes.data() + offset, g.data(), n * sizeof(float));
        Model moved(p, w);
        for (int step = 1; step <= 2; ++step) {
          std::vector<float*> slots;
          for (auto& s : moved.slots) slots.push_back(s.data());
          ApplyOptimizer(p, step, absl::MakeSpan(moved.weights),
                         FloatBytes{bytes.data() + offset, n}, slots);
        }
        const std::string what = std::string(OptimizerKindName(kind)) + (clip ? " clipped" : "") +
                                 ", offset " + std::to_string(offset);
        ASSERT_EQ(std::memcmp(moved.weights.data(), aligned.weights.data(), n * sizeof(float)), 0)
            << what;
        for (size_t s = 0; s < moved.slots.size(); ++s) {
          ASSERT_EQ(std::memcmp(moved.slots[s].data(), aligned.slots[s].data(), n * sizeof(float)),
                    0)
              << what << ", slot " << s;
        }
      }
    }
  }
}

TEST(OptimizerTest, ApplyDeltaAddsScaledDelta) {
  std::vector<float> w = {1.f, 2.f, 3.f};
  ApplyDelta(0.5f, absl::MakeSpan(w), {2.f, -4.f, 0.f});
  EXPECT_THAT(w, Pointwise(FloatNear(0.f), {2.f, 0.f, 3.f}));
}

// Subnormal inputs read as 0 and subnormal results are written as 0, and the caller's mode
// is left as it was. Adam's first moment of a weight whose gradient is 0 decays by beta1 each
// step through the subnormal range, where every vector operation took an x86 microcode assist.
// Values are compared by their bits: in a thread that flushes, a subnormal compares equal to 0.
TEST(OptimizerTest, SubnormalsAreFlushedToZeroWhateverTheCallersMode) {
  if (!ScopedFlushDenormals::kSupported) GTEST_SKIP() << "no flush mode on this CPU";
  auto bits = [](float x) {
    uint32_t b;
    std::memcpy(&b, &x, sizeof(b));
    return b;
  };
  const float sub = std::numeric_limits<float>::denorm_min() * 1000;  // about 1.4e-42
  const float min = std::numeric_limits<float>::min();                // smallest normal
  ASSERT_EQ(std::fpclassify(sub), FP_SUBNORMAL);
  for (const bool caller_flushes : {false, true}) {
    SCOPED_TRACE(caller_flushes ? "the caller flushes" : "the caller keeps subnormals");
    std::optional<ScopedFlushDenormals> caller;
    if (caller_flushes) caller.emplace();
    const bool mode_before = ScopedFlushDenormals::Active();

    // Adam, gradient 0: m = 0.9 * m would stay subnormal; a normal m decaying below FLT_MIN
    // would become subnormal. Both come out 0, and so does the update of their weights.
    OptimizerParams adam = Params(OptimizerKind::kAdam, 0.001f);
    Model m(adam, {1.f, 1.f, 1.f});
    m.slots[0] = {sub, min, 0.5f};
    m.slots[1] = {1e-6f, 1e-6f, 1e-6f};
    m.Step({0.f, 0.f, 0.f});
    EXPECT_EQ(bits(m.slots[0][0]), bits(0.f));
    EXPECT_EQ(bits(m.slots[0][1]), bits(0.f));
    EXPECT_EQ(m.slots[0][2], 0.45f);
    EXPECT_EQ(bits(m.weights[0]), bits(1.f));
    EXPECT_EQ(bits(m.weights[1]), bits(1.f));

    // SGD (both ways) and a delta: a result below FLT_MIN is written as 0 (2 min - 1.5 min),
    // a subnormal gradient reads as 0 and leaves its weight as it was (3 min - sub).
    OptimizerParams sgd = Params(OptimizerKind::kSgd, 1.f);
    const std::vector<float> w = {2 * min, 3 * min, 2 * min};
    const std::vector<float> g = {1.5f * min, sub, 0.f};
    std::vector<float> plain = w, counted = w, undo(3), delta = w;
    ApplyOptimizer(sgd, 1, absl::MakeSpan(plain), g, {});
    EXPECT_EQ(
        SgdCountingNonFinite(sgd, 1, absl::MakeSpan(counted), FloatBytes{g.data(), 3}, undo.data()),
        0u);
    ApplyDelta(-1.f, absl::MakeSpan(delta), g);
    for (const std::vector<float>* out : {&plain, &counted, &delta}) {
      EXPECT_EQ(bits((*out)[0]), bits(0.f));
      EXPECT_EQ(bits((*out)[1]), bits(3 * min));
      EXPECT_EQ(bits((*out)[2]), bits(2 * min));
    }
    EXPECT_EQ(bits(undo[0]), bits(w[0]));  // the undo copy is the old value, bit for bit
    EXPECT_EQ(ScopedFlushDenormals::Active(), mode_before);
  }
}

TEST(OptimizerTest, ValidateAcceptsDefaults) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                             OptimizerKind::kAdagrad, OptimizerKind::kAdam, OptimizerKind::kFtrl}) {
    OptimizerParams p;
    p.kind = kind;
    EXPECT_TRUE(ValidateOptimizerParams(p).ok()) << OptimizerKindName(kind);
  }
}

struct BadParamCase {
  const char* field;
  void (*mutate)(OptimizerParams&);
};

class ValidateOptimizerParamsTest : public ::testing::TestWithParam<BadParamCase> {};

TEST_P(ValidateOptimizerParamsTest, RejectsWithFieldName) {
  OptimizerParams p;
  GetParam().mutate(p);
  const absl::Status s = ValidateOptimizerParams(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(GetParam().field));
}

INSTANTIATE_TEST_SUITE_P(
    BadFields, ValidateOptimizerParamsTest,
    ::testing::Values(
        BadParamCase{"learning_rate", [](OptimizerParams& p) { p.learning_rate = 0.f; }},
        BadParamCase{"learning_rate", [](OptimizerParams& p) { p.learning_rate = -1.f; }},
        BadParamCase{"learning_rate", [](OptimizerParams& p) { p.learning_rate = std::nanf(""); }},
        BadParamCase{"momentum", [](OptimizerParams& p) { p.momentum = 1.f; }},
        BadParamCase{"beta1", [](OptimizerParams& p) { p.beta1 = -0.1f; }},
        BadParamCase{"beta1", [](OptimizerParams& p) { p.beta1 = 1.f; }},
        BadParamCase{"beta2", [](OptimizerParams& p) { p.beta2 = 1.5f; }},
        BadParamCase{"epsilon", [](OptimizerParams& p) { p.epsilon = 0.f; }},
        BadParamCase{"initial_accumulator",
                     [](OptimizerParams& p) { p.initial_accumulator = -0.1f; }},
        BadParamCase{"l1", [](OptimizerParams& p) { p.l1 = -1.f; }},
        BadParamCase{"l2", [](OptimizerParams& p) { p.l2 = -1.f; }},
        BadParamCase{"ftrl_beta", [](OptimizerParams& p) { p.ftrl_beta = -1.f; }},
        BadParamCase{"weight_decay", [](OptimizerParams& p) { p.weight_decay = -0.1f; }},
        BadParamCase{"clip_value", [](OptimizerParams& p) { p.clip_value = -1.f; }},
        BadParamCase{"clip_norm", [](OptimizerParams& p) { p.clip_norm = -1.f; }},
        BadParamCase{"kind", [](OptimizerParams& p) { p.kind = static_cast<OptimizerKind>(42); }}));

}  // namespace
}  // namespace ps::kernels
