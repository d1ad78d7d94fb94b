// The two concrete Datasets every data source builds: DenseDataset (a row-major float matrix
// plus class labels) and SparseDataset (CSR features plus labels). Tests elsewhere may build
// them directly as fakes.
#ifndef PS_WORKER_DATA_IN_MEMORY_DATASET_H_
#define PS_WORKER_DATA_IN_MEMORY_DATASET_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "worker/data/batch.h"
#include "worker/data/dataset.h"

namespace ps::worker {

// Dense examples: example i is features[i * feature_dim, (i + 1) * feature_dim) with class
// label labels[i]. Thread-safe (immutable).
class DenseDataset final : public Dataset {
 public:
  // Takes ownership of the vectors. REQUIRES (checked, these are programmer errors: the
  // loaders validate their input first): feature_dim > 0; num_classes >= 1;
  // features.size() == labels.size() * feature_dim; every label in [0, num_classes).
  DenseDataset(int64_t feature_dim, int num_classes, std::vector<float> features,
               std::vector<int32_t> labels);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  void FillBatch(absl::Span<const int64_t> indices, Batch* batch) const override;
  bool is_sparse() const override { return false; }
  int64_t feature_dim() const override { return feature_dim_; }
  int num_classes() const override { return num_classes_; }

  // The features of example i. REQUIRES: 0 <= i < size().
  absl::Span<const float> features(int64_t i) const;
  // The class label of example i. REQUIRES: 0 <= i < size().
  int32_t label(int64_t i) const { return labels_[i]; }

 private:
  const int64_t feature_dim_;
  const int num_classes_;
  const std::vector<float> features_;
  const std::vector<int32_t> labels_;
};

// Sparse examples in CSR form: example i has the features [offsets[i], offsets[i + 1]) of
// feature_ids / feature_values, and the label labels[i]. When num_classes == 2 the batches
// carry the labels as binary_labels (0.0f / 1.0f), otherwise as class_labels.
// Thread-safe (immutable).
class SparseDataset final : public Dataset {
 public:
  // Takes ownership of the vectors. REQUIRES (checked): num_classes >= 2;
  // offsets.size() == labels.size() + 1; offsets[0] == 0; offsets is non-decreasing;
  // offsets.back() == feature_ids.size() == feature_values.size(); every label in
  // [0, num_classes).
  SparseDataset(int num_classes, std::vector<uint64_t> offsets, std::vector<uint64_t> feature_ids,
                std::vector<float> feature_values, std::vector<int32_t> labels);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  // REQUIRES additionally: the batch holds fewer than 2^32 features in all (Batch::offsets
  // is uint32).
  void FillBatch(absl::Span<const int64_t> indices, Batch* batch) const override;
  bool is_sparse() const override { return true; }
  int64_t feature_dim() const override { return 0; }
  int num_classes() const override { return num_classes_; }

  // The feature ids / values / label of example i. REQUIRES: 0 <= i < size().
  absl::Span<const uint64_t> feature_ids(int64_t i) const;
  absl::Span<const float> feature_values(int64_t i) const;
  int32_t label(int64_t i) const { return labels_[i]; }
  // Total number of (id, value) entries over all examples.
  uint64_t num_entries() const { return feature_ids_.size(); }

 private:
  const int num_classes_;
  const std::vector<uint64_t> offsets_;
  const std::vector<uint64_t> feature_ids_;
  const std::vector<float> feature_values_;
  const std::vector<int32_t> labels_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_DATA_IN_MEMORY_DATASET_H_
