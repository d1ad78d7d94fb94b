#include "worker/data/synthetic_ctr.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hash.h"
#include "worker/data/in_memory_dataset.h"
#include "worker/data/memory_limit.h"
#include "worker/data/metrics.h"

namespace ps::worker {
namespace {

using common::Fingerprint64;
using common::HashCombine;
using common::Mix64;

// Salts that separate the random streams derived from one seed. Part of the data's
// definition: changing one changes every generated data set.
constexpr uint64_t kFeatureIdSalt = Fingerprint64("ps/synthetic_ctr/feature_id");
constexpr uint64_t kWeightSalt = Fingerprint64("ps/synthetic_ctr/weight");
constexpr uint64_t kTrainSalt = Fingerprint64("ps/synthetic_ctr/train");
constexpr uint64_t kTestSalt = Fingerprint64("ps/synthetic_ctr/test");

constexpr double kTwoPi = 6.283185307179586476925286766559;

// A uniform double in [0, 1) from the top 53 bits of a hash.
double Unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

// A standard normal from a hash (Box-Muller; 1 - Unit is in (0, 1], so the log is finite).
double StandardNormal(uint64_t h) {
  const double u1 = 1.0 - Unit(Mix64(h));
  const double u2 = Unit(HashCombine(h, 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

double WeightFromSeed(uint64_t weight_seed, double stddev, uint32_t field, uint64_t value) {
  return stddev * StandardNormal(HashCombine(HashCombine(weight_seed, field), value));
}

// Inverse-CDF sampling from Zipf over [0, n): P(v) ~ (v + 1)^-s.
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s) : cdf_(n) {
    double total = 0;
    for (uint64_t v = 0; v < n; ++v) {
      total += std::pow(static_cast<double>(v + 1), -s);
      cdf_[v] = total;
    }
    for (double& c : cdf_) c /= total;
  }

  // u in [0, 1).
  uint64_t Sample(double u) const {
    const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
    // Rounding can leave cdf_.back() a hair below 1.
    return std::min<uint64_t>(it - cdf_.begin(), cdf_.size() - 1);
  }

 private:
  std::vector<double> cdf_;
};

struct Split {
  std::unique_ptr<Dataset> dataset;
  std::vector<float> probabilities;
  std::vector<float> labels;
};

Split GenerateSplit(const ps::SyntheticCtrConfig& config, const ZipfSampler& zipf,
                    uint64_t split_seed, uint64_t n) {
  const uint32_t fields = config.num_fields();
  const uint64_t weight_seed = HashCombine(config.seed(), kWeightSalt);
  std::vector<uint64_t> offsets(n + 1);
  std::vector<uint64_t> ids(n * fields);
  std::vector<float> values(n * fields, 1.0f);
  std::vector<int32_t> labels(n);
  Split split;
  split.probabilities.resize(n);
  split.labels.resize(n);
  // Example i draws from its own hash stream, so it does not depend on the examples before
  // it (and the loop could be split across threads without changing the data).
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t stream = HashCombine(split_seed, i);
    double logit = kSyntheticCtrBias;
    for (uint32_t f = 0; f < fields; ++f) {
      const uint64_t v = zipf.Sample(Unit(HashCombine(stream, f)));
      ids[i * fields + f] = SyntheticCtrFeatureId(f, v);
      logit += WeightFromSeed(weight_seed, config.weight_stddev(), f, v);
    }
    const double p = 1.0 / (1.0 + std::exp(-logit));
    const int32_t label = Unit(HashCombine(stream, fields)) < p ? 1 : 0;
    offsets[i + 1] = (i + 1) * fields;
    labels[i] = label;
    split.probabilities[i] = static_cast<float>(p);
    split.labels[i] = static_cast<float>(label);
  }
  split.dataset = std::make_unique<SparseDataset>(2, std::move(offsets), std::move(ids),
                                                  std::move(values), std::move(labels));
  return split;
}

absl::Status Validate(const ps::SyntheticCtrConfig& c) {
  if (c.num_fields() == 0 || c.num_fields() > kSyntheticCtrMaxFields) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_fields must be in [1, ", kSyntheticCtrMaxFields, "], got ", c.num_fields()));
  }
  if (c.vocabulary_per_field() == 0 || c.vocabulary_per_field() > kSyntheticCtrMaxVocabulary) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary_per_field must be in [1, ",
                                                   kSyntheticCtrMaxVocabulary, "], got ",
                                                   c.vocabulary_per_field()));
  }
  if (!std::isfinite(c.zipf_exponent()) || c.zipf_exponent() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("zipf_exponent must be finite and >= 0, got ", c.zipf_exponent()));
  }
  if (!std::isfinite(c.weight_stddev()) || c.weight_stddev() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_stddev must be finite and >= 0, got ", c.weight_stddev()));
  }
  // Bound the entry count (and so the offsets, which hold (i + 1) * num_fields) well below
  // overflow; memory runs out long before this.
  constexpr uint64_t kMaxExamples = uint64_t{1} << 40;
  if (c.num_train() > kMaxExamples || c.num_test() > kMaxExamples) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_train and num_test must be at most 2^40, got ", c.num_train(), " and ", c.num_test()));
  }
  // What the examples take (ids and values per field; offset, label and probability per
  // example), against this machine's memory: refused here, naming the fields, rather than
  // aborted by the allocator part way.
  const double bytes = (static_cast<double>(c.num_train()) + static_cast<double>(c.num_test())) *
                       (12.0 * c.num_fields() + 20.0);
  return CheckDatasetFits(bytes, DatasetMemoryLimit(),
                          absl::StrFormat("num_train %d + num_test %d examples of %d fields",
                                          c.num_train(), c.num_test(), c.num_fields()));
}

}  // namespace

uint64_t SyntheticCtrFeatureId(uint32_t field, uint64_t value) {
  return HashCombine(HashCombine(kFeatureIdSalt, field), value);
}

double SyntheticCtrWeight(const ps::SyntheticCtrConfig& config, uint32_t field, uint64_t value) {
  return WeightFromSeed(HashCombine(config.seed(), kWeightSalt), config.weight_stddev(), field,
                        value);
}

absl::StatusOr<SyntheticCtrData> GenerateSyntheticCtr(const ps::SyntheticCtrConfig& config) {
  if (absl::Status status = Validate(config); !status.ok()) return status;
  const ZipfSampler zipf(config.vocabulary_per_field(), config.zipf_exponent());
  Split train =
      GenerateSplit(config, zipf, HashCombine(config.seed(), kTrainSalt), config.num_train());
  Split test =
      GenerateSplit(config, zipf, HashCombine(config.seed(), kTestSalt), config.num_test());
  SyntheticCtrData data;
  data.train = std::move(train.dataset);
  data.test = std::move(test.dataset);
  data.test_probabilities = std::move(test.probabilities);
  data.test_labels = std::move(test.labels);
  data.ground_truth_auc = Auc(data.test_probabilities, data.test_labels);
  data.ground_truth_log_loss = LogLoss(data.test_probabilities, data.test_labels);
  return data;
}

}  // namespace ps::worker
