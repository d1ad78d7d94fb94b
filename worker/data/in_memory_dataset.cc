#include "worker/data/in_memory_dataset.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "glog/logging.h"

namespace ps::worker {
namespace {

void CheckLabels(const std::vector<int32_t>& labels, int num_classes) {
  for (size_t i = 0; i < labels.size(); ++i) {
    CHECK(labels[i] >= 0 && labels[i] < num_classes)
        << "label " << labels[i] << " of example " << i << " is not in [0, " << num_classes << ")";
  }
}

}  // namespace

DenseDataset::DenseDataset(int64_t feature_dim, int num_classes, std::vector<float> features,
                           std::vector<int32_t> labels)
    : feature_dim_(feature_dim),
      num_classes_(num_classes),
      features_(std::move(features)),
      labels_(std::move(labels)) {
  CHECK_GT(feature_dim_, 0);
  CHECK_GE(num_classes_, 1);
  CHECK_EQ(features_.size(), labels_.size() * static_cast<uint64_t>(feature_dim_));
  CheckLabels(labels_, num_classes_);
}

absl::Span<const float> DenseDataset::features(int64_t i) const {
  DCHECK(i >= 0 && i < size());
  return absl::MakeConstSpan(features_.data() + i * feature_dim_, feature_dim_);
}

void DenseDataset::FillBatch(absl::Span<const int64_t> indices, Batch* batch) const {
  batch->Clear();
  const int64_t n = static_cast<int64_t>(indices.size());
  batch->size = n;
  batch->feature_dim = feature_dim_;
  // resize() on a cleared vector keeps its capacity: no allocation in steady state.
  batch->dense.resize(n * feature_dim_);
  batch->class_labels.resize(n);
  float* out = batch->dense.data();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = indices[k];
    CHECK(i >= 0 && i < size()) << "index " << i << " out of range [0, " << size() << ")";
    std::copy_n(features_.data() + i * feature_dim_, feature_dim_, out + k * feature_dim_);
    batch->class_labels[k] = labels_[i];
  }
}

SparseDataset::SparseDataset(int num_classes, std::vector<uint64_t> offsets,
                             std::vector<uint64_t> feature_ids, std::vector<float> feature_values,
                             std::vector<int32_t> labels)
    : num_classes_(num_classes),
      offsets_(std::move(offsets)),
      feature_ids_(std::move(feature_ids)),
      feature_values_(std::move(feature_values)),
      labels_(std::move(labels)) {
  CHECK_GE(num_classes_, 2);
  CHECK_EQ(offsets_.size(), labels_.size() + 1);
  CHECK_EQ(offsets_.front(), 0u);
  CHECK(std::is_sorted(offsets_.begin(), offsets_.end())) << "offsets must not decrease";
  CHECK_EQ(offsets_.back(), feature_ids_.size());
  CHECK_EQ(feature_ids_.size(), feature_values_.size());
  CheckLabels(labels_, num_classes_);
}

absl::Span<const uint64_t> SparseDataset::feature_ids(int64_t i) const {
  DCHECK(i >= 0 && i < size());
  return absl::MakeConstSpan(feature_ids_.data() + offsets_[i], offsets_[i + 1] - offsets_[i]);
}

absl::Span<const float> SparseDataset::feature_values(int64_t i) const {
  DCHECK(i >= 0 && i < size());
  return absl::MakeConstSpan(feature_values_.data() + offsets_[i], offsets_[i + 1] - offsets_[i]);
}

void SparseDataset::FillBatch(absl::Span<const int64_t> indices, Batch* batch) const {
  batch->Clear();
  const int64_t n = static_cast<int64_t>(indices.size());
  batch->size = n;
  // Size the CSR arrays in one pass first, so the copy below never reallocates.
  uint64_t total = 0;
  for (int64_t i : indices) {
    CHECK(i >= 0 && i < size()) << "index " << i << " out of range [0, " << size() << ")";
    total += offsets_[i + 1] - offsets_[i];
  }
  CHECK_LE(total, std::numeric_limits<uint32_t>::max()) << "batch too large for uint32 offsets";
  batch->offsets.resize(n + 1);
  batch->feature_ids.resize(total);
  batch->feature_values.resize(total);
  const bool binary = num_classes_ == 2;
  if (binary) {
    batch->binary_labels.resize(n);
  } else {
    batch->class_labels.resize(n);
  }
  uint32_t pos = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = indices[k];
    const uint64_t begin = offsets_[i];
    const uint64_t len = offsets_[i + 1] - begin;
    batch->offsets[k] = pos;
    std::copy_n(feature_ids_.data() + begin, len, batch->feature_ids.data() + pos);
    std::copy_n(feature_values_.data() + begin, len, batch->feature_values.data() + pos);
    pos += static_cast<uint32_t>(len);
    if (binary) {
      batch->binary_labels[k] = static_cast<float>(labels_[i]);
    } else {
      batch->class_labels[k] = labels_[i];
    }
  }
  batch->offsets[n] = pos;
}

}  // namespace ps::worker
