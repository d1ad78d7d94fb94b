// CtrModel: click-through-rate prediction on sparse features: an embedding bag followed by
// an optional MLP and a single logit, trained with sigmoid cross-entropy.
//
// For example b with features f in [offsets[b], offsets[b + 1]):
//   key_f    = hash_buckets > 0 ? common::Mix64(feature_ids[f]) % hash_buckets
//                               : feature_ids[f]
//   pooled_b = s_b * sum_f feature_values[f] * E[key_f]     (E: the sparse embedding table)
//              s_b = 1 (SUM) or 1 / (number of features of b) (MEAN; an empty bag pools to 0)
//   logit_b  = DenseStack(pooled_b): widths common::CtrLayerWidths = [dim, hidden..., 1],
//              ReLU on hidden layers, tables common::CtrWeightTable / CtrBiasTable
//   loss     = mean_b sigmoid_cross_entropy(logit_b, binary_labels[b])
// MEAN divides by the feature count rather than by the sum of values (as TF's "mean"
// does), so that zero or negative values cannot divide by zero.
//
// Sparse traffic. PreparePull deduplicates the batch's keys (unique keys in first-seen order,
// duplicates within and across examples collapse) and pulls one row per unique key; the
// backward pass sums every use of a key into that key's single gradient row, so a push
// carries each key once.
//
// Where the math runs. The embedding bag (forward: weighted sum of pulled rows; backward:
// scatter-add of the per-example bag gradients into the unique rows) runs on the host, next
// to the rows the store pulled: it is O(features x dim) memory-bound work, and doing it there
// moves only the pooled batch (batch x dim) to the device and its gradient back, instead of
// every unique row each way. The dense layers and the loss run on the backend.
#ifndef PS_WORKER_MODELS_CTR_MODEL_H_
#define PS_WORKER_MODELS_CTR_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/parameter_store.h"
#include "kernels/backend.h"
#include "proto/config.pb.h"
#include "worker/data/batch.h"
#include "worker/models/dense_stack.h"
#include "worker/models/mirrored_array.h"
#include "worker/models/model.h"

namespace ps::worker {

// Thread-compatible: callers synchronize. The Backend is not owned and must outlive the
// model.
class CtrModel final : public Model {
 public:
  // A model for batches of at most `max_batch` examples.
  // Errors: INVALID_ARGUMENT for a null backend, max_batch outside [1, INT32_MAX], a zero
  // embedding_dim or hidden width, or an empty embedding_table or dense_prefix;
  // RESOURCE_EXHAUSTED when the device is out of memory.
  static absl::StatusOr<std::unique_ptr<CtrModel>> Create(const ps::CtrConfig& config,
                                                          kernels::Backend* backend,
                                                          int64_t max_batch);

  // Adds a SparsePull of the batch's unique keys (when it has any features) and a DensePull
  // for every dense table. The keys stay valid until the next PreparePull.
  // Errors: INVALID_ARGUMENT for a batch this model cannot take (see ForwardBackward).
  absl::Status PreparePull(const Batch& batch, common::PullBatch* pull) override;

  // Returns the mean sigmoid cross-entropy of the batch; the gradients are left for
  // PreparePush. Errors: INVALID_ARGUMENT when batch.size is outside [1, max_batch], the CSR
  // arrays are inconsistent (offsets not size + 1 non-decreasing entries from 0 to the
  // number of features, or values and ids of different lengths), or a label is outside
  // [0, 1]; FAILED_PRECONDITION when the batch is not the one of the last PreparePull;
  // backend errors otherwise.
  absl::StatusOr<StepResult> ForwardBackward(const Batch& batch) override;

  // Adds a SparsePush of one gradient row per unique key (when there are any) and a
  // DensePush per dense table. Errors: FAILED_PRECONDITION unless a ForwardBackward
  // succeeded after the last PreparePull.
  absl::Status PreparePush(common::PushBatch* push) override;

  // Appends each example's predicted probability and label to acc->scores / acc->labels and
  // adds the size, the log-loss sum and the number of examples whose prediction
  // (probability >= 0.5) matches the label (>= 0.5) to `acc`. Errors: as ForwardBackward.
  absl::Status Evaluate(const Batch& batch, EvalAccumulator* acc) override;

  // Width of an embedding row.
  int64_t embedding_dim() const { return dim_; }
  // The key a raw feature id is looked up under.
  uint64_t KeyOf(uint64_t feature_id) const;

 private:
  CtrModel(const ps::CtrConfig& config, kernels::Backend* backend,
           std::unique_ptr<DenseStack> stack);

  absl::Status CheckBatch(const Batch& batch) const;
  // Pools the batch on the host, stages it and the labels on the device and runs the dense
  // layers; returns the device logits.
  absl::StatusOr<float*> Forward(const Batch& batch);
  // The weight of feature f of an example with `count` features: value * s_b.
  float FeatureScale(float value, int64_t count) const;
  void PoolOnHost(const Batch& batch, float* pooled) const;
  void ScatterGradsOnHost(const Batch& batch, const float* d_pooled);

  // Constant after construction.
  kernels::Backend* const backend_;  // Not owned.
  const std::string embedding_table_;
  const bool mean_combiner_;
  const uint64_t hash_buckets_;
  const int64_t dim_;
  const std::unique_ptr<DenseStack> stack_;

  // The batch of the last PreparePull: its unique keys (first-seen order), each feature's
  // row among them, and the pulled rows (unique x dim).
  absl::flat_hash_map<uint64_t, int32_t> key_rows_;
  std::vector<uint64_t> unique_keys_;
  std::vector<int32_t> feature_rows_;
  std::vector<float> rows_;
  int64_t prepared_size_ = -1;
  // Gradient rows of unique_keys_ from the last ForwardBackward (unique x dim).
  std::vector<float> row_grads_;
  bool has_gradients_ = false;

  // Pooled batch and its gradient (max_batch x dim), labels and probabilities (max_batch).
  MirroredArray<float> pooled_;
  MirroredArray<float> d_pooled_;
  MirroredArray<float> labels_;
  MirroredArray<float> probabilities_;
  const float* device_labels_ = nullptr;  // Set by Forward.
};

}  // namespace ps::worker

#endif  // PS_WORKER_MODELS_CTR_MODEL_H_
