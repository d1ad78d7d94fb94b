// Batch: a mini-batch on the host, as the data sources produce it and the models consume it.
#ifndef PS_WORKER_DATA_BATCH_H_
#define PS_WORKER_DATA_BATCH_H_

#include <cstdint>
#include <vector>

namespace ps::worker {

// Thread-compatible. Only the fields of the data's kind are filled.
struct Batch {
  // Number of examples.
  int64_t size = 0;

  // Dense features (images): size x feature_dim floats, row-major.
  int64_t feature_dim = 0;
  std::vector<float> dense;

  // Class labels in [0, num_classes) (classification).
  std::vector<int32_t> class_labels;
  // Binary labels in {0, 1} (CTR).
  std::vector<float> binary_labels;

  // Sparse features (CSR): example i has features [offsets[i], offsets[i + 1]) of
  // feature_ids / feature_values. offsets has size + 1 entries.
  std::vector<uint32_t> offsets;
  std::vector<uint64_t> feature_ids;
  std::vector<float> feature_values;

  void Clear() {
    size = 0;
    feature_dim = 0;
    dense.clear();
    class_labels.clear();
    binary_labels.clear();
    offsets.clear();
    feature_ids.clear();
    feature_values.clear();
  }
};

}  // namespace ps::worker

#endif  // PS_WORKER_DATA_BATCH_H_
