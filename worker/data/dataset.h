// Dataset: an in-memory, random-access set of training or test examples. The data sources
// (IDX, LIBSVM, synthetic CTR) each produce one; the trainer reads it one Batch at a time
// through a ShardIterator's indices.
#ifndef PS_WORKER_DATA_DATASET_H_
#define PS_WORKER_DATA_DATASET_H_

#include <cstdint>

#include "absl/types/span.h"
#include "worker/data/batch.h"

namespace ps::worker {

// An immutable set of examples, either dense (a fixed number of float features per example,
// with class labels) or sparse (a variable-length list of (uint64 feature id, float value)
// per example, with binary labels for 2-class data and class labels otherwise).
//
// Thread-safe: every method is const and implementations hold no mutable state, so many
// threads may fill batches from one Dataset at once.
class Dataset {
 public:
  virtual ~Dataset() = default;

  // Number of examples.
  virtual int64_t size() const = 0;

  // Replaces the contents of `*batch` with the examples `indices`, in that order (an index
  // may repeat). Fills batch->size and the fields of this dataset's kind (see Batch):
  //   dense:  feature_dim, dense, class_labels;
  //   sparse: offsets, feature_ids, feature_values, and binary_labels when num_classes() == 2,
  //           class_labels otherwise.
  // Other fields are left empty. Reuses batch's capacity, so filling the same Batch every
  // step does not allocate once it has grown.
  // REQUIRES: every index is in [0, size()) (checked); batch != nullptr.
  virtual void FillBatch(absl::Span<const int64_t> indices, Batch* batch) const = 0;

  // True for sparse (CSR) examples, false for dense.
  virtual bool is_sparse() const = 0;

  // Dense: the number of features per example. Sparse: 0 (feature ids are arbitrary uint64
  // keys, e.g. hashes, so there is no dimension).
  virtual int64_t feature_dim() const = 0;

  // Number of classes; labels are in [0, num_classes()). 2 for binary (CTR) data.
  virtual int num_classes() const = 0;
};

}  // namespace ps::worker

#endif  // PS_WORKER_DATA_DATASET_H_
