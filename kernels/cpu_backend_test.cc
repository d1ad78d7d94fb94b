// Tests of the CPU backend (through the Backend API): every forward op against a plain loop
// written here, every backward op against central finite differences of its forward op.
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/optimizer.h"

namespace ps::kernels {
namespace {

using ::testing::FloatEq;
using ::testing::FloatNear;
using ::testing::Pointwise;

std::unique_ptr<Backend> Cpu() {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu", BackendOptions());
  EXPECT_TRUE(backend.ok()) << backend.status();
  return std::move(backend).value();
}

std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// d f / d x_i by central differences, for every i.
std::vector<float> NumericalGradient(const std::function<double(const std::vector<float>&)>& f,
                                     std::vector<float> x, float h) {
  std::vector<float> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + h;
    const double plus = f(x);
    x[i] = saved - h;
    const double minus = f(x);
    x[i] = saved;
    grad[i] = static_cast<float>((plus - minus) / (2.0 * h));
  }
  return grad;
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += double{a[i]} * b[i];
  return sum;
}

// ---- Memory ---------------------------------------------------------------------------------

TEST(CpuBackendTest, CopiesRoundTripThroughDeviceBuffers) {
  auto backend = Cpu();
  const std::vector<float> host = Random(100, 1);
  absl::StatusOr<DeviceBuffer> a = backend->AllocateFloats(100);
  absl::StatusOr<DeviceBuffer> b = backend->AllocateFloats(100);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size_bytes(), 400u);
  ASSERT_TRUE(backend->CopyToDevice(a->data(), host.data(), 400).ok());
  ASSERT_TRUE(backend->CopyDeviceToDevice(b->data(), a->data(), 400).ok());
  std::vector<float> back(100);
  ASSERT_TRUE(backend->CopyToHost(back.data(), b->data(), 400).ok());
  EXPECT_EQ(back, host);
}

TEST(CpuBackendTest, FillAndZero) {
  auto backend = Cpu();
  std::vector<float> x(10, 1.f);
  ASSERT_TRUE(backend->Fill(x.data(), 7, 2.5f).ok());
  EXPECT_THAT(x, Pointwise(FloatNear(0), {2.5f, 2.5f, 2.5f, 2.5f, 2.5f, 2.5f, 2.5f, 1.f, 1.f, 1.f}));
  ASSERT_TRUE(backend->Zero(x.data() + 1, 2 * sizeof(float)).ok());
  EXPECT_EQ(x[0], 2.5f);
  EXPECT_EQ(x[1], 0.f);
  EXPECT_EQ(x[2], 0.f);
  EXPECT_EQ(x[3], 2.5f);
}

TEST(CpuBackendTest, DeviceBufferMovesOwnership) {
  auto backend = Cpu();
  absl::StatusOr<DeviceBuffer> a = backend->Allocate(64);
  ASSERT_TRUE(a.ok());
  void* data = a->data();
  DeviceBuffer moved = std::move(*a);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(a->data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % 256, 0u);
  moved.Reset();
  EXPECT_EQ(moved.data(), nullptr);
  absl::StatusOr<DeviceBuffer> empty = backend->Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
}

TEST(CpuBackendTest, HostBuffersAreZeroedAlignedAndMoveAsHostBuffers) {
  // Under ASan a host buffer freed as a device one (or the reverse) is a mismatched free.
  auto backend = Cpu();
  // glibc then fills what it hands out with non-zero bytes (ASan fills it too), so a buffer
  // AllocateHost did not zero shows it.
  mallopt(M_PERTURB, 0x5a);
  absl::StatusOr<DeviceBuffer> host = backend->AllocateHost(1000 * sizeof(float));
  mallopt(M_PERTURB, 0);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->size_bytes(), 4000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(host->data()) % 256, 0u);
  EXPECT_EQ(std::vector<float>(host->floats(), host->floats() + 1000), std::vector<float>(1000));
  const std::vector<float> values = Random(1000, 3);
  std::copy(values.begin(), values.end(), host->floats());
  absl::StatusOr<DeviceBuffer> device = backend->AllocateFloats(1000);
  ASSERT_TRUE(device.ok());
  ASSERT_TRUE(backend->CopyToDevice(device->data(), host->data(), 4000).ok());
  DeviceBuffer moved = std::move(*host);
  *host = std::move(*device);  // a device buffer where the host one was
  std::fill_n(moved.floats(), 1000, 0.f);
  ASSERT_TRUE(backend->CopyToHost(moved.data(), host->data(), 4000).ok());
  EXPECT_EQ(std::vector<float>(moved.floats(), moved.floats() + 1000), values);
  absl::StatusOr<DeviceBuffer> empty = backend->AllocateHost(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
}

TEST(CpuBackendTest, RejectsNullPointerWithData) {
  auto backend = Cpu();
  EXPECT_EQ(backend->Fill(nullptr, 3, 0.f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->Fill(nullptr, 0, 0.f).code(), absl::StatusCode::kOk);
  EXPECT_EQ(backend->Fill(nullptr, -1, 0.f).code(), absl::StatusCode::kInvalidArgument);
}

// Host memory needs no registration where the device reads it: RegisterHost accepts any
// non-empty range and changes nothing (UnregisterHost of it, or of anything, is a no-op); a
// null or empty range is INVALID_ARGUMENT.
TEST(CpuBackendTest, RegisterHostAcceptsRangesAndRefusesNullOrEmpty) {
  auto backend = Cpu();
  std::vector<float> memory(1000, 2.f);
  EXPECT_EQ(backend->RegisterHost(memory.data(), memory.size() * sizeof(float)).code(),
            absl::StatusCode::kOk);
  EXPECT_EQ(backend->RegisterHost(nullptr, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->RegisterHost(memory.data(), 0).code(), absl::StatusCode::kInvalidArgument);
  backend->UnregisterHost(memory.data());
  backend->UnregisterHost(nullptr);
  EXPECT_EQ(memory[999], 2.f);
}

TEST(CpuBackendTest, CountNonFiniteCountsNanAndBothInfinities) {
  auto backend = Cpu();
  std::vector<float> x = Random(1000, 3, -1e30f, 1e30f);
  x.push_back(std::numeric_limits<float>::max());
  x.push_back(std::numeric_limits<float>::denorm_min());
  absl::StatusOr<int64_t> count = backend->CountNonFinite(x.size(), x.data());
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 0);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[500] = std::numeric_limits<float>::infinity();
  x[999] = -std::numeric_limits<float>::infinity();
  x[1001] = -std::numeric_limits<float>::quiet_NaN();
  count = backend->CountNonFinite(x.size(), x.data());
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 4);
  // Only the first n are read.
  EXPECT_EQ(*backend->CountNonFinite(500, x.data()), 1);
  EXPECT_EQ(*backend->CountNonFinite(0, nullptr), 0);
  EXPECT_EQ(backend->CountNonFinite(-1, x.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->CountNonFinite(3, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- GEMM -----------------------------------------------------------------------------------

class CpuGemmTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(CpuGemmTest, MatchesReferenceWithAlphaBetaAndPadding) {
  const auto [trans_a, trans_b] = GetParam();
  const int m = 13, n = 9, k = 11;
  const float alpha = 1.5f, beta = -0.5f;
  // Stored shapes (rows x cols) of a and b, and leading dimensions 3 wider than needed.
  const int a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  const int lda = a_cols + 3, ldb = b_cols + 2, ldc = n + 5;
  const std::vector<float> a = Random(static_cast<size_t>(a_rows) * lda, 2);
  const std::vector<float> b = Random(static_cast<size_t>(b_rows) * ldb, 3);
  std::vector<float> c = Random(static_cast<size_t>(m) * ldc, 4);
  std::vector<float> expected = c;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < k; ++p) {
        const float a_ip = trans_a ? a[p * lda + i] : a[i * lda + p];
        const float b_pj = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += double{a_ip} * b_pj;
      }
      expected[i * ldc + j] = static_cast<float>(alpha * sum + beta * c[i * ldc + j]);
    }
  }
  ASSERT_TRUE(Cpu()->Gemm(trans_a, trans_b, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta,
                          c.data(), ldc)
                  .ok());
  // Padding columns of c (j >= n) must be untouched: expected keeps their old values.
  EXPECT_THAT(c, Pointwise(FloatNear(1e-5f), expected));
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, CpuGemmTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST(CpuBackendTest, GemmWithZeroBetaIgnoresNanInC) {
  const std::vector<float> a = {1, 2, 3, 4}, b = {1, 0, 0, 1};
  std::vector<float> c(4, std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(Cpu()->Gemm(false, false, 2, 2, 2, 1.f, a.data(), 2, b.data(), 2, 0.f, c.data(), 2)
                  .ok());
  EXPECT_THAT(c, Pointwise(FloatNear(0), a));
}

TEST(CpuBackendTest, GemmWithZeroKScalesC) {
  std::vector<float> c = {1, 2, 3, 4};
  ASSERT_TRUE(Cpu()->Gemm(false, false, 2, 2, 0, 1.f, nullptr, 1, nullptr, 2, 2.f, c.data(), 2)
                  .ok());
  EXPECT_THAT(c, Pointwise(FloatNear(0), {2.f, 4.f, 6.f, 8.f}));
}

TEST(CpuBackendTest, GemmRejectsShortLeadingDimension) {
  std::vector<float> a(100), b(100), c(100);
  auto backend = Cpu();
  EXPECT_EQ(backend->Gemm(false, false, 4, 4, 5, 1, a.data(), 4, b.data(), 4, 0, c.data(), 4)
                .code(),
            absl::StatusCode::kInvalidArgument);  // lda 4 < k 5
  EXPECT_EQ(backend->Gemm(true, false, 5, 4, 4, 1, a.data(), 4, b.data(), 4, 0, c.data(), 4)
                .code(),
            absl::StatusCode::kInvalidArgument);  // transposed: lda 4 < m 5
  EXPECT_EQ(backend->Gemm(false, false, 4, 4, 4, 1, a.data(), 4, b.data(), 4, 0, c.data(), 3)
                .code(),
            absl::StatusCode::kInvalidArgument);  // ldc 3 < n 4
  EXPECT_EQ(backend->Gemm(false, false, -1, 4, 4, 1, a.data(), 4, b.data(), 4, 0, c.data(), 4)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- Bias and activations -------------------------------------------------------------------

TEST(CpuBackendTest, BiasAddAddsToEveryRow) {
  const int rows = 3, cols = 5;
  std::vector<float> x = Random(rows * cols, 5);
  const std::vector<float> bias = Random(cols, 6);
  std::vector<float> expected = x;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) expected[r * cols + c] += bias[c];
  }
  ASSERT_TRUE(Cpu()->BiasAdd(rows, cols, bias.data(), x.data()).ok());
  EXPECT_THAT(x, Pointwise(FloatNear(0), expected));
}

TEST(CpuBackendTest, BiasGradIsNumericalGradientOfBiasAdd) {
  auto backend = Cpu();
  const int rows = 4, cols = 3;
  const std::vector<float> x = Random(rows * cols, 7);
  const std::vector<float> dy = Random(rows * cols, 8);
  // L(bias) = <dy, BiasAdd(x, bias)>.
  auto loss = [&](const std::vector<float>& bias) {
    std::vector<float> y = x;
    EXPECT_TRUE(backend->BiasAdd(rows, cols, bias.data(), y.data()).ok());
    return Dot(dy, y);
  };
  std::vector<float> db(cols, 123.f);  // Overwritten, not accumulated.
  ASSERT_TRUE(backend->BiasGrad(rows, cols, dy.data(), db.data()).ok());
  EXPECT_THAT(db, Pointwise(FloatNear(1e-3f), NumericalGradient(loss, Random(cols, 9), 1e-2f)));
}

struct ActivationCase {
  Activation act;
  float (*reference)(float);
};

class CpuActivationTest : public ::testing::TestWithParam<ActivationCase> {};

TEST_P(CpuActivationTest, ForwardMatchesFormula) {
  const std::vector<float> x = Random(50, 10, -4.f, 4.f);
  std::vector<float> y(x.size());
  ASSERT_TRUE(Cpu()->ActivationForward(GetParam().act, x.size(), x.data(), y.data()).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(y[i], GetParam().reference(x[i]), 1e-6f) << x[i];
  }
}

TEST_P(CpuActivationTest, BackwardFromOutputIsNumericalGradient) {
  auto backend = Cpu();
  std::vector<float> x = Random(50, 11, -3.f, 3.f);
  for (float& v : x) {
    if (std::fabs(v) < 0.05f) v = 0.1f;  // ReLU has no derivative at 0.
  }
  const std::vector<float> dy = Random(x.size(), 12);
  auto loss = [&](const std::vector<float>& in) {
    std::vector<float> out(in.size());
    EXPECT_TRUE(backend->ActivationForward(GetParam().act, in.size(), in.data(), out.data()).ok());
    return Dot(dy, out);
  };
  std::vector<float> y(x.size()), dx(x.size());
  ASSERT_TRUE(backend->ActivationForward(GetParam().act, x.size(), x.data(), y.data()).ok());
  ASSERT_TRUE(
      backend->ActivationBackward(GetParam().act, x.size(), y.data(), dy.data(), dx.data()).ok());
  EXPECT_THAT(dx, Pointwise(FloatNear(2e-3f), NumericalGradient(loss, x, 1e-2f)));
}

INSTANTIATE_TEST_SUITE_P(
    AllActivations, CpuActivationTest,
    ::testing::Values(
        ActivationCase{Activation::kRelu, [](float x) { return x > 0 ? x : 0.f; }},
        ActivationCase{Activation::kTanh, [](float x) { return std::tanh(x); }},
        ActivationCase{Activation::kSigmoid, [](float x) { return 1.f / (1.f + std::exp(-x)); }}));

TEST(CpuBackendTest, ActivationWorksInPlace) {
  std::vector<float> x = {-1.f, 2.f};
  ASSERT_TRUE(Cpu()->ActivationForward(Activation::kRelu, 2, x.data(), x.data()).ok());
  EXPECT_THAT(x, Pointwise(FloatNear(0), {0.f, 2.f}));
}

// The backward pass as the dense stack runs it: dx is dy (vector body and tail).
TEST(CpuBackendTest, ActivationBackwardWorksInPlace) {
  for (Activation act : {Activation::kRelu, Activation::kTanh, Activation::kSigmoid}) {
    const std::vector<float> y = Random(1003, 21, -1.f, 1.f);
    const std::vector<float> dy = Random(y.size(), 22);
    std::vector<float> apart(y.size()), in_place = dy;
    ASSERT_TRUE(Cpu()->ActivationBackward(act, y.size(), y.data(), dy.data(), apart.data()).ok());
    ASSERT_TRUE(
        Cpu()->ActivationBackward(act, y.size(), y.data(), in_place.data(), in_place.data()).ok());
    EXPECT_THAT(in_place, Pointwise(FloatEq(), apart));
    if (act == Activation::kRelu) {
      for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(apart[i], y[i] > 0 ? dy[i] : 0.f) << i;
    }
  }
}

// ---- Losses ---------------------------------------------------------------------------------

constexpr int kRows = 4, kClasses = 5;
const std::vector<int32_t> kLabels = {0, 3, 4, 3};

double ReferenceSoftmaxLoss(const std::vector<float>& logits) {
  double total = 0;
  for (int r = 0; r < kRows; ++r) {
    double sum = 0;
    for (int c = 0; c < kClasses; ++c) sum += std::exp(double{logits[r * kClasses + c]});
    total += std::log(sum) - logits[r * kClasses + kLabels[r]];
  }
  return total / kRows;
}

TEST(CpuBackendTest, SoftmaxCrossEntropyLossMatchesReference) {
  const std::vector<float> logits = Random(kRows * kClasses, 13, -3.f, 3.f);
  absl::StatusOr<float> loss =
      Cpu()->SoftmaxCrossEntropy(kRows, kClasses, logits.data(), kLabels.data(), nullptr);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, ReferenceSoftmaxLoss(logits), 1e-5);
}

TEST(CpuBackendTest, SoftmaxCrossEntropyGradIsNumericalGradient) {
  auto backend = Cpu();
  const std::vector<float> logits = Random(kRows * kClasses, 14, -3.f, 3.f);
  auto loss = [&](const std::vector<float>& x) {
    absl::StatusOr<float> l =
        backend->SoftmaxCrossEntropy(kRows, kClasses, x.data(), kLabels.data(), nullptr);
    EXPECT_TRUE(l.ok());
    return double{*l};
  };
  std::vector<float> grad(logits.size());
  ASSERT_TRUE(
      backend->SoftmaxCrossEntropy(kRows, kClasses, logits.data(), kLabels.data(), grad.data())
          .ok());
  EXPECT_THAT(grad, Pointwise(FloatNear(5e-4f), NumericalGradient(loss, logits, 1e-2f)));
}

TEST(CpuBackendTest, SoftmaxCrossEntropyGradMayOverwriteLogits) {
  auto backend = Cpu();
  std::vector<float> logits = Random(kRows * kClasses, 15);
  std::vector<float> grad(logits.size());
  const absl::StatusOr<float> l1 =
      backend->SoftmaxCrossEntropy(kRows, kClasses, logits.data(), kLabels.data(), grad.data());
  const absl::StatusOr<float> l2 =
      backend->SoftmaxCrossEntropy(kRows, kClasses, logits.data(), kLabels.data(), logits.data());
  ASSERT_TRUE(l1.ok() && l2.ok());
  EXPECT_EQ(*l1, *l2);
  EXPECT_EQ(logits, grad);
}

TEST(CpuBackendTest, SoftmaxCrossEntropyIsStableForLargeLogits) {
  const std::vector<float> logits = {1000.f, 0.f};
  const std::vector<int32_t> labels = {1};
  absl::StatusOr<float> loss = Cpu()->SoftmaxCrossEntropy(1, 2, logits.data(), labels.data(),
                                                          nullptr);
  ASSERT_TRUE(loss.ok());
  EXPECT_NEAR(*loss, 1000.f, 1e-3f);
}

TEST(CpuBackendTest, SoftmaxRejectsLabelOutOfRange) {
  const std::vector<float> logits(kRows * kClasses);
  for (int32_t bad : {-1, kClasses}) {
    std::vector<int32_t> labels = kLabels;
    labels[2] = bad;
    EXPECT_EQ(Cpu()->SoftmaxCrossEntropy(kRows, kClasses, logits.data(), labels.data(), nullptr)
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(
        Cpu()->SoftmaxEval(kRows, kClasses, logits.data(), labels.data(), nullptr).status().code(),
        absl::StatusCode::kInvalidArgument);
  }
}

TEST(CpuBackendTest, SoftmaxEvalCountsArgmaxHitsAndWritesProbabilities) {
  // Row argmaxes: 0, 3, 1 (label 4: miss), 3 with a tie between 0 and 3 (lowest index wins:
  // miss).
  const std::vector<float> logits = {5, 1, 1, 1, 1,  0, 0, 0, 2, 0,  0, 3, 0, 0, 1,
                                     2, 0, 0, 2, 0};
  std::vector<float> probs(logits.size());
  absl::StatusOr<SoftmaxEvalResult> result =
      Cpu()->SoftmaxEval(kRows, kClasses, logits.data(), kLabels.data(), probs.data());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->num_correct, 2);
  EXPECT_NEAR(result->mean_loss, ReferenceSoftmaxLoss(logits), 1e-5);
  for (int r = 0; r < kRows; ++r) {
    double sum = 0;
    for (int c = 0; c < kClasses; ++c) sum += std::exp(double{logits[r * kClasses + c]});
    for (int c = 0; c < kClasses; ++c) {
      EXPECT_NEAR(probs[r * kClasses + c], std::exp(logits[r * kClasses + c]) / sum, 1e-6);
    }
  }
}

TEST(CpuBackendTest, SigmoidCrossEntropyMatchesReference) {
  const std::vector<float> logits = {-2.f, 0.f, 0.5f, 3.f, -30.f, 40.f};
  const std::vector<float> labels = {0.f, 1.f, 1.f, 0.f, 1.f, 0.f};
  double expected_loss = 0;
  std::vector<float> expected_probs, expected_grad;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double p = 1.0 / (1.0 + std::exp(-double{logits[i]}));
    // -log(p) and -log(1-p) in a form that survives p rounding to 0 or 1.
    expected_loss += labels[i] == 1.f ? std::log1p(std::exp(-double{logits[i]}))
                                      : std::log1p(std::exp(double{logits[i]}));
    expected_probs.push_back(static_cast<float>(p));
    expected_grad.push_back(static_cast<float>((p - labels[i]) / logits.size()));
  }
  std::vector<float> probs(logits.size()), grad(logits.size());
  absl::StatusOr<float> loss = Cpu()->SigmoidCrossEntropy(logits.size(), logits.data(),
                                                          labels.data(), grad.data(), probs.data());
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, expected_loss / logits.size(), 1e-5);
  EXPECT_THAT(probs, Pointwise(FloatNear(1e-6f), expected_probs));
  EXPECT_THAT(grad, Pointwise(FloatNear(1e-6f), expected_grad));
}

TEST(CpuBackendTest, SigmoidCrossEntropyGradIsNumericalGradient) {
  auto backend = Cpu();
  const std::vector<float> logits = Random(8, 16, -3.f, 3.f);
  const std::vector<float> labels = {0, 1, 1, 0, 1, 0, 0, 1};
  auto loss = [&](const std::vector<float>& x) {
    absl::StatusOr<float> l =
        backend->SigmoidCrossEntropy(x.size(), x.data(), labels.data(), nullptr, nullptr);
    EXPECT_TRUE(l.ok());
    return double{*l};
  };
  std::vector<float> grad(logits.size());
  ASSERT_TRUE(backend
                  ->SigmoidCrossEntropy(logits.size(), logits.data(), labels.data(), grad.data(),
                                        nullptr)
                  .ok());
  EXPECT_THAT(grad, Pointwise(FloatNear(5e-4f), NumericalGradient(loss, logits, 1e-2f)));
}

// ---- Embeddings -----------------------------------------------------------------------------

TEST(CpuBackendTest, EmbeddingGatherCopiesRows) {
  const int rows = 6, dim = 3;
  const std::vector<float> table = Random(rows * dim, 17);
  const std::vector<int32_t> indices = {4, 0, 4, 5};
  std::vector<float> out(indices.size() * dim);
  ASSERT_TRUE(
      Cpu()->EmbeddingGather(indices.size(), dim, table.data(), rows, indices.data(), out.data())
          .ok());
  for (size_t i = 0; i < indices.size(); ++i) {
    for (int d = 0; d < dim; ++d) EXPECT_EQ(out[i * dim + d], table[indices[i] * dim + d]);
  }
}

TEST(CpuBackendTest, EmbeddingScatterAddAccumulatesRepeatedIndices) {
  const int rows = 5, dim = 2;
  const std::vector<float> grads = {1, 2, 10, 20, 100, 200};
  const std::vector<int32_t> indices = {3, 1, 3};
  std::vector<float> out(rows * dim, 0.5f);
  ASSERT_TRUE(
      Cpu()->EmbeddingScatterAdd(3, dim, grads.data(), indices.data(), rows, out.data()).ok());
  EXPECT_THAT(out, Pointwise(FloatNear(0), {0.5f, 0.5f, 10.5f, 20.5f, 0.5f, 0.5f, 101.5f, 202.5f,
                                            0.5f, 0.5f}));
}

TEST(CpuBackendTest, EmbeddingScatterAddIsNumericalGradientOfGather) {
  auto backend = Cpu();
  const int rows = 4, dim = 3;
  const std::vector<int32_t> indices = {2, 0, 2, 3, 2};
  const std::vector<float> dy = Random(indices.size() * dim, 18);
  auto loss = [&](const std::vector<float>& table) {
    std::vector<float> out(indices.size() * dim);
    EXPECT_TRUE(backend
                    ->EmbeddingGather(indices.size(), dim, table.data(), rows, indices.data(),
                                      out.data())
                    .ok());
    return Dot(dy, out);
  };
  std::vector<float> dtable(rows * dim, 0.f);
  ASSERT_TRUE(backend
                  ->EmbeddingScatterAdd(indices.size(), dim, dy.data(), indices.data(), rows,
                                        dtable.data())
                  .ok());
  EXPECT_THAT(dtable,
              Pointwise(FloatNear(1e-3f), NumericalGradient(loss, Random(rows * dim, 19), 1e-2f)));
}

TEST(CpuBackendTest, EmbeddingOpsRejectOutOfRangeIndices) {
  auto backend = Cpu();
  const std::vector<float> table = {1, 2, 3, 4};  // 2 rows of 2
  const std::vector<int32_t> indices = {1, 2, -1};
  std::vector<float> out(6, 9.f);
  EXPECT_EQ(backend->EmbeddingGather(3, 2, table.data(), 2, indices.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  // The valid row is gathered, the invalid ones zeroed.
  EXPECT_THAT(out, Pointwise(FloatNear(0), {3.f, 4.f, 0.f, 0.f, 0.f, 0.f}));
  std::vector<float> acc(4, 0.f);
  EXPECT_EQ(
      backend->EmbeddingScatterAdd(3, 2, out.data(), indices.data(), 2, acc.data()).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(acc, Pointwise(FloatNear(0), {0.f, 0.f, 3.f, 4.f}));
}

// ---- Optimizer ------------------------------------------------------------------------------

TEST(CpuBackendTest, ApplyOptimizerMatchesCpuFunction) {
  OptimizerParams p;
  p.kind = OptimizerKind::kAdam;
  p.clip_norm = 0.5f;
  p.weight_decay = 0.01f;
  const std::vector<float> grads = Random(37, 20);
  std::vector<float> w1 = Random(37, 21), m1(37, 0.f), v1(37, 0.f);
  std::vector<float> w2 = w1, m2 = m1, v2 = v1;
  ASSERT_TRUE(Cpu()->ApplyOptimizer(p, 3, 37, w1.data(), grads.data(), {m1.data(), v1.data()})
                  .ok());
  ApplyOptimizer(p, 3, absl::MakeSpan(w2), grads, {m2.data(), v2.data()});
  EXPECT_EQ(w1, w2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
}

TEST(CpuBackendTest, ApplyOptimizerRejectsBadCalls) {
  auto backend = Cpu();
  std::vector<float> w(4), g(4), s(4);
  OptimizerParams p;
  p.kind = OptimizerKind::kMomentum;
  EXPECT_TRUE(backend->ApplyOptimizer(p, 1, 4, w.data(), g.data(), {s.data()}).ok());
  EXPECT_EQ(backend->ApplyOptimizer(p, 1, 4, w.data(), g.data(), {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->ApplyOptimizer(p, 0, 4, w.data(), g.data(), {s.data()}).code(),
            absl::StatusCode::kInvalidArgument);
  p.learning_rate = -1.f;
  EXPECT_EQ(backend->ApplyOptimizer(p, 1, 4, w.data(), g.data(), {s.data()}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::kernels
