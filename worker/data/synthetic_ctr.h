// Synthetic click-through-rate data drawn from a KNOWN logistic model, so that a trained
// model can be judged against the best achievable score.
//
// The generative model, for config c (proto/config.proto SyntheticCtrConfig):
//   - Each example has c.num_fields categorical fields. For each field f it picks a value
//     v in [0, c.vocabulary_per_field) with P(v) proportional to (v + 1)^-c.zipf_exponent
//     (Zipf: value 0 is the most popular; exponent 0 is uniform), independently per field.
//   - Field f's value v appears as one sparse feature with id SyntheticCtrFeatureId(f, v)
//     (a 64-bit hash, like a hashed categorical feature) and value 1.0.
//   - The true logit is kSyntheticCtrBias + sum over fields of SyntheticCtrWeight(c, f, v),
//     the weights being N(0, c.weight_stddev^2) draws fixed by c.seed.
//   - The label is 1 with probability sigmoid(logit).
// Train and test examples come from the same model through disjoint random streams
// (derived from c.seed), so the test set is a fresh sample, not a copy of the training set.
//
// Everything is a pure function of the config: the same config gives the same data on any
// host and build (the randomness comes from common/hash.h, not from <random>'s
// implementation-defined distributions).
#ifndef PS_WORKER_DATA_SYNTHETIC_CTR_H_
#define PS_WORKER_DATA_SYNTHETIC_CTR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "worker/data/dataset.h"

namespace ps::worker {

// The ground-truth model's intercept. Negative so that clicks are the minority class, as in
// real CTR data; about 30% of the examples are positive with the default config.
inline constexpr double kSyntheticCtrBias = -1.0;

// Limits on the config, to keep the generator's tables in memory.
inline constexpr uint32_t kSyntheticCtrMaxFields = 4096;
inline constexpr uint64_t kSyntheticCtrMaxVocabulary = uint64_t{1} << 24;

struct SyntheticCtrData {
  // Sparse binary datasets (num_classes() == 2; num_fields features per example).
  std::unique_ptr<Dataset> train;
  std::unique_ptr<Dataset> test;
  // Per test example: the true P(label = 1), and the label drawn from it (as the test
  // dataset's binary_labels).
  std::vector<float> test_probabilities;
  std::vector<float> test_labels;
  // Auc(test_probabilities, test_labels) and LogLoss(...): what a perfect model would
  // score on this test set. NaN when undefined (no test examples, or only one class).
  double ground_truth_auc = 0;
  double ground_truth_log_loss = 0;
};

// Generates c.num_train training and c.num_test test examples. Takes well under a second for
// 100k examples of 8 fields.
// Errors: INVALID_ARGUMENT when num_fields is 0 or above kSyntheticCtrMaxFields,
// vocabulary_per_field is 0 or above kSyntheticCtrMaxVocabulary, zipf_exponent or
// weight_stddev is negative or not finite, or the example count overflows.
absl::StatusOr<SyntheticCtrData> GenerateSyntheticCtr(const ps::SyntheticCtrConfig& config);

// The feature id of value `value` of field `field`. Does not depend on the seed.
uint64_t SyntheticCtrFeatureId(uint32_t field, uint64_t value);

// The ground-truth weight of (field, value): N(0, config.weight_stddev^2), fixed by
// config.seed.
double SyntheticCtrWeight(const ps::SyntheticCtrConfig& config, uint32_t field, uint64_t value);

}  // namespace ps::worker

#endif  // PS_WORKER_DATA_SYNTHETIC_CTR_H_
