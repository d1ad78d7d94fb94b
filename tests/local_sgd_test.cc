// Local SGD (worker/local_sgd_store.h) against the real shard core: what the servers end up
// holding, how often the worker talks to them, and what it refuses.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/in_process_store.h"
#include "server/shard.h"
#include "worker/local_sgd_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::testing::FloatNear;
using ::testing::Pointwise;

constexpr int kDense = 6;
constexpr int kDim = 2;

JobConfig Config(const std::string& optimizer, int workers, const std::string& merge) {
  const std::string text =
      absl::StrCat("cluster { num_servers: 1 num_workers: ", workers, " }\n",
                   "tables { name: \"w\" kind: TABLE_KIND_DENSE shape: ", kDense,
                   " initializer { kind: CONSTANT value: 0.5 } optimizer { ", optimizer, " } }\n",
                   "tables { name: \"e\" kind: TABLE_KIND_SPARSE dim: ", kDim,
                   " initializer { kind: CONSTANT value: -0.25 } optimizer { ", optimizer, " } }\n",
                   "training { local_sgd { steps: 4 merge: ", merge, " } }\n");
  auto config = common::ParseJobConfigText(text, "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::vector<TableConfig> Tables(const JobConfig& config) {
  return {config.tables().begin(), config.tables().end()};
}

std::unique_ptr<server::InProcessParameterStore> Store(server::Shard* shard, int worker) {
  server::InProcessStoreOptions options;
  options.worker_id = worker;
  options.worker_incarnation = 1;
  return *server::InProcessParameterStore::Create({shard}, options);
}

// A gradient that changes with the step and the worker.
std::vector<float> Gradient(int step, int worker, int n) {
  std::vector<float> g(n);
  for (int i = 0; i < n; ++i) g[i] = 0.1f * std::sin(1.0f + step * 0.7f + i + worker * 3.1f);
  return g;
}

// One training step: pull w and rows {1, 2, 3}, push gradients for w and rows {1, 2}.
absl::Status TrainStep(common::ParameterStore* store, int step, int worker) {
  std::vector<float> w(kDense), rows(3 * kDim);
  const std::vector<uint64_t> keys = {1, 2, 3};
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(w)});
  pull.sparse.push_back({"e", keys, absl::MakeSpan(rows)});
  RETURN_IF_ERROR(store->Pull(pull, {step}));
  const std::vector<float> gw = Gradient(step, worker, kDense);
  const std::vector<float> ge = Gradient(step + 100, worker, 2 * kDim);
  const std::vector<uint64_t> pushed = {1, 2};
  common::PushBatch push;
  push.dense.push_back({"w", gw});
  push.sparse.push_back({"e", pushed, ge});
  return store->Push(push, {step + 1, false});
}

// What the servers hold: w and rows 1, 2, 3 (read without a worker identity).
std::vector<float> ServerState(server::Shard* shard) {
  auto reader = Store(shard, -1);
  std::vector<float> w(kDense), rows(3 * kDim);
  const std::vector<uint64_t> keys = {1, 2, 3};
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(w)});
  pull.sparse.push_back({"e", keys, absl::MakeSpan(rows)});
  EXPECT_THAT(reader->Pull(pull, {0}), IsOk());
  w.insert(w.end(), rows.begin(), rows.end());
  return w;
}

// With one worker and SUM, local SGD is plain training whatever k is: the local copy is what
// the server would hold. Adam checks that the optimizer's slots carry over between periods.
TEST(LocalSgd, OneWorkerEndsWhereGradientPushesEnd) {
  for (const std::string optimizer :
       {"kind: SGD learning_rate: 0.5", "kind: ADAM learning_rate: 0.05"}) {
    SCOPED_TRACE(optimizer);
    const JobConfig config = Config(optimizer, 1, "SUM");
    auto reference = *server::Shard::Create(config, server::ShardOptions{});
    auto local = *server::Shard::Create(config, server::ShardOptions{});
    auto direct = Store(reference.get(), 0);
    auto remote = Store(local.get(), 0);
    auto store = *worker::LocalSgdStore::Create(remote.get(), Tables(config), 4);
    for (int step = 0; step < 12; ++step) {
      ASSERT_THAT(TrainStep(direct.get(), step, 0), IsOk());
      ASSERT_THAT(TrainStep(store.get(), step, 0), IsOk());
    }
    EXPECT_THAT(ServerState(local.get()), Pointwise(FloatNear(1e-5), ServerState(reference.get())));
    // 12 steps, k = 4: three merges, each one push to the server and one period's pull.
    EXPECT_EQ(local->updates_applied(), 3u);
    EXPECT_EQ(reference->updates_applied(), 12u);
    EXPECT_EQ(store->stats().merges, 3u);
    EXPECT_EQ(store->stats().remote_pulls, 3u);
    EXPECT_EQ(store->stats().local_steps, 12u);
  }
}

// AVERAGE: the server adds each worker's delta / num_workers (model averaging). Row 3 is
// pulled but never pushed: it is not sent, and stays as initialized.
TEST(LocalSgd, TwoWorkersAverageTheirDeltas) {
  const JobConfig config = Config("kind: SGD learning_rate: 0.5", 2, "AVERAGE");
  auto shard = *server::Shard::Create(config, server::ShardOptions{});
  const std::vector<float> start = ServerState(shard.get());
  std::vector<std::vector<float>> deltas;
  for (int worker = 0; worker < 2; ++worker) {
    // Each worker's own trajectory over 4 steps, computed on a private shard.
    auto own = *server::Shard::Create(Config("kind: SGD learning_rate: 0.5", 1, "SUM"),
                                      server::ShardOptions{});
    auto own_store = Store(own.get(), 0);
    for (int step = 0; step < 4; ++step)
      ASSERT_THAT(TrainStep(own_store.get(), step, worker), IsOk());
    std::vector<float> end = ServerState(own.get()), delta(end.size());
    for (size_t i = 0; i < end.size(); ++i) delta[i] = end[i] - start[i];
    deltas.push_back(delta);
  }
  auto remote0 = Store(shard.get(), 0), remote1 = Store(shard.get(), 1);
  auto store0 = *worker::LocalSgdStore::Create(remote0.get(), Tables(config), 4);
  auto store1 = *worker::LocalSgdStore::Create(remote1.get(), Tables(config), 4);
  for (int step = 0; step < 4; ++step) {
    ASSERT_THAT(TrainStep(store0.get(), step, 0), IsOk());
    ASSERT_THAT(TrainStep(store1.get(), step, 1), IsOk());
  }
  std::vector<float> expected(start.size());
  for (size_t i = 0; i < start.size(); ++i) {
    expected[i] = start[i] + (deltas[0][i] + deltas[1][i]) / 2;
  }
  const std::vector<float> got = ServerState(shard.get());
  EXPECT_THAT(got, Pointwise(FloatNear(1e-5), expected));
  EXPECT_FLOAT_EQ(got[kDense + 2 * kDim], -0.25f);  // row 3: pulled, never pushed
  EXPECT_EQ(shard->updates_applied(), 2u);
}

TEST(LocalSgd, FinishMergesAnUnfinishedPeriod) {
  const JobConfig config = Config("kind: SGD learning_rate: 0.5", 1, "SUM");
  auto reference = *server::Shard::Create(config, server::ShardOptions{});
  auto local = *server::Shard::Create(config, server::ShardOptions{});
  auto direct = Store(reference.get(), 0);
  auto remote = Store(local.get(), 0);
  auto store = *worker::LocalSgdStore::Create(remote.get(), Tables(config), 4);
  for (int step = 0; step < 6; ++step) {
    ASSERT_THAT(TrainStep(direct.get(), step, 0), IsOk());
    ASSERT_THAT(TrainStep(store.get(), step, 0), IsOk());
  }
  EXPECT_EQ(local->updates_applied(), 1u);
  ASSERT_THAT(store->Finish(), IsOk());
  EXPECT_EQ(local->updates_applied(), 2u);
  EXPECT_THAT(ServerState(local.get()), Pointwise(FloatNear(1e-5), ServerState(reference.get())));
}

// A remote store whose pushes are applied and then answered UNAVAILABLE while `fail` is set:
// a push whose answer was lost.
class LostAnswers final : public common::ParameterStore {
 public:
  explicit LostAnswers(common::ParameterStore* store) : store_(store) {}
  absl::Status Pull(const common::PullBatch& b, const common::PullOptions& o) override {
    return store_->Pull(b, o);
  }
  absl::Status Push(const common::PushBatch& b, const common::PushOptions& o) override {
    RETURN_IF_ERROR(store_->Push(b, o));
    if (fail) return absl::UnavailableError("the answer was lost");
    return absl::OkStatus();
  }
  absl::Status Finish() override { return store_->Finish(); }
  absl::StatusOr<common::WorkerPosition> ReportPosition(uint32_t epoch, uint64_t offset) override {
    return store_->ReportPosition(epoch, offset);
  }
  bool fail = false;

 private:
  common::ParameterStore* const store_;
};

// A merge that failed is of unknown fate: the period is not sent again (it was before
// 2026-12-05, by the next merge or Finish, and servers that had applied it applied it twice);
// every later push, merge and finish is FAILED_PRECONDITION and changes nothing.
TEST(LocalSgd, AFailedMergeIsNeverSentAgain) {
  const JobConfig config = Config("kind: SGD learning_rate: 0.5", 1, "SUM");
  auto shard = *server::Shard::Create(config, server::ShardOptions{});
  auto direct = Store(shard.get(), 0);
  LostAnswers remote(direct.get());
  auto store = *worker::LocalSgdStore::Create(&remote, Tables(config), 4);
  for (int step = 0; step < 3; ++step) ASSERT_THAT(TrainStep(store.get(), step, 0), IsOk());
  remote.fail = true;
  EXPECT_THAT(TrainStep(store.get(), 3, 0), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(shard->updates_applied(), 1u);  // applied, its answer lost
  const std::vector<float> after_merge = ServerState(shard.get());
  remote.fail = false;
  EXPECT_THAT(store->Finish(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(TrainStep(store.get(), 4, 0), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(shard->updates_applied(), 1u);
  EXPECT_EQ(ServerState(shard.get()), after_merge);
}

TEST(LocalSgd, BadInputIsRefusedAndChangesNothing) {
  const JobConfig config = Config("kind: SGD learning_rate: 0.5", 1, "SUM");
  auto shard = *server::Shard::Create(config, server::ShardOptions{});
  auto remote = Store(shard.get(), 0);
  EXPECT_THAT(worker::LocalSgdStore::Create(remote.get(), Tables(config), 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto store = *worker::LocalSgdStore::Create(remote.get(), Tables(config), 2);

  std::vector<float> g(kDense, 0.1f);
  common::PushBatch push;
  push.dense.push_back({"w", g});
  EXPECT_THAT(store->Push(push, {1, false}), StatusIs(absl::StatusCode::kFailedPrecondition));

  std::vector<float> w(kDense);
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(w)});
  ASSERT_THAT(store->Pull(pull, {0}), IsOk());
  const std::vector<float> before = w;

  std::vector<float> nan = g;
  nan[3] = std::numeric_limits<float>::quiet_NaN();
  common::PushBatch bad;
  bad.dense.push_back({"w", nan});
  EXPECT_THAT(store->Push(bad, {1, false}), StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<float> short_g(kDense - 1, 0.1f);
  common::PushBatch wrong_size;
  wrong_size.dense.push_back({"w", short_g});
  EXPECT_THAT(store->Push(wrong_size, {1, false}), StatusIs(absl::StatusCode::kInvalidArgument));
  common::PushBatch unknown;
  unknown.dense.push_back({"nope", g});
  EXPECT_THAT(store->Push(unknown, {1, false}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store->Push(push, {1, true}), StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<uint64_t> keys = {7};
  std::vector<float> row(kDim, 0.1f);
  common::PushBatch unpulled_row;
  unpulled_row.sparse.push_back({"e", keys, row});
  EXPECT_THAT(store->Push(unpulled_row, {1, false}),
              StatusIs(absl::StatusCode::kFailedPrecondition));

  ASSERT_THAT(store->Pull(pull, {0}), IsOk());
  EXPECT_EQ(w, before);  // nothing was applied locally
  EXPECT_EQ(store->stats().local_steps, 0u);
  EXPECT_EQ(shard->updates_applied(), 0u);
}

}  // namespace
}  // namespace ps
