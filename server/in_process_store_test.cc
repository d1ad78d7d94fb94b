#include "server/in_process_store.h"

#include <vector>

#include "common/config/config.h"
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

TEST(InProcessParameterStore, CentralizedOwnsEveryServersShardAndTrainsAsOneWorker) {
  auto store = InProcessParameterStore::CreateCentralized(Config(), {});
  ASSERT_THAT(store.status(), IsOk());
  std::vector<float> grad(200, 1.0f), w(200);
  common::PushBatch push;
  push.dense.push_back({"w", grad});
  common::PushOptions options;
  options.clock = 1;
  ASSERT_THAT((*store)->Push(push, options), IsOk());
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(w)});
  ASSERT_THAT((*store)->Pull(pull, {}), IsOk());
  // Blocks on both servers were updated once.
  EXPECT_FLOAT_EQ(w.front(), 0.5f);
  EXPECT_FLOAT_EQ(w.back(), 0.5f);
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

}  // namespace
}  // namespace ps::server
