#include "worker/data/shard_iterator.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "glog/logging.h"

namespace ps::worker {
namespace {

// Part of the checkpoint contract: changing it changes every epoch's order, so a worker
// resumed from an older checkpoint would skip and repeat examples.
constexpr uint64_t kShuffleSalt = common::Fingerprint64("ps/shard_iterator/shuffle");

// SplitMix64: the generator whose finalizer common::Mix64 is. Fixed by definition, unlike
// the engines behind std::shuffle's implementation-defined use of them.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return common::Mix64(state_ += 0x9e3779b97f4a7c15ULL); }

  // Uniform in [0, bound), unbiased (Lemire 2019, multiply-shift with rejection).
  // REQUIRES: bound > 0.
  uint64_t Below(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(Next()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = -bound % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(Next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace

ShardIterator::ShardIterator(int64_t dataset_size, int32_t worker_index, int32_t num_workers,
                             uint32_t batch_size, bool shuffle, uint64_t seed)
    : worker_index_(worker_index),
      num_workers_(num_workers),
      batch_size_(batch_size),
      shuffle_(shuffle),
      seed_(seed) {
  CHECK_GE(dataset_size, 0);
  CHECK_GE(num_workers, 1);
  CHECK(worker_index >= 0 && worker_index < num_workers)
      << "worker_index " << worker_index << " of " << num_workers;
  CHECK_GE(batch_size, 1u);
  // Examples worker_index, worker_index + W, ...: ceil((n - w) / W) of them.
  const int64_t count = dataset_size > worker_index
                            ? (dataset_size - worker_index + num_workers - 1) / num_workers
                            : 0;
  order_.resize(count);
  StartEpoch(0);
}

void ShardIterator::StartEpoch(uint32_t epoch) {
  epoch_ = epoch;
  offset_ = 0;
  // Rebuild from the ascending order every time, so the order of an epoch does not depend
  // on which epochs came before (Seek may jump anywhere).
  const int64_t n = static_cast<int64_t>(order_.size());
  for (int64_t k = 0; k < n; ++k) order_[k] = worker_index_ + k * num_workers_;
  if (!shuffle_) return;
  SplitMix64 rng(common::HashCombine(
      common::HashCombine(common::HashCombine(kShuffleSalt, seed_), worker_index_), epoch));
  // Fisher-Yates.
  for (int64_t k = n - 1; k > 0; --k) {
    std::swap(order_[k], order_[rng.Below(static_cast<uint64_t>(k) + 1)]);
  }
}

bool ShardIterator::Next(std::vector<int64_t>* indices) {
  indices->clear();
  if (offset_ >= order_.size()) return false;
  const uint64_t end = std::min<uint64_t>(order_.size(), offset_ + batch_size_);
  indices->assign(order_.begin() + offset_, order_.begin() + end);
  offset_ = end;
  return true;
}

absl::Status ShardIterator::Seek(uint32_t epoch, uint64_t offset) {
  if (offset > order_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seek to offset ", offset, " of epoch ", epoch, ": worker ", worker_index_, " of ",
        num_workers_, " has only ", order_.size(),
        " examples per epoch (was the checkpoint made with other data or another worker count?)"));
  }
  // Reshuffling costs O(shard); skip it when the epoch's order is already in place.
  if (epoch != epoch_) StartEpoch(epoch);
  offset_ = offset;
  return absl::OkStatus();
}

}  // namespace ps::worker
