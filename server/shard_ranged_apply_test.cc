// A parallel apply that splits a push's large blocks into ranges (ShardOptions::
// parallel_apply_range_values): the result is the serial apply's bit for bit, with payloads
// whole or in pieces at any alignment; rules that sum a block are not split; and ranged pushes
// run beside one-pass pushes and pulls of the same blocks without waiting for each other.
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "server/shard_testing.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using shard_testing::AllBlocks;
using shard_testing::Cut;
using shard_testing::FirstWorkerPush;
using shard_testing::InPieces;
using shard_testing::ReadBlocks;
using shard_testing::TwoTableConfig;
using shard_testing::WholeTable;
using ::testing::HasSubstr;

// A shard of one dense table "w" of 2 blocks of 64k values and a small one "b" (a block of
// its own), both with `optimizer`; every push is applied in parallel when apply_threads > 0.
// SGD pushes checked for non-finite values take the one pass instead (serial), so SGD shards
// here count them as the others do, without refusing (reject_nonfinite false).
std::unique_ptr<Shard> MakeTwoBlockShard(const std::string& optimizer, int apply_threads,
                                         size_t range_values = kParallelApplyRangeValues,
                                         absl::Duration apply_spin = absl::ZeroDuration()) {
  const JobConfig config =
      TwoTableConfig(optimizer, optimizer, "kind: UNIFORM low: -1 high: 1", /*num_workers=*/1);
  ShardOptions options;
  options.apply_threads = apply_threads;
  options.parallel_apply_values = 1;
  options.parallel_apply_range_values = range_values;
  options.reject_nonfinite = !absl::StartsWith(optimizer, "kind: SGD");
  options.apply_spin = apply_spin;
  auto shard = Shard::Create(config, options);
  CHECK_OK(shard.status());
  return *std::move(shard);
}

std::vector<float> Gradient(size_t n, float phase) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = std::sin(phase + 0.0007f * static_cast<float>(i));
  return g;
}

// Pushes `steps` gradients of "w" (and one of "b" along) to `shard`, each payload whole or
// cut by `cut` (kWholeAtAnOddAddress for none) and marked as memory that may change when
// `may_change`; returns "w" and "b" after.
std::vector<float> PushSteps(Shard& shard, int steps, bool in_pieces, Cut cut, bool may_change) {
  const std::vector<float> b_grad = Gradient(100, 2.0f);
  for (int step = 0; step < steps; ++step) {
    const std::vector<float> grad = Gradient(131072, static_cast<float>(step));
    PushTable tables[2];
    tables[0] = WholeTable(shard, grad);
    std::string storage;
    std::vector<std::vector<absl::string_view>> pieces;
    if (in_pieces) tables[0] = InPieces(tables[0], &storage, &pieces, cut);
    tables[0].payload_may_change = may_change;
    tables[1].table = "b";
    tables[1].blocks.push_back({0, shard_testing::Bytes(b_grad)});
    PushView push = FirstWorkerPush(shard, tables, static_cast<uint64_t>(step) + 1);
    push.tables = absl::MakeConstSpan(tables, 2);
    CHECK_OK(shard.Push(push).status());
  }
  std::vector<float> out = ReadBlocks(shard, "w", AllBlocks(shard));
  const std::vector<float> b = ReadBlocks(shard, "b", {0});
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ShardRangedApply, EqualsTheSerialApplyBitwise) {
  // 2 large blocks and a small one over 4 or 8 threads: each large block is split (into 2
  // ranges of 33,792 and 31,744 values, or 4 of 17,408 and one of 13,312). Every element-wise
  // rule, payloads whole, in receive slices at odd addresses, in 3-byte pieces, and read as
  // memory that may change (each value once, a non-finite one as 0).
  for (const char* optimizer : {"kind: ADAM", "kind: SGD learning_rate: 0.1", "kind: MOMENTUM",
                                "kind: ADAGRAD", "kind: FTRL"}) {
    auto serial = MakeTwoBlockShard(optimizer, 0);
    const std::vector<float> want = PushSteps(*serial, 3, false, Cut::kSlices, false);
    for (int threads : {3, 7}) {
      for (Cut cut : {Cut::kWholeAtAnOddAddress, Cut::kSlices, Cut::kTiny}) {
        for (bool may_change : {false, true}) {
          SCOPED_TRACE(absl::StrCat(optimizer, ", apply_threads ", threads, ", cut ",
                                    static_cast<int>(cut), may_change ? ", may change" : ""));
          auto shard = MakeTwoBlockShard(optimizer, threads);
          EXPECT_TRUE(SameBits(PushSteps(*shard, 3, true, cut, may_change), want));
          EXPECT_EQ(shard->parallel_pushes(), 3u);
          EXPECT_EQ(shard->ranged_pushes(), 3u);
        }
      }
      auto shard = MakeTwoBlockShard(optimizer, threads);
      EXPECT_TRUE(SameBits(PushSteps(*shard, 3, false, Cut::kSlices, false), want));
      EXPECT_EQ(shard->ranged_pushes(), 3u);
    }
  }
}

TEST(ShardRangedApply, RangesAndWatchingFollowTheConfigElseTheCores) {
  auto config = common::ParseJobConfigText(R"pb(tables {
                                                  name: "w"
                                                  kind: TABLE_KIND_DENSE
                                                  shape: 4
                                                  initializer { kind: ZEROS }
                                                })pb",
                                           "test");
  ASSERT_THAT(config.status(), IsOk());
  EXPECT_EQ(ParallelApplyRangeValues(*config), kParallelApplyRangeValues);
  EXPECT_EQ(ApplySpin(*config, 7), absl::ZeroDuration());
  EXPECT_EQ(ApplySpin(*config, 8), kManyCoresApplySpin);
  config->mutable_server()->set_parallel_apply_range_values(4096);
  EXPECT_EQ(ParallelApplyRangeValues(*config), 4096u);
  config->mutable_server()->set_apply_spin_us(250);
  EXPECT_EQ(ApplySpin(*config, 2), absl::Microseconds(250));
  config->mutable_server()->set_apply_spin_us(-1);
  EXPECT_EQ(ApplySpin(*config, 64), absl::ZeroDuration());
}

TEST(ShardRangedApply, WithWatchingApplyThreadsEqualsTheSerialApplyBitwise) {
  // Apply threads that watch for work (apply_spin) join the check and the apply through the
  // pool's slot: the same result.
  auto serial = MakeTwoBlockShard("kind: ADAM", 0);
  const std::vector<float> want = PushSteps(*serial, 5, false, Cut::kSlices, false);
  auto shard = MakeTwoBlockShard("kind: ADAM", 7, kParallelApplyRangeValues, absl::Seconds(1));
  EXPECT_TRUE(SameBits(PushSteps(*shard, 5, true, Cut::kSlices, true), want));
  EXPECT_EQ(shard->ranged_pushes(), 5u);
}

TEST(ShardRangedApply, TheCheckInRangesFindsEveryNonFiniteValue) {
  // The finite check runs in the same ranges: non-finite values in different ranges of one
  // block are all counted, the push is refused naming the first, and nothing changes.
  for (bool in_pieces : {false, true}) {
    SCOPED_TRACE(in_pieces ? "in pieces" : "whole");
    auto shard = MakeTwoBlockShard("kind: ADAM", 7);
    const std::vector<float> before = ReadBlocks(*shard, "w", AllBlocks(*shard));
    std::vector<float> grad = Gradient(131072, 0.0f);
    for (size_t i : {65536 + 20000, 65536 + 40000, 65536 + 65535}) {
      grad[i] = std::numeric_limits<float>::infinity();
    }
    PushTable table = WholeTable(*shard, grad);
    std::string storage;
    std::vector<std::vector<absl::string_view>> pieces;
    if (in_pieces) table = InPieces(table, &storage, &pieces, Cut::kSlices);
    const absl::Status status = shard->Push(FirstWorkerPush(*shard, &table)).status();
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("block 1: 3 non-finite values (first at index 20000")));
    EXPECT_TRUE(SameBits(ReadBlocks(*shard, "w", AllBlocks(*shard)), before));
    EXPECT_EQ(shard->parallel_pushes(), 0u);
  }
}

TEST(ShardRangedApply, BlocksNoLargerThanTheRangeOrSummedWholeAreNotSplit) {
  // A range of at least the block size splits nothing; clip_norm sums the whole block, so
  // its blocks are applied whole (in parallel, one per thread). Both still equal the serial.
  struct Case {
    const char* optimizer;
    size_t range_values;
  };
  for (const Case& c : {Case{"kind: ADAM", 65536}, Case{"kind: ADAM clip_norm: 0.5", 1024}}) {
    SCOPED_TRACE(absl::StrCat(c.optimizer, ", range ", c.range_values));
    auto serial = MakeTwoBlockShard(c.optimizer, 0);
    const std::vector<float> want = PushSteps(*serial, 2, false, Cut::kSlices, false);
    auto shard = MakeTwoBlockShard(c.optimizer, 7, c.range_values);
    EXPECT_TRUE(SameBits(PushSteps(*shard, 2, true, Cut::kSlices, false), want));
    EXPECT_EQ(shard->parallel_pushes(), 2u);
    EXPECT_EQ(shard->ranged_pushes(), 0u);
  }
  // Just under the block size: split.
  auto shard = MakeTwoBlockShard("kind: ADAM", 7, 65535);
  PushSteps(*shard, 1, false, Cut::kSlices, false);
  EXPECT_EQ(shard->ranged_pushes(), 1u);
}

TEST(ShardRangedApply, RunsBesideOnePassPushesAndPullsOfTheSameBlocks) {
  // "w" is SGD, "b" Adam: a push of "w" alone takes the one pass (its blocks locked in one
  // order), a push of "w" and "b" is applied in ranges (all its blocks locked in that order);
  // pulls read a block at a time. Two workers push each way at once while a reader pulls:
  // none waits for the other for good, and every update of "w" lands (SGD sums).
  // Blocks of kBlock values, so that a push of all of "w" is at most kOnePassMaxValues and
  // takes the one pass. The other pushes (2 * kBlock + 100 values) are split: with 7 threads
  // and a range option of 1024, their ranges (Shard::RangeValues: the share per thread,
  // rounded up to 1024) are 1024 values, less than a block.
  constexpr int kBlock = static_cast<int>(kOnePassMaxValues / 2);
  static_assert(kBlock > 1024, "RangeValues rounds a share up to 1024");
  const JobConfig config = TwoTableConfig("kind: SGD learning_rate: 1", "kind: ADAM",
                                          "kind: CONSTANT value: 0", /*num_workers=*/2, kBlock);
  ShardOptions options;
  options.apply_threads = 7;
  options.parallel_apply_values = 1;
  options.parallel_apply_range_values = 1024;
  auto created = Shard::Create(config, options);
  ASSERT_THAT(created.status(), IsOk());
  Shard& shard = **created;
  constexpr int kPushes = 400;
  const std::vector<float> ones(2 * kBlock, 1.0f), b_ones(100, 1.0f);
  std::atomic<bool> go{false};  // both pushers start together
  auto pusher = [&](int worker, bool with_b) {
    while (!go.load()) std::this_thread::yield();
    for (int i = 0; i < kPushes; ++i) {
      PushTable tables[2];
      tables[0] = WholeTable(shard, ones);
      tables[1].table = "b";
      tables[1].blocks.push_back({0, shard_testing::Bytes(b_ones)});
      PushView push = FirstWorkerPush(shard, tables, static_cast<uint64_t>(i) + 1);
      push.info.worker_id = worker;
      push.tables = absl::MakeConstSpan(tables, with_b ? 2 : 1);
      ASSERT_THAT(shard.Push(push).status(), IsOk());
    }
  };
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      const std::vector<float> w = ReadBlocks(shard, "w", AllBlocks(shard));
      // A block is read under its lock: never half of a push.
      for (size_t at : {size_t{0}, size_t{kBlock}}) {
        for (size_t i = at; i < at + kBlock; i += 97) ASSERT_EQ(w[i], w[at]);
      }
    }
  });
  std::thread ranged(pusher, 0, true);
  std::thread one_pass(pusher, 1, false);
  go = true;
  ranged.join();
  one_pass.join();
  done = true;
  reader.join();
  EXPECT_EQ(shard.ranged_pushes(), static_cast<uint64_t>(kPushes));
  EXPECT_EQ(shard.one_pass_pushes(), static_cast<uint64_t>(kPushes));
  const std::vector<float> w = ReadBlocks(shard, "w", AllBlocks(shard));
  for (float v : w) ASSERT_EQ(v, -2.0f * kPushes);
}

TEST(ShardRangedApply, SnapshotsUnderRangedPushesAreCuts) {
  // SGD, learning rate 1, gradient 1, from 0: after k pushes every value is -k. Pushes applied
  // in ranges (not the one pass: non-finite values are counted, not refused) run while
  // snapshots are taken; each snapshot, restored, holds one k in every value of both blocks,
  // and k is the updates the snapshot says were applied.
  const JobConfig config =
      TwoTableConfig("kind: SGD learning_rate: 1", "kind: SGD learning_rate: 1",
                     "kind: CONSTANT value: 0", /*num_workers=*/1);
  ShardOptions options;
  options.apply_threads = 3;
  options.parallel_apply_values = 1;
  options.reject_nonfinite = false;
  auto created = Shard::Create(config, options);
  ASSERT_THAT(created.status(), IsOk());
  Shard& shard = **created;
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    const std::vector<float> ones(131072, 1.0f);
    for (uint64_t seq = 1; !stop.load(); ++seq) {
      PushTable table = WholeTable(shard, ones);
      ASSERT_THAT(shard.Push(FirstWorkerPush(shard, &table, seq)).status(), IsOk());
    }
  });
  // Snapshots from the first push applied on, 20 of them and until 5 pushes have been (on a
  // loaded machine 20 snapshots can end before the pusher's first push does).
  const absl::Time give_up = absl::Now() + absl::Seconds(60);  // (a failed push stops the pusher)
  while (shard.ranged_pushes() == 0 && absl::Now() < give_up) std::this_thread::yield();
  for (int round = 0; round < 20 || (shard.ranged_pushes() < 5 && round < 100000); ++round) {
    std::map<std::string, std::string> records;
    auto meta = shard.Snapshot(
        [&records](absl::string_view k, absl::string_view v) {
          records[std::string(k)] = std::string(v);
          return absl::OkStatus();
        },
        1 << 16);
    ASSERT_THAT(meta.status(), IsOk());
    auto restored = Shard::Create(config, ShardOptions{});
    ASSERT_THAT(restored.status(), IsOk());
    ASSERT_THAT((*restored)->BeginRestore(*meta), IsOk());
    for (const auto& [k, v] : records) ASSERT_THAT((*restored)->RestoreRecord(k, v), IsOk());
    (*restored)->EndRestore(*meta);
    const std::vector<float> w = ReadBlocks(**restored, "w", {0, 1});
    const float want = -static_cast<float>(meta->updates_applied());
    for (size_t i = 0; i < w.size(); i += 997) ASSERT_EQ(w[i], want) << "value " << i;
    ASSERT_EQ(w.back(), want);
  }
  stop = true;
  pusher.join();
  EXPECT_GE(shard.ranged_pushes(), 5u);
}

}  // namespace
}  // namespace ps::server
