// A large pull read in place (Shard::ReadPull's `in_place`): its dense blocks are read in
// ranges on the apply threads after the sink's calls, bit for bit what the serial read gives,
// each block as one version while pushes land; small pulls, pulls not in place and pulls
// without apply threads are read as before; a sink's error reads nothing.
#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "server/shard_testing.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using shard_testing::FirstWorkerPush;
using shard_testing::ReadBlocks;
using shard_testing::ReadBlocksInPlace;
using shard_testing::TwoTableConfig;
using shard_testing::WholeTable;

std::unique_ptr<Shard> MakeShard(const JobConfig& config, int apply_threads, size_t parallel_values,
                                 size_t range_values) {
  ShardOptions options;
  options.apply_threads = apply_threads;
  options.parallel_apply_values = parallel_values;
  options.parallel_apply_range_values = range_values;
  options.reject_nonfinite = false;
  auto shard = Shard::Create(config, options);
  CHECK_OK(shard.status());
  return *std::move(shard);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ShardPullRead, InRangesEqualsTheSerialReadBitwise) {
  const JobConfig config = TwoTableConfig("kind: ADAM", "kind: ADAM",
                                          "kind: UNIFORM low: -1 high: 1", /*num_workers=*/1);
  for (int threads : {1, 3}) {
    for (size_t range : {size_t{1024}, size_t{65536}}) {
      for (bool stream : {false, true}) {
        std::unique_ptr<Shard> shard = MakeShard(config, threads, /*parallel_values=*/1, range);
        // Blocks out of order, and the second block alone.
        const std::vector<float> serial = ReadBlocks(*shard, "w", {1, 0}, stream);
        EXPECT_EQ(shard->parallel_pulls(), 0u);
        const std::vector<float> ranged = ReadBlocksInPlace(*shard, "w", {1, 0}, stream);
        EXPECT_EQ(shard->parallel_pulls(), 1u);
        EXPECT_TRUE(SameBits(serial, ranged)) << threads << " threads, range " << range;
        EXPECT_TRUE(SameBits(ReadBlocks(*shard, "w", {1}), ReadBlocksInPlace(*shard, "w", {1})));
        EXPECT_EQ(shard->parallel_pulls(), 2u);
        StatsResponse stats;
        shard->FillStats(&stats);
        EXPECT_EQ(stats.pulls(), 4u);
      }
    }
  }
}

TEST(ShardPullRead, SmallPullsAndShardsWithoutApplyThreadsReadAsBefore) {
  const JobConfig config = TwoTableConfig("kind: SGD learning_rate: 0.1", "kind: ADAM",
                                          "kind: UNIFORM low: -1 high: 1", /*num_workers=*/1);
  // Under parallel_apply_values: read on the calling thread.
  std::unique_ptr<Shard> large_threshold = MakeShard(config, 3, 131073, 1024);
  const std::vector<float> whole = ReadBlocks(*large_threshold, "w", {0, 1});
  EXPECT_TRUE(SameBits(whole, ReadBlocksInPlace(*large_threshold, "w", {0, 1})));
  EXPECT_EQ(large_threshold->parallel_pulls(), 0u);
  // At it: in ranges.
  std::unique_ptr<Shard> at_threshold = MakeShard(config, 3, 131072, 1024);
  EXPECT_TRUE(SameBits(whole, ReadBlocksInPlace(*at_threshold, "w", {0, 1})));
  EXPECT_EQ(at_threshold->parallel_pulls(), 1u);
  // No apply threads.
  std::unique_ptr<Shard> no_threads = MakeShard(config, 0, 1, 1024);
  EXPECT_TRUE(SameBits(whole, ReadBlocksInPlace(*no_threads, "w", {0, 1})));
  EXPECT_EQ(no_threads->parallel_pulls(), 0u);
}

TEST(ShardPullRead, EachBlockReadInRangesIsOneVersionWhilePushesLand) {
  // SGD, learning rate 1, gradient 1, from 0: after k pushes every value is -k. While pushes
  // land (whole blocks, in ranges on the same threads), pulls read "w" in ranges of 1024
  // values: every value of a block is the same k, never part of a push.
  const JobConfig config =
      TwoTableConfig("kind: SGD learning_rate: 1", "kind: SGD learning_rate: 1",
                     "kind: CONSTANT value: 0", /*num_workers=*/1);
  std::unique_ptr<Shard> shard = MakeShard(config, 2, /*parallel_values=*/1, 1024);
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    const std::vector<float> ones(131072, 1.0f);
    for (uint64_t seq = 1; !stop.load(); ++seq) {
      PushTable table = WholeTable(*shard, ones);
      ASSERT_THAT(shard->Push(FirstWorkerPush(*shard, &table, seq)).status(), IsOk());
    }
  });
  auto join = absl::MakeCleanup([&] {  // also when an assertion returns early
    stop = true;
    pusher.join();
  });
  float last = 0.f;
  for (int round = 0; round < 200; ++round) {
    const std::vector<float> w = ReadBlocksInPlace(*shard, "w", {0, 1});
    for (size_t at : {size_t{0}, size_t{65536}}) {
      for (size_t i = at; i < at + 65536; i += 511) ASSERT_EQ(w[i], w[at]) << "value " << i;
      ASSERT_EQ(w[at + 65535], w[at]);
    }
    ASSERT_LE(w[0], last);  // a later read sees no fewer pushes
    last = w[0];
  }
  std::move(join).Invoke();
  EXPECT_EQ(shard->parallel_pulls(), 200u);
  EXPECT_LT(last, 0.f);
}

TEST(ShardPullRead, ASinkErrorReadsNothingAndCountsNoPull) {
  const JobConfig config = TwoTableConfig("kind: ADAM", "kind: ADAM",
                                          "kind: UNIFORM low: -1 high: 1", /*num_workers=*/1);
  std::unique_ptr<Shard> shard = MakeShard(config, 3, 1, 1024);
  std::vector<float> out(131072, 7.0f);
  const std::vector<uint32_t> blocks = {0, 1};
  const PullTable pull{"w", ENCODING_FLOAT32, blocks, {}};
  const absl::Status status = shard->ReadPull(
      {pull},
      [&](size_t, size_t part, size_t n, absl::FunctionRef<absl::Status(absl::Span<float>)> fill) {
        if (part == 1) return absl::ResourceExhaustedError("no room");
        return fill(absl::MakeSpan(out).subspan(0, n));
      },
      /*stream=*/false, /*in_place=*/true);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted));
  for (size_t i = 0; i < out.size(); i += 1000) ASSERT_EQ(out[i], 7.0f) << i;
  EXPECT_EQ(shard->parallel_pulls(), 0u);
  StatsResponse stats;
  shard->FillStats(&stats);
  EXPECT_EQ(stats.pulls(), 0u);
}

}  // namespace
}  // namespace ps::server
