// ShardIterator: the order in which one worker visits its part of the training set.
//
// Sharding is strided: worker w of W owns the examples i with i % W == w, so the shards
// differ in size by at most one and each sees a spread of the whole file (data sets sorted
// by class or by time are not split into skewed contiguous blocks). Together the W shards
// hold every example exactly once.
//
// Each epoch visits the whole shard once, in a random order that is a pure function of
// (seed, worker_index, epoch): different every epoch, different per worker, the same on
// every run and every build (the shuffle uses common/hash.h, not std::shuffle, whose output
// is implementation-defined). The position in an epoch is the number of examples consumed,
// so a restarted worker that Seeks to a checkpointed (epoch, offset) continues with exactly
// the examples that were left, even when its batch size changed.
#ifndef PS_WORKER_DATA_SHARD_ITERATOR_H_
#define PS_WORKER_DATA_SHARD_ITERATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace ps::worker {

// Thread-compatible: callers synchronize. Uses memory for one int64 per shard example.
//
// A new iterator is at the start of epoch 0 (as if StartEpoch(0) had been called).
class ShardIterator {
 public:
  // dataset_size: examples in the whole data set. worker_index / num_workers: which shard.
  // batch_size: examples per Next. shuffle: false visits the shard in ascending order every
  // epoch. seed: mixed with the epoch and the worker index to order each epoch.
  // REQUIRES (checked; the job config validation guarantees them): dataset_size >= 0,
  // num_workers >= 1, 0 <= worker_index < num_workers, batch_size >= 1.
  ShardIterator(int64_t dataset_size, int32_t worker_index, int32_t num_workers,
                uint32_t batch_size, bool shuffle, uint64_t seed);

  // Starts epoch `epoch` from its beginning.
  void StartEpoch(uint32_t epoch);

  // Fills `*indices` (replacing its contents) with the next batch_size indices of the epoch,
  // or fewer for the last batch of the epoch, and returns true; returns false with
  // `*indices` empty once the epoch is done. Never crosses into the next epoch: call
  // StartEpoch for that.
  bool Next(std::vector<int64_t>* indices);

  // Moves to `offset` examples into epoch `epoch`, as recorded by epoch() and offset() of
  // an iterator with the same constructor arguments (batch_size may differ).
  // Errors: INVALID_ARGUMENT when offset > shard_size() (the checkpoint does not belong to
  // this data set and sharding); the position is then unchanged.
  [[nodiscard]] absl::Status Seek(uint32_t epoch, uint64_t offset);

  // The current epoch.
  uint32_t epoch() const { return epoch_; }
  // Examples of the current epoch consumed so far (handed out by Next).
  uint64_t offset() const { return offset_; }
  // Examples in this worker's shard (every epoch visits each once).
  uint64_t shard_size() const { return order_.size(); }
  // Batches per epoch, counting a short last batch.
  uint64_t batches_per_epoch() const { return (shard_size() + batch_size_ - 1) / batch_size_; }

 private:
  // Constant after construction.
  const int32_t worker_index_;
  const int32_t num_workers_;
  const uint32_t batch_size_;
  const bool shuffle_;
  const uint64_t seed_;

  uint32_t epoch_ = 0;
  uint64_t offset_ = 0;
  // This epoch's visiting order: the shard's dataset indices, permuted.
  std::vector<int64_t> order_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_DATA_SHARD_ITERATOR_H_
