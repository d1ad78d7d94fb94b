#include "worker/data/synthetic_ctr.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "worker/data/batch.h"
#include "worker/data/dataset.h"
#include "worker/data/metrics.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::Each;
using ::testing::HasSubstr;

ps::SyntheticCtrConfig SmallConfig() {
  ps::SyntheticCtrConfig c;
  c.set_num_train(20000);
  c.set_num_test(20000);
  c.set_num_fields(4);
  c.set_vocabulary_per_field(1000);
  c.set_zipf_exponent(1.1);
  c.set_weight_stddev(1.0);
  c.set_seed(3);
  return c;
}

Batch All(const Dataset& d) {
  std::vector<int64_t> indices(d.size());
  for (int64_t i = 0; i < d.size(); ++i) indices[i] = i;
  Batch batch;
  d.FillBatch(indices, &batch);
  return batch;
}

// (field, value) of every feature id of the config's vocabulary.
struct FieldValue {
  uint32_t field;
  uint64_t value;
};
absl::flat_hash_map<uint64_t, FieldValue> InverseIds(const ps::SyntheticCtrConfig& c) {
  absl::flat_hash_map<uint64_t, FieldValue> inverse;
  for (uint32_t f = 0; f < c.num_fields(); ++f) {
    for (uint64_t v = 0; v < c.vocabulary_per_field(); ++v) {
      inverse[SyntheticCtrFeatureId(f, v)] = {f, v};
    }
  }
  return inverse;
}

// How often each value of field `field` occurs in `batch`, by value.
std::vector<int64_t> ValueCounts(const ps::SyntheticCtrConfig& c, const Batch& batch,
                                 uint32_t field) {
  const auto inverse = InverseIds(c);
  std::vector<int64_t> counts(c.vocabulary_per_field());
  for (uint64_t id : batch.feature_ids) {
    const FieldValue fv = inverse.at(id);
    if (fv.field == field) ++counts[fv.value];
  }
  return counts;
}

TEST(GenerateSyntheticCtr, ShapesAndSizes) {
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData data, GenerateSyntheticCtr(SmallConfig()));
  EXPECT_EQ(data.train->size(), 20000);
  EXPECT_EQ(data.test->size(), 20000);
  EXPECT_TRUE(data.train->is_sparse());
  EXPECT_EQ(data.train->num_classes(), 2);
  EXPECT_EQ(data.test_probabilities.size(), 20000u);
  const Batch b = All(*data.train);
  EXPECT_EQ(b.feature_ids.size(), 20000u * 4);
  EXPECT_EQ(b.offsets[1], 4u);
  EXPECT_THAT(b.feature_values, Each(1.0f));
  EXPECT_THAT(b.binary_labels, Each(::testing::AnyOf(0.0f, 1.0f)));
  // Field f of every example is a value of field f, in field order.
  const auto inverse = InverseIds(SmallConfig());
  for (size_t k = 0; k < b.feature_ids.size(); ++k) {
    ASSERT_EQ(inverse.at(b.feature_ids[k]).field, k % 4) << k;
  }
}

TEST(GenerateSyntheticCtr, DeterministicForSeed) {
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData a, GenerateSyntheticCtr(SmallConfig()));
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData b, GenerateSyntheticCtr(SmallConfig()));
  const Batch ta = All(*a.train), tb = All(*b.train);
  EXPECT_EQ(ta.feature_ids, tb.feature_ids);
  EXPECT_EQ(ta.binary_labels, tb.binary_labels);
  EXPECT_EQ(All(*a.test).feature_ids, All(*b.test).feature_ids);
  EXPECT_EQ(a.test_probabilities, b.test_probabilities);
  EXPECT_EQ(a.ground_truth_auc, b.ground_truth_auc);

  ps::SyntheticCtrConfig other = SmallConfig();
  other.set_seed(4);
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData c, GenerateSyntheticCtr(other));
  EXPECT_NE(All(*c.train).feature_ids, ta.feature_ids);
  EXPECT_NE(c.test_probabilities, a.test_probabilities);
}

TEST(GenerateSyntheticCtr, TrainAndTestAreDifferentSamples) {
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData data, GenerateSyntheticCtr(SmallConfig()));
  const Batch train = All(*data.train), test = All(*data.test);
  EXPECT_NE(train.feature_ids, test.feature_ids);
  // Same distribution: field 0's top value is about equally frequent in both.
  const std::vector<int64_t> a = ValueCounts(SmallConfig(), train, 0);
  const std::vector<int64_t> b = ValueCounts(SmallConfig(), test, 0);
  EXPECT_NEAR(static_cast<double>(a[0]) / b[0], 1.0, 0.1);
}

TEST(GenerateSyntheticCtr, ValuePopularityIsZipf) {
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData data, GenerateSyntheticCtr(SmallConfig()));
  std::vector<int64_t> counts = ValueCounts(SmallConfig(), All(*data.train), 1);
  // Zipf(1.1) over 1000 values: P(v) ~ (v + 1)^-1.1, so value 0 is 2^1.1 ~ 2.14 times as
  // frequent as value 1, and hundreds of times as frequent as the median value.
  EXPECT_NEAR(static_cast<double>(counts[0]) / counts[1], std::pow(2.0, 1.1), 0.3);
  const int64_t top = counts[0];
  std::nth_element(counts.begin(), counts.begin() + counts.size() / 2, counts.end());
  const int64_t median = std::max<int64_t>(1, counts[counts.size() / 2]);
  EXPECT_GT(top, 100 * median) << "top " << top << ", median " << median;
}

TEST(GenerateSyntheticCtr, ZeroExponentIsUniform) {
  ps::SyntheticCtrConfig c = SmallConfig();
  c.set_zipf_exponent(0);
  c.set_vocabulary_per_field(20);
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData data, GenerateSyntheticCtr(c));
  const std::vector<int64_t> counts = ValueCounts(c, All(*data.train), 0);
  // 1000 expected per value; a standard deviation of about 31.
  for (int64_t n : counts) EXPECT_NEAR(n, 1000, 150);
}

TEST(GenerateSyntheticCtr, ProbabilitiesFollowTheGroundTruthModel) {
  const ps::SyntheticCtrConfig c = SmallConfig();
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData data, GenerateSyntheticCtr(c));
  const auto inverse = InverseIds(c);
  const Batch test = All(*data.test);
  for (int64_t i = 0; i < test.size; ++i) {
    double logit = kSyntheticCtrBias;
    for (uint32_t k = test.offsets[i]; k < test.offsets[i + 1]; ++k) {
      const FieldValue fv = inverse.at(test.feature_ids[k]);
      logit += SyntheticCtrWeight(c, fv.field, fv.value);
    }
    ASSERT_NEAR(data.test_probabilities[i], 1 / (1 + std::exp(-logit)), 1e-6) << i;
  }
  EXPECT_EQ(data.test_labels, test.binary_labels);
}

TEST(GenerateSyntheticCtr, LabelsAreCalibrated) {
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData data, GenerateSyntheticCtr(SmallConfig()));
  double p_sum = 0, y_sum = 0;
  for (size_t i = 0; i < data.test_labels.size(); ++i) {
    p_sum += data.test_probabilities[i];
    y_sum += data.test_labels[i];
  }
  const double n = data.test_labels.size();
  // Standard error of the mean label is below 0.0036 here.
  EXPECT_NEAR(y_sum / n, p_sum / n, 0.015);
  EXPECT_GT(y_sum / n, 0.05);
  EXPECT_LT(y_sum / n, 0.95);
  // Log-loss of the truth is the mean label entropy; must beat the constant predictor.
  const double rate = y_sum / n;
  const double constant = -(rate * std::log(rate) + (1 - rate) * std::log(1 - rate));
  EXPECT_LT(data.ground_truth_log_loss, constant);
  EXPECT_DOUBLE_EQ(data.ground_truth_log_loss, LogLoss(data.test_probabilities, data.test_labels));
}

TEST(GenerateSyntheticCtr, GroundTruthAucIsHighForUnitWeights) {
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData data, GenerateSyntheticCtr(SmallConfig()));
  EXPECT_GT(data.ground_truth_auc, 0.75);
  EXPECT_DOUBLE_EQ(data.ground_truth_auc, Auc(data.test_probabilities, data.test_labels));
}

TEST(GenerateSyntheticCtr, ZeroWeightsGiveChanceAuc) {
  ps::SyntheticCtrConfig c = SmallConfig();
  c.set_weight_stddev(0);
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData data, GenerateSyntheticCtr(c));
  // Every probability is sigmoid(bias): all tied.
  EXPECT_DOUBLE_EQ(data.ground_truth_auc, 0.5);
  EXPECT_THAT(data.test_probabilities, Each(static_cast<float>(1 / (1 + std::exp(1.0)))));
}

TEST(SyntheticCtrWeight, IsNormalWithConfiguredStddev) {
  ps::SyntheticCtrConfig c = SmallConfig();
  c.set_weight_stddev(2.0);
  double sum = 0, sum_sq = 0;
  const int n = 20000;
  for (int v = 0; v < n; ++v) {
    const double w = SyntheticCtrWeight(c, v % 3, v);
    sum += w;
    sum_sq += w * w;
  }
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0, 0.06);
  EXPECT_NEAR(std::sqrt(sum_sq / n - mean * mean), 2.0, 0.06);
  EXPECT_NE(SyntheticCtrWeight(c, 0, 1), SyntheticCtrWeight(c, 1, 0));
}

TEST(SyntheticCtrFeatureId, DistinctAcrossFieldsAndValues) {
  EXPECT_NE(SyntheticCtrFeatureId(0, 1), SyntheticCtrFeatureId(1, 0));
  EXPECT_NE(SyntheticCtrFeatureId(0, 0), SyntheticCtrFeatureId(0, 1));
  EXPECT_EQ(InverseIds(SmallConfig()).size(), 4000u);
}

TEST(GenerateSyntheticCtr, NoTestExamples) {
  ps::SyntheticCtrConfig c = SmallConfig();
  c.set_num_test(0);
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData data, GenerateSyntheticCtr(c));
  EXPECT_EQ(data.test->size(), 0);
  EXPECT_TRUE(std::isnan(data.ground_truth_auc));
}

TEST(GenerateSyntheticCtr, RejectsBadConfig) {
  ps::SyntheticCtrConfig c = SmallConfig();
  c.set_num_fields(0);
  EXPECT_THAT(GenerateSyntheticCtr(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_fields")));
  c = SmallConfig();
  c.set_vocabulary_per_field(0);
  EXPECT_THAT(GenerateSyntheticCtr(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocabulary_per_field")));
  c = SmallConfig();
  c.set_zipf_exponent(-1);
  EXPECT_THAT(GenerateSyntheticCtr(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("zipf_exponent")));
  c = SmallConfig();
  c.set_weight_stddev(NAN);
  EXPECT_THAT(GenerateSyntheticCtr(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("weight_stddev")));
}

// More examples than the machine's memory holds (2^36 of 8 fields: some 6 TiB) are refused
// before anything is allocated, naming the sizes (the allocator aborted the process part way
// before 2026-12-05).
TEST(GenerateSyntheticCtr, RefusesMoreExamplesThanMemoryHolds) {
  ps::SyntheticCtrConfig c = SmallConfig();
  c.set_num_train(uint64_t{1} << 36);
  EXPECT_THAT(GenerateSyntheticCtr(c), StatusIs(absl::StatusCode::kResourceExhausted,
                                                ::testing::AllOf(HasSubstr("num_train 68719476736"),
                                                                 HasSubstr("GiB of memory"))));
}

// (Its time is printed, not asserted: speed is for benchmarks.)
TEST(GenerateSyntheticCtr, DefaultConfigGenerates) {
  const ps::SyntheticCtrConfig c;  // 100k train + 20k test, 8 fields, 10k values
  const absl::Time start = absl::Now();
  ASSERT_OK_AND_ASSIGN(SyntheticCtrData data, GenerateSyntheticCtr(c));
  const absl::Duration took = absl::Now() - start;
  double positives = 0;
  for (float y : data.test_labels) positives += y;
  std::cout << "generated " << data.train->size() << " + " << data.test->size() << " examples in "
            << took << "; ground-truth AUC " << data.ground_truth_auc << ", log-loss "
            << data.ground_truth_log_loss << ", positive rate "
            << positives / data.test_labels.size() << "\n";
  EXPECT_EQ(data.train->size(), 100000);
}

}  // namespace
}  // namespace ps::worker
