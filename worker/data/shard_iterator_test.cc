#include "worker/data/shard_iterator.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Every index the iterator yields for the rest of its current epoch, checking batch sizes.
std::vector<int64_t> Drain(ShardIterator& it, uint32_t batch_size) {
  std::vector<int64_t> all, batch;
  bool short_seen = false;
  while (it.Next(&batch)) {
    EXPECT_FALSE(short_seen) << "a short batch before the end of the epoch";
    EXPECT_GE(batch.size(), 1u);
    EXPECT_LE(batch.size(), batch_size);
    short_seen = batch.size() < batch_size;
    all.insert(all.end(), batch.begin(), batch.end());
  }
  EXPECT_THAT(batch, IsEmpty());
  return all;
}

TEST(ShardIterator, ShardsCoverEveryExampleExactlyOncePerEpoch) {
  for (int64_t size : {0, 1, 5, 7, 10, 64, 101, 1000}) {
    for (int32_t workers : {1, 2, 3, 4, 7, 16}) {
      for (bool shuffle : {false, true}) {
        for (uint32_t epoch : {0u, 5u}) {
          SCOPED_TRACE(::testing::Message() << "size " << size << ", workers " << workers
                                            << ", shuffle " << shuffle << ", epoch " << epoch);
          std::vector<int> seen(size);
          uint64_t total = 0;
          for (int32_t w = 0; w < workers; ++w) {
            ShardIterator it(size, w, workers, 3, shuffle, 42);
            it.StartEpoch(epoch);
            const std::vector<int64_t> shard = Drain(it, 3);
            EXPECT_EQ(shard.size(), it.shard_size());
            EXPECT_EQ(it.offset(), it.shard_size());
            // Shards differ in size by at most one.
            EXPECT_LE(it.shard_size(), static_cast<uint64_t>(size / workers + 1));
            EXPECT_GE(it.shard_size(), static_cast<uint64_t>(size / workers));
            for (int64_t i : shard) {
              ASSERT_TRUE(i >= 0 && i < size) << i;
              EXPECT_EQ(i % workers, w);
              ++seen[i];
            }
            total += shard.size();
          }
          EXPECT_EQ(total, static_cast<uint64_t>(size));
          for (int64_t i = 0; i < size; ++i) EXPECT_EQ(seen[i], 1) << "example " << i;
        }
      }
    }
  }
}

TEST(ShardIterator, BatchesAreFullExceptTheLast) {
  ShardIterator it(23, 1, 2, 4, true, 1);  // examples 1, 3, ..., 21: 11 of them
  EXPECT_EQ(it.shard_size(), 11u);
  EXPECT_EQ(it.batches_per_epoch(), 3u);
  std::vector<int64_t> batch;
  std::vector<size_t> sizes;
  while (it.Next(&batch)) sizes.push_back(batch.size());
  EXPECT_THAT(sizes, ElementsAre(4, 4, 3));
  // The epoch is over until StartEpoch.
  EXPECT_FALSE(it.Next(&batch));
  EXPECT_EQ(it.epoch(), 0u);
}

TEST(ShardIterator, WithoutShuffleVisitsInAscendingOrder) {
  ShardIterator it(10, 1, 3, 2, false, 1);
  EXPECT_THAT(Drain(it, 2), ElementsAre(1, 4, 7));
  it.StartEpoch(9);
  EXPECT_THAT(Drain(it, 2), ElementsAre(1, 4, 7));
}

TEST(ShardIterator, ShuffleDiffersAcrossEpochsAndIsReproducible) {
  ShardIterator a(1000, 0, 2, 16, true, 7);
  ShardIterator b(1000, 0, 2, 16, true, 7);
  std::vector<std::vector<int64_t>> epochs;
  for (uint32_t e = 0; e < 4; ++e) {
    a.StartEpoch(e);
    b.StartEpoch(e);
    epochs.push_back(Drain(a, 16));
    EXPECT_EQ(Drain(b, 16), epochs.back()) << "epoch " << e;
  }
  for (size_t i = 0; i < epochs.size(); ++i) {
    for (size_t j = i + 1; j < epochs.size(); ++j) EXPECT_NE(epochs[i], epochs[j]);
  }
  // Shuffled, not ascending.
  EXPECT_FALSE(std::is_sorted(epochs[0].begin(), epochs[0].end()));
  // Another seed gives another order.
  ShardIterator c(1000, 0, 2, 16, true, 8);
  EXPECT_NE(Drain(c, 16), epochs[0]);
}

TEST(ShardIterator, EpochOrderDoesNotDependOnHistory) {
  ShardIterator a(500, 2, 3, 8, true, 11);
  a.StartEpoch(1);
  Drain(a, 8);
  a.StartEpoch(6);
  ShardIterator b(500, 2, 3, 8, true, 11);
  b.StartEpoch(6);
  EXPECT_EQ(Drain(a, 8), Drain(b, 8));
}

// The order of a small shuffled epoch, pinned: it is part of the checkpoint contract (a
// worker resumed by a newer build must continue the same sequence).
TEST(ShardIterator, ShuffledOrderIsStable) {
  ShardIterator it(20, 1, 2, 100, true, 1);
  it.StartEpoch(2);
  EXPECT_THAT(Drain(it, 100), ElementsAre(7, 9, 11, 3, 5, 15, 13, 19, 1, 17));
}

TEST(ShardIterator, SeekReproducesTheRemainingSequence) {
  for (uint64_t consumed : {0, 1, 5, 8, 63, 64, 65, 166, 167}) {
    SCOPED_TRACE(::testing::Message() << "consumed " << consumed);
    ShardIterator original(500, 1, 3, 8, true, 5);
    original.StartEpoch(3);
    std::vector<int64_t> batch;
    // Consume whole batches until `consumed` is reached or passed; record the position.
    while (original.offset() < consumed && original.Next(&batch)) {
    }
    const uint32_t epoch = original.epoch();
    const uint64_t offset = original.offset();
    const std::vector<int64_t> rest = Drain(original, 8);

    // A restarted worker, with the same or another batch size.
    for (uint32_t batch_size : {8u, 5u}) {
      ShardIterator resumed(500, 1, 3, batch_size, true, 5);
      ASSERT_OK(resumed.Seek(epoch, offset));
      EXPECT_EQ(resumed.epoch(), 3u);
      EXPECT_EQ(resumed.offset(), offset);
      EXPECT_EQ(Drain(resumed, batch_size), rest);
    }
  }
}

TEST(ShardIterator, SeekToAnOffsetWithinTheEpoch) {
  ShardIterator full(100, 0, 1, 10, true, 9);
  full.StartEpoch(4);
  const std::vector<int64_t> order = Drain(full, 10);
  ShardIterator it(100, 0, 1, 10, true, 9);
  ASSERT_OK(it.Seek(4, 37));
  EXPECT_EQ(Drain(it, 10), std::vector<int64_t>(order.begin() + 37, order.end()));
  // Back to an earlier epoch and forward again.
  ASSERT_OK(it.Seek(0, 0));
  ASSERT_OK(it.Seek(4, 99));
  EXPECT_THAT(Drain(it, 10), ElementsAre(order[99]));
}

TEST(ShardIterator, SeekToTheEndLeavesNothing) {
  ShardIterator it(10, 0, 2, 3, true, 1);
  ASSERT_OK(it.Seek(2, 5));
  std::vector<int64_t> batch = {1, 2};
  EXPECT_FALSE(it.Next(&batch));
  EXPECT_THAT(batch, IsEmpty());
}

TEST(ShardIterator, SeekPastTheShardIsInvalidAndKeepsPosition) {
  ShardIterator it(10, 0, 2, 3, true, 1);
  it.StartEpoch(1);
  std::vector<int64_t> batch;
  ASSERT_TRUE(it.Next(&batch));
  EXPECT_THAT(it.Seek(7, 6),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only 5 examples per epoch")));
  EXPECT_EQ(it.epoch(), 1u);
  EXPECT_EQ(it.offset(), 3u);
}

TEST(ShardIterator, MoreWorkersThanExamples) {
  ShardIterator it(2, 3, 4, 8, true, 1);
  EXPECT_EQ(it.shard_size(), 0u);
  EXPECT_EQ(it.batches_per_epoch(), 0u);
  std::vector<int64_t> batch;
  EXPECT_FALSE(it.Next(&batch));
}

}  // namespace
}  // namespace ps::worker
