// ParameterServer (server/parameter_server.h) started in this process on 127.0.0.1, port 0,
// driven by the real gRPC client: the lifecycle (Create/Start/RequestStop/Wait), the final
// checkpoint and the restore of the next server on the same data dir, and the refusals of
// Create and Wait.
#include "server/parameter_server.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/config/config.h"
#include "common/startup/cores.h"
#include "common/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "server/storage/checkpoint_store.h"
#include "tests/subprocess.h"
#include "worker/rpc/grpc_store.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;

constexpr char kConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 }
  tables {
    name: "w" kind: TABLE_KIND_DENSE shape: 300
    initializer { kind: UNIFORM low: -1 high: 1 seed: 3 }
    optimizer { kind: SGD learning_rate: 0.5 }
  }
  checkpoint { interval_s: 0 }
  security { plaintext: true }
)pb";

JobConfig Config() {
  absl::StatusOr<JobConfig> config = common::ParseJobConfigText(kConfig, "test");
  CHECK(config.ok()) << config.status();
  CHECK(common::ValidateJobConfig(*config).ok());
  return *config;
}

ParameterServerOptions Options(const std::string& data_dir) {
  ParameterServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.data_dir = data_dir;
  options.exit_when_done = false;
  return options;
}

std::unique_ptr<worker::GrpcParameterStore> Client(int port, uint64_t incarnation,
                                                   JobConfig config = Config(), int32_t id = 0,
                                                   uint32_t max_retries = 20) {
  config.mutable_cluster()->add_servers(absl::StrCat("127.0.0.1:", port));
  worker::GrpcStoreOptions options;
  options.worker_id = id;
  options.worker_incarnation = incarnation;
  options.max_retries = max_retries;
  auto store = worker::GrpcParameterStore::Create(config, options);
  CHECK(store.ok()) << store.status();
  CHECK((*store)->WaitForServers(absl::Seconds(30)).ok());
  return std::move(*store);
}

std::vector<float> PullW(worker::GrpcParameterStore* store) {
  std::vector<float> w(300);
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(w)});
  CHECK(store->Pull(pull, {}).ok());
  return w;
}

TEST(ParameterServer, AStopRequestedBeforeServingCancelsCreate) {
  StopRequest stop;
  stop.Request();  // a signal that came while the tables were being allocated
  ParameterServerOptions options = Options("");
  options.stop = &stop;
  EXPECT_THAT(ParameterServer::Create(Config(), options).status(),
              StatusIs(absl::StatusCode::kCancelled, ::testing::HasSubstr("cancelled")));
}

TEST(ParameterServer, AStopRequestedWhileServingStopsTheServer) {
  StopRequest stop;
  ParameterServerOptions options = Options("");
  options.stop = &stop;
  auto server = ParameterServer::Create(Config(), options);
  ASSERT_THAT(server.status(), IsOk());
  ASSERT_THAT((*server)->Start(), IsOk());
  std::thread signal_thread([&stop] { stop.Request(); });
  EXPECT_THAT((*server)->Wait(), IsOk());  // returns only once the stop reached the server
  signal_thread.join();
  server->reset();
  stop.Request();  // after the server is gone: nothing to stop, nothing touched
}

TEST(ParameterServer, ServesOnAFreePortAndRestoresItsFinalCheckpoint) {
  const std::string dir = testing::MakeTempDir("ps");
  std::vector<float> after_push;
  {
    auto server = ParameterServer::Create(Config(), Options(dir));
    ASSERT_THAT(server.status(), IsOk());
    ASSERT_THAT((*server)->Start(), IsOk());
    ASSERT_GT((*server)->port(), 0);
    auto client = Client((*server)->port(), 1);
    const std::vector<float> before = PullW(client.get());
    std::vector<float> grad(300, 1.0f);
    common::PushBatch push;
    push.dense.push_back({"w", grad});
    common::PushOptions push_options;
    push_options.clock = 1;
    ASSERT_THAT(client->Push(push, push_options), IsOk());
    after_push = PullW(client.get());
    EXPECT_FLOAT_EQ(after_push[7], before[7] - 0.5f);
    std::thread stopper([&] { (*server)->RequestStop(); });
    EXPECT_THAT((*server)->Wait(), IsOk());  // final checkpoint written
    stopper.join();
  }
  auto restored = ParameterServer::Create(Config(), Options(dir));
  ASSERT_THAT(restored.status(), IsOk());
  ASSERT_THAT((*restored)->Start(), IsOk());
  auto client = Client((*restored)->port(), 2);
  EXPECT_EQ(PullW(client.get()), after_push);
  (*restored)->RequestStop(/*final_checkpoint=*/false);
  EXPECT_THAT((*restored)->Wait(), IsOk());
}

// --restore=none in a data dir that holds checkpoints, then a restart with the default
// (latest) before the new run wrote one: the restart went back to the old run's model.
TEST(ParameterServer, ARestartAfterAFreshStartDoesNotGoBackToTheOldRun) {
  const std::string dir = testing::MakeTempDir("ps");
  std::vector<float> initial;
  auto run = [&](bool restore, bool push, bool final_checkpoint) {
    ParameterServerOptions options = Options(dir);
    options.restore = restore;
    auto server = ParameterServer::Create(Config(), options);
    ASSERT_THAT(server.status(), IsOk());
    ASSERT_THAT((*server)->Start(), IsOk());
    auto client = Client((*server)->port(), 1);
    const std::vector<float> w = PullW(client.get());
    if (initial.empty()) initial = w;
    EXPECT_EQ(w, initial);
    if (push) {
      std::vector<float> grad(300, 1.0f);
      common::PushBatch batch;
      batch.dense.push_back({"w", grad});
      ASSERT_THAT(client->Push(batch, {}), IsOk());
    }
    (*server)->RequestStop(final_checkpoint);
    EXPECT_THAT((*server)->Wait(), IsOk());
  };
  run(/*restore=*/true, /*push=*/true, /*final_checkpoint=*/true);     // the old run
  run(/*restore=*/false, /*push=*/false, /*final_checkpoint=*/false);  // killed, say
  run(/*restore=*/true, /*push=*/false, /*final_checkpoint=*/false);
}

// Found 2026-12-05 by a review: the store's retention ran when the server opened it, before
// the restore, so a start that lowered checkpoint.keep and restored an older id deleted that
// checkpoint first and failed with NOT_FOUND.
TEST(ParameterServer, LoweringKeepInTheStartThatRestoresAnOlderCheckpointKeepsIt) {
  const std::string dir = testing::MakeTempDir("ps");
  JobConfig config = Config();
  config.mutable_checkpoint()->set_keep(3);
  std::vector<std::vector<float>> saved;  // the table each run's final checkpoint holds
  for (int run = 0; run < 3; ++run) {
    auto server = ParameterServer::Create(config, Options(dir));
    ASSERT_THAT(server.status(), IsOk());
    ASSERT_THAT((*server)->Start(), IsOk());
    auto client = Client((*server)->port(), run + 1);
    std::vector<float> grad(300, 1.0f);
    common::PushBatch push;
    push.dense.push_back({"w", grad});
    ASSERT_THAT(client->Push(push, {}), IsOk());
    saved.push_back(PullW(client.get()));
    (*server)->RequestStop(/*final_checkpoint=*/true);
    ASSERT_THAT((*server)->Wait(), IsOk());
  }
  std::vector<uint64_t> ids;
  {
    storage::CheckpointStoreOptions options;
    options.path = dir;
    options.keep = 100;
    auto store = storage::CheckpointStore::Open(options);
    ASSERT_THAT(store.status(), IsOk());
    auto all = (*store)->List();
    ASSERT_THAT(all.status(), IsOk());
    for (const storage::CheckpointInfo& c : *all) ids.push_back(c.id);
  }
  ASSERT_EQ(ids.size(), 3u);
  config.mutable_checkpoint()->set_keep(1);
  ParameterServerOptions options = Options(dir);
  options.restore_id = ids[0];
  auto server = ParameterServer::Create(config, options);
  ASSERT_THAT(server.status(), IsOk());
  ASSERT_THAT((*server)->Start(), IsOk());
  auto client = Client((*server)->port(), 4);
  EXPECT_EQ(PullW(client.get()), saved[0]);
  (*server)->RequestStop(/*final_checkpoint=*/false);
  EXPECT_THAT((*server)->Wait(), IsOk());
}

// A worker's own clock on a server restored from an older checkpoint lags what the worker has
// done; the worker's next pull at its real clock (an evaluation's, or the first of an epoch)
// must not wait for, or be refused for, a clock of its own that the server will never see
// pushed again. Two servers: server 1 is restored at clock 2 while server 0 stays up. Under
// SSP(1) four steps ahead the pull was refused (clock_ahead: no push can let it through);
// under BSP two steps ahead it waited for the worker itself until its deadline. Then the same
// for a restarted worker, which resumes at the clock server 0 remembers.
class RestoredClockTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(RestoredClockTest, AWorkerAheadOfARestoredServerIsNotHeldBackByItsOwnLostClock) {
  const auto [staleness, lag] = GetParam();
  JobConfig config = Config();
  config.mutable_cluster()->set_num_servers(2);
  config.mutable_cluster()->set_dense_block_floats(10);  // blocks of "w" on both servers
  config.mutable_training()->set_staleness(staleness);
  const std::string dir = testing::MakeTempDir("ps");
  auto start = [&](int index, int port) {
    ParameterServerOptions options = Options(absl::StrCat(dir, "/", index));
    options.server_index = index;
    options.port = port;
    auto server = ParameterServer::Create(config, options);
    if (!server.ok() || !(*server)->Start().ok()) {
      ADD_FAILURE() << "server " << index << " on port " << port << ": " << server.status();
      return std::unique_ptr<ParameterServer>();
    }
    return std::move(*server);
  };
  // Server 1's record of worker 0's clock (-1: none).
  auto clock_on_1 = [&](const std::unique_ptr<ParameterServer>& server) -> int64_t {
    std::optional<WorkerCheckpoint> w = server->shard()->workers().Get(0);
    return w.has_value() ? w->clock() : -1;
  };
  std::unique_ptr<ParameterServer> servers[2] = {start(0, 0), start(1, 0)};
  ASSERT_TRUE(servers[0] != nullptr && servers[1] != nullptr);
  const int port1 = servers[1]->port();
  JobConfig client_config = config;
  for (const auto& server : servers) {
    client_config.mutable_cluster()->add_servers(absl::StrCat("127.0.0.1:", server->port()));
  }
  auto connect = [&](uint64_t incarnation) {
    worker::GrpcStoreOptions options;
    options.worker_id = 0;
    options.worker_incarnation = incarnation;
    options.deadline = absl::Seconds(5);
    options.max_retries = 2;
    auto store = worker::GrpcParameterStore::Create(client_config, options);
    CHECK(store.ok()) << store.status();
    CHECK((*store)->WaitForServers(absl::Seconds(30)).ok());
    return std::move(*store);
  };
  std::unique_ptr<worker::GrpcParameterStore> client = connect(1);
  const common::Partitioner& layout = client->partitioner();
  for (uint32_t s = 0; s < 2; ++s) {
    ASSERT_FALSE(layout.BlocksOnServer(*layout.FindTable("w"), s).empty()) << "server " << s;
  }
  std::vector<float> w(300), grad(300, 1.0f);
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(w)});
  common::PushBatch push;
  push.dense.push_back({"w", grad});
  int64_t clock = 0;
  auto step = [&] {
    ASSERT_THAT(client->Pull(pull, {clock}), IsOk());
    ASSERT_THAT(client->Push(push, {clock + 1, false}), IsOk());
    ++clock;
  };
  // Server 1 dies after `lag` steps it never checkpointed, and comes back at clock 2.
  auto lose_steps = [&] {
    for (int i = 0; i < lag; ++i) ASSERT_NO_FATAL_FAILURE(step());
    servers[1]->RequestStop(/*final_checkpoint=*/false);
    ASSERT_THAT(servers[1]->Wait(), IsOk());
    servers[1].reset();  // lets go of its data dir
    servers[1] = start(1, port1);
    ASSERT_NE(servers[1], nullptr);
    ASSERT_THAT(client->WaitForServers(absl::Seconds(30)), IsOk());
    ASSERT_EQ(clock_on_1(servers[1]), 2);
  };
  // Two steps, then a clean stop of server 1: its final checkpoint holds worker 0 at clock 2.
  for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(step());
  servers[1]->RequestStop();
  ASSERT_THAT(servers[1]->Wait(), IsOk());
  servers[1].reset();
  servers[1] = start(1, port1);
  ASSERT_NE(servers[1], nullptr);
  ASSERT_THAT(client->WaitForServers(absl::Seconds(30)), IsOk());
  ASSERT_NO_FATAL_FAILURE(lose_steps());
  EXPECT_THAT(client->Pull(pull, {clock}), IsOk());
  EXPECT_EQ(clock_on_1(servers[1]), clock);
  ASSERT_NO_FATAL_FAILURE(step());
  // A restarted worker: it resumes at the clock server 0 remembers and pulls there first.
  ASSERT_NO_FATAL_FAILURE(lose_steps());
  client = connect(2);
  absl::StatusOr<common::WorkerPosition> resumed = client->ReportPosition(0, 0);
  ASSERT_THAT(resumed.status(), IsOk());
  EXPECT_EQ(resumed->clock, clock);
  EXPECT_THAT(client->Pull(pull, {clock}), IsOk());
  EXPECT_EQ(clock_on_1(servers[1]), clock);
  ASSERT_NO_FATAL_FAILURE(step());
  for (auto& server : servers) {
    server->RequestStop(/*final_checkpoint=*/false);
    EXPECT_THAT(server->Wait(), IsOk());
  }
}

INSTANTIATE_TEST_SUITE_P(Bounds, RestoredClockTest,
                         ::testing::Values(std::make_pair(1, 4), std::make_pair(0, 2)),
                         [](const auto& info) {
                           return info.param.first == 0 ? std::string("Bsp") : std::string("Ssp");
                         });

TEST(ParameterServer, WaitBeforeStartIsAFailedPrecondition) {
  auto server = ParameterServer::Create(Config(), Options(""));
  ASSERT_THAT(server.status(), IsOk());
  EXPECT_THAT((*server)->Wait(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(ParameterServer, RefusesAMemoryBudgetWithoutADataDir) {
  JobConfig config = Config();
  TableConfig* emb = config.add_tables();
  emb->set_name("emb");
  emb->set_kind(TABLE_KIND_SPARSE);
  emb->set_dim(4);
  emb->set_memory_budget_rows(10);
  EXPECT_THAT(ParameterServer::Create(config, Options("")).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("--data_dir")));
}

// A deterministic job's pushes wait on the pool for their turn, two per worker at most: a
// pool limit below that refused the pushes whose arrival worker 0's turn waits for, and the
// job stalled until turn_timeout.
TEST(ParameterServer, ADeterministicJobsPoolHoldsEveryWorkersPushes) {
  JobConfig config = Config();
  config.mutable_server()->set_max_pool_requests(64);
  config.mutable_cluster()->set_num_workers(70);
  EXPECT_EQ(PoolRequests(config), 64);  // asynchronous: as set
  config.mutable_training()->set_deterministic(true);
  EXPECT_EQ(PoolRequests(config), 142);
  config.mutable_server()->set_max_pool_requests(500);
  EXPECT_EQ(PoolRequests(config), 500);
}

// A server destroyed without Wait (its start failed after serving began) ends the
// deterministic pushes waiting on its pool for their turn at once (before 2026-12-06, found
// in review: its destructor waited for them until server.max_pull_wait_s, 600 s by default,
// so this test ran past its time limit).
TEST(ParameterServer, ADestroyedServerEndsThePushesWaitingForTheirTurn) {
  JobConfig config = Config();
  config.mutable_cluster()->set_num_workers(2);
  config.mutable_training()->set_deterministic(true);
  auto server = ParameterServer::Create(config, Options(testing::MakeTempDir("ps")));
  ASSERT_THAT(server.status(), IsOk());
  ASSERT_THAT((*server)->Start(), IsOk());
  auto client = Client((*server)->port(), 1, config, /*id=*/1, /*max_retries=*/0);
  std::vector<float> grad(300, 1.0f);
  common::PushBatch push;
  push.dense.push_back({"w", grad});
  absl::Notification pushed;
  std::thread pusher([&] {
    // Worker 1's push of clock 1 waits for worker 0's, which never comes.
    client->Push(push, {1, false}).IgnoreError();
    pushed.Notify();
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while ((*server)->shard()->workers().pushes_waiting_for_turn() == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ((*server)->shard()->workers().pushes_waiting_for_turn(), 1);
  server->reset();
  pusher.join();
  EXPECT_TRUE(pushed.HasBeenNotified());
}

TEST(ParameterServer, ServesTheDataPathOnOneThreadUnlessToldOtherwise) {
  JobConfig config = Config();
  config.mutable_cluster()->set_num_workers(4);
  EXPECT_EQ(DataThreads(config, 8), 1);  // the default
  config.mutable_server()->set_data_threads(3);  // a set value is kept
  EXPECT_EQ(DataThreads(config, 2), 3);
  // 0: one per worker, up to the cores.
  config.mutable_server()->set_data_threads(0);
  EXPECT_EQ(DataThreads(config, 8), 4);
  EXPECT_EQ(DataThreads(config, 2), 2);
  EXPECT_EQ(DataThreads(config, 0), 1);  // cores unknown
  config.mutable_cluster()->set_num_workers(1);
  EXPECT_EQ(DataThreads(config, 8), 1);
}

TEST(ParameterServer, AppliesOnEveryUsableCoreUnlessToldFewer) {
  auto server = ParameterServer::Create(Config(), Options(""));
  ASSERT_THAT(server.status(), IsOk());
  EXPECT_EQ((*server)->shard()->apply_threads(),
            static_cast<int>(std::max(1u, common::UsableCores())));
  for (uint32_t threads : {1u, 3u}) {
    JobConfig config = Config();
    config.mutable_server()->set_apply_threads(threads);
    server = ParameterServer::Create(config, Options(""));
    ASSERT_THAT(server.status(), IsOk());
    EXPECT_EQ((*server)->shard()->apply_threads(), static_cast<int>(threads));
  }
}

TEST(ParameterServer, RefusesPortsOutOfRange) {
  ParameterServerOptions options = Options("");
  options.port = 99999;
  EXPECT_THAT(ParameterServer::Create(Config(), options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  options.port = 0;
  options.metrics_port = 70000;
  EXPECT_THAT(ParameterServer::Create(Config(), options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ps::server
