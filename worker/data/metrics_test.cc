#include "worker/data/metrics.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

TEST(Auc, HandComputedWithoutTies) {
  // Pairs (positive, negative): (0.35, 0.1) right, (0.35, 0.4) wrong, (0.8, *) right: 3/4.
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);
}

TEST(Auc, PerfectAndReversed) {
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.2f, 0.3f, 0.9f}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc({0.9f, 0.8f, 0.3f, 0.1f}, {0, 0, 1, 1}), 0.0);
}

TEST(Auc, TiesCountHalf) {
  // Positives {0.5, 0.9}, negatives {0.1, 0.5}: 1 + 0.5 + 1 + 1 = 3.5 of 4 pairs.
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.5f, 0.5f, 0.9f}, {0, 1, 0, 1}), 0.875);
  // All tied: every pair is half right.
  EXPECT_DOUBLE_EQ(Auc({0.3f, 0.3f, 0.3f, 0.3f, 0.3f}, {1, 0, 0, 1, 0}), 0.5);
  // A three-way tie with two positives and one negative, below one more negative:
  // positives {0.2, 0.2}, negatives {0.2, 0.7}: 0.5 + 0 + 0.5 + 0 = 1 of 4.
  EXPECT_DOUBLE_EQ(Auc({0.2f, 0.7f, 0.2f, 0.2f}, {1, 0, 0, 1}), 0.25);
}

TEST(Auc, OrderOfInputDoesNotMatter) {
  EXPECT_DOUBLE_EQ(Auc({0.8f, 0.35f, 0.4f, 0.1f}, {1, 1, 0, 0}), 0.75);
}

TEST(Auc, UndefinedForOneClassOrNan) {
  EXPECT_TRUE(std::isnan(Auc({0.1f, 0.9f}, {1, 1})));
  EXPECT_TRUE(std::isnan(Auc({0.1f, 0.9f}, {0, 0})));
  EXPECT_TRUE(std::isnan(Auc({}, {})));
  EXPECT_TRUE(std::isnan(Auc({0.1f, NAN}, {0, 1})));
}

TEST(LogLoss, HandComputed) {
  // -(log 0.8 + log(1 - 0.4)) / 2
  EXPECT_NEAR(LogLoss({0.8f, 0.4f}, {1, 0}), -(std::log(0.8) + std::log(0.6)) / 2, 1e-7);
  EXPECT_NEAR(LogLoss({0.5f}, {1}), std::log(2.0), 1e-7);
}

TEST(LogLoss, ClipsCertainMistakes) {
  const double loss = LogLoss({0.0f, 1.0f}, {1, 0});
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, -std::log(1e-7), 1e-6);
  EXPECT_NEAR(LogLoss({1.0f, 0.0f}, {1, 0}), 0, 1e-6);
}

TEST(LogLoss, NanWhenEmpty) { EXPECT_TRUE(std::isnan(LogLoss({}, {}))); }

}  // namespace
}  // namespace ps::worker
