#include "worker/rpc/push_residuals.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/codec.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

// Pushes `grad` `steps` times as `encoding` (with or without error feedback) and returns the
// largest |decoded sum - exact sum| over the elements, in units in the last place of the
// element's value in that encoding (the most one rounding can be off by twice over).
double WorstErrorInUlps(const std::vector<float>& grad, int steps, ps::Encoding encoding,
                        bool feedback) {
  PushResiduals residuals;
  std::vector<double> decoded_sum(grad.size(), 0.0);
  std::vector<float> decoded(grad.size());
  for (int step = 0; step < steps; ++step) {
    std::string bytes;
    if (feedback) {
      residuals.AppendDense("t", grad.size(), 0, grad, encoding, &bytes);
    } else {
      common::EncodeFloats(grad, encoding, &bytes);
    }
    EXPECT_TRUE(common::DecodeFloats(bytes, encoding, absl::MakeSpan(decoded)).ok());
    for (size_t i = 0; i < grad.size(); ++i) decoded_sum[i] += decoded[i];
  }
  const int mantissa_bits = encoding == ps::ENCODING_BF16 ? 8 : 11;
  // fp16 subnormals are spaced 2^-24 apart.
  const double min_ulp = encoding == ps::ENCODING_BF16 ? 0.0 : std::ldexp(1.0, -24);
  double worst = 0;
  for (size_t i = 0; i < grad.size(); ++i) {
    const double exact = static_cast<double>(grad[i]) * steps;
    const double ulp =
        std::max(min_ulp, std::ldexp(1.0, std::ilogb(grad[i]) - (mantissa_bits - 1)));
    worst = std::max(worst, std::fabs(decoded_sum[i] - exact) / ulp);
  }
  return worst;
}

// Elements over six orders of magnitude, none of them representable in 16 bits.
std::vector<float> SpreadGradient() {
  std::vector<float> g;
  for (int e = -4; e <= 1; ++e) {
    for (float m : {1.0013f, 1.37f, -2.718f, 7.77f}) g.push_back(m * std::pow(10.0f, e));
  }
  return g;
}

TEST(PushResiduals, Bf16SumErrorStaysWithinOneUlpWithFeedback) {
  const std::vector<float> g = SpreadGradient();
  EXPECT_LE(WorstErrorInUlps(g, 2000, ps::ENCODING_BF16, /*feedback=*/true), 1.0);
  // Round to nearest drops the same part every step: the error grows with the steps.
  EXPECT_GT(WorstErrorInUlps(g, 2000, ps::ENCODING_BF16, /*feedback=*/false), 100.0);
}

TEST(PushResiduals, Fp16SumErrorStaysWithinOneUlpWithFeedback) {
  std::vector<float> g = SpreadGradient();
  g.push_back(1e-8f);  // flushed to zero by fp16 round to nearest, every step
  EXPECT_LE(WorstErrorInUlps(g, 2000, ps::ENCODING_FP16, /*feedback=*/true), 1.0);
  EXPECT_GT(WorstErrorInUlps(g, 2000, ps::ENCODING_FP16, /*feedback=*/false), 100.0);
}

TEST(PushResiduals, Float32IsExactAndStateless) {
  PushResiduals residuals;
  const std::vector<float> g = SpreadGradient();
  std::string with, without;
  residuals.AppendDense("t", g.size(), 0, g, ps::ENCODING_FLOAT32, &with);
  common::EncodeFloats(g, ps::ENCODING_FLOAT32, &without);
  EXPECT_EQ(with, without);
  residuals.AppendSparseRow("s", 7, g, ps::ENCODING_FLOAT32, &with);
  EXPECT_EQ(residuals.sparse_rows("s"), 0u);
}

TEST(PushResiduals, SparseRowsCarryTheirOwnResidual) {
  PushResiduals residuals;
  const std::vector<float> row = {1.0013f, 3e-3f};
  std::vector<double> sum(2, 0.0);
  std::vector<float> decoded(2);
  for (int step = 0; step < 1000; ++step) {
    for (uint64_t key : {1u, 2u}) {
      std::string bytes;
      residuals.AppendSparseRow("s", key, row, ps::ENCODING_BF16, &bytes);
      ASSERT_TRUE(common::DecodeFloats(bytes, ps::ENCODING_BF16, absl::MakeSpan(decoded)).ok());
      if (key == 1) {
        sum[0] += decoded[0];
        sum[1] += decoded[1];
      }
    }
  }
  EXPECT_NEAR(sum[0], 1001.3, 1001.3 / 256);
  EXPECT_NEAR(sum[1], 3.0, 3.0 / 256);
  EXPECT_EQ(residuals.sparse_rows("s"), 2u);
}

TEST(PushResiduals, SparseResidualsAreCappedLeastRecentlyPushedFirst) {
  // 1.003 is sent as 1.0 the first time and, with its residual, as 1.0078125 the second.
  const std::vector<float> row = {1.003f};
  std::string first, second;
  PushResiduals reference;
  reference.AppendSparseRow("s", 1, row, ps::ENCODING_BF16, &first);
  reference.AppendSparseRow("s", 1, row, ps::ENCODING_BF16, &second);
  ASSERT_NE(first, second);

  PushResiduals residuals(/*max_sparse_rows=*/2);
  std::string bytes;
  residuals.AppendSparseRow("s", 1, row, ps::ENCODING_BF16, &bytes);
  residuals.AppendSparseRow("s", 2, row, ps::ENCODING_BF16, &bytes);
  residuals.AppendSparseRow("s", 3, row, ps::ENCODING_BF16, &bytes);  // evicts 1, the oldest
  EXPECT_EQ(residuals.sparse_rows("s"), 2u);
  std::string again;
  residuals.AppendSparseRow("s", 3, row, ps::ENCODING_BF16, &again);  // kept its residual
  EXPECT_EQ(again, second);
  again.clear();
  residuals.AppendSparseRow("s", 1, row, ps::ENCODING_BF16, &again);  // starts over
  EXPECT_EQ(again, first);
  EXPECT_EQ(residuals.sparse_rows("s"), 2u);
}

TEST(PushResiduals, NonFiniteValueResetsItsResidual) {
  PushResiduals residuals;
  std::string bytes;
  residuals.AppendDense("t", 2, 0, std::vector<float>{1e6f, 1.0013f}, ps::ENCODING_FP16, &bytes);
  bytes.clear();
  residuals.AppendDense("t", 2, 0, std::vector<float>{1.0f, 1.0013f}, ps::ENCODING_FP16, &bytes);
  std::vector<float> decoded(2);
  ASSERT_TRUE(common::DecodeFloats(bytes, ps::ENCODING_FP16, absl::MakeSpan(decoded)).ok());
  EXPECT_EQ(decoded[0], 1.0f);  // the overflow to inf left no residual behind
}

}  // namespace
}  // namespace ps::worker
