#include "server/in_process_store.h"

#include <vector>

#include "common/config/config.h"
#include "common/startup/cores.h"
#include "common/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;

constexpr char kConfig[] = R"pb(
  cluster { num_servers: 2 num_workers: 4 dense_block_floats: 64 }
  tables {
    name: "w" kind: TABLE_KIND_DENSE shape: 200
    initializer { kind: CONSTANT value: 1 }
    optimizer { kind: SGD learning_rate: 0.5 }
  }
  security { plaintext: true }
)pb";

JobConfig Config() {
  absl::StatusOr<JobConfig> config = common::ParseJobConfigText(kConfig, "test");
  CHECK(config.ok()) << config.status();
  return *config;
}

// Pushes a gradient of ones into "w" at clock 1, then pulls it back (empty on an error).
std::vector<float> PushOnesThenPull(InProcessParameterStore& store) {
  std::vector<float> grad(200, 1.0f), w(200);
  common::PushBatch push;
  push.dense.push_back({"w", grad});
  common::PushOptions options;
  options.clock = 1;
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(w)});
  const absl::Status pushed = store.Push(push, options);
  const absl::Status pulled = pushed.ok() ? store.Pull(pull, {}) : pushed;
  EXPECT_THAT(pulled, IsOk());
  if (!pulled.ok()) w.clear();
  return w;
}

TEST(InProcessParameterStore, CentralizedOwnsEveryServersShardAndTrainsAsOneWorker) {
  auto store = InProcessParameterStore::CreateCentralized(Config(), {});
  ASSERT_THAT(store.status(), IsOk());
  // Blocks on both servers were updated once.
  EXPECT_THAT(PushOnesThenPull(**store), ::testing::Each(0.5f));
}

TEST(InProcessParameterStore, RemembersTheWorkersPositionForAResume) {
  auto store = InProcessParameterStore::CreateCentralized(Config(), {});
  ASSERT_THAT(store.status(), IsOk());
  auto fresh = (*store)->ReportPosition(0, 0);
  ASSERT_THAT(fresh.status(), IsOk());
  EXPECT_EQ(fresh->epoch, 0u);
  EXPECT_EQ(fresh->offset, 0u);
  ASSERT_THAT((*store)->ReportPosition(2, 640).status(), IsOk());
  auto saved = (*store)->ReportPosition(0, 0);  // says nothing new, reads back
  ASSERT_THAT(saved.status(), IsOk());
  EXPECT_EQ(saved->epoch, 2u);
  EXPECT_EQ(saved->offset, 640u);
}

TEST(CentralizedShardOptions, FollowTheConfigAndTheCoresAsAServerWould) {
  JobConfig config = Config();
  ShardOptions options = CentralizedShardOptions(config, 1);
  EXPECT_EQ(options.server_index, 1u);
  EXPECT_TRUE(options.reject_nonfinite);
  EXPECT_EQ(options.parallel_apply_values, ParallelApplyValues(config, common::UsableCores()));
  EXPECT_EQ(options.apply_threads, static_cast<int>(std::max(1u, common::UsableCores())) - 1);
  config.mutable_server()->set_parallel_apply_min_values(64);
  config.mutable_server()->set_apply_threads(3);
  config.mutable_server()->set_reject_nonfinite(false);
  options = CentralizedShardOptions(config, 0);
  EXPECT_EQ(options.parallel_apply_values, 64u);
  EXPECT_EQ(options.apply_threads, 2);  // helpers: the calling thread is the third
  EXPECT_FALSE(options.reject_nonfinite);
}

// Centralized shards built with these options apply a push of the threshold's size on their
// apply threads, with the serial result. (Not refusing non-finite values keeps this SGD push
// off the one-pass update, which small SGD pushes take whatever the threshold.)
TEST(CentralizedShardOptions, PushesFromTheThresholdAreAppliedInParallel) {
  if (common::UsableCores() < 2) GTEST_SKIP() << "one usable core: no apply threads";
  for (uint64_t threshold : {uint64_t{64}, uint64_t{1} << 20}) {
    JobConfig config = Config();
    config.mutable_cluster()->set_num_workers(1);
    config.mutable_server()->set_parallel_apply_min_values(threshold);
    config.mutable_server()->set_reject_nonfinite(false);
    std::vector<std::unique_ptr<Shard>> owned;
    std::vector<Shard*> shards;
    for (uint32_t s = 0; s < 2; ++s) {
      auto shard = Shard::Create(config, CentralizedShardOptions(config, s));
      ASSERT_THAT(shard.status(), IsOk());
      shards.push_back(shard->get());
      owned.push_back(*std::move(shard));
    }
    auto store = InProcessParameterStore::Create(shards, {});
    ASSERT_THAT(store.status(), IsOk());
    EXPECT_THAT(PushOnesThenPull(**store), ::testing::Each(0.5f)) << threshold;
    // Blocks 0, 2 (128 values) on server 0; 1, 3 (72) on server 1: both at least 64.
    for (const Shard* shard : shards) {
      EXPECT_EQ(shard->parallel_pushes(), threshold == 64 ? 1u : 0u) << threshold;
    }
  }
}

}  // namespace
}  // namespace ps::server
