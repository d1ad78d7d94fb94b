// A ParameterServer serving its data path on two threads (server.data_threads), with two
// workers calling at once over real sockets: every push is applied exactly once, and each
// worker's pull sees at least its own pushes. Run under ThreadSanitizer by
// tools/sanitize.sh: the calls of the two workers are served on both threads concurrently.
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/parameter_server.h"
#include "worker/rpc/grpc_store.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;

constexpr int kShape = 300;
constexpr int kSteps = 200;

JobConfig Config() {
  absl::StatusOr<JobConfig> config = common::ParseJobConfigText(R"pb(
    cluster { num_servers: 1 num_workers: 2 }
    server { data_threads: 2 }
    tables {
      name: "w" kind: TABLE_KIND_DENSE shape: 300
      initializer { kind: ZEROS }
      optimizer { kind: SGD learning_rate: 0.5 }
    }
    checkpoint { interval_s: 0 }
    security { plaintext: true }
  )pb", "test");
  CHECK(config.ok()) << config.status();
  CHECK(common::ValidateJobConfig(*config).ok());
  return *config;
}

TEST(DataThreads, TwoWorkersAtOnceHaveEveryPushAppliedExactlyOnce) {
  ParameterServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.exit_when_done = false;
  auto server = ParameterServer::Create(Config(), options);
  ASSERT_THAT(server.status(), IsOk());
  ASSERT_THAT((*server)->Start(), IsOk());

  auto worker = [&](int id) {
    JobConfig config = Config();
    config.mutable_cluster()->add_servers(absl::StrCat("127.0.0.1:", (*server)->port()));
    worker::GrpcStoreOptions store_options;
    store_options.worker_id = id;
    store_options.worker_incarnation = 1;
    auto store = worker::GrpcParameterStore::Create(config, store_options);
    ASSERT_THAT(store.status(), IsOk());
    ASSERT_THAT((*store)->WaitForServers(absl::Seconds(30)), IsOk());
    std::vector<float> w(kShape), g(kShape, 1.0f);
    for (int c = 0; c < kSteps; ++c) {
      common::PushBatch push;
      push.dense.push_back({"w", g});
      common::PullBatch pull;
      pull.dense.push_back({"w", absl::MakeSpan(w)});
      ASSERT_THAT((*store)->PushPull(push, {c + 1, false}, pull, {c + 1}), IsOk());
      // Its own c + 1 pushes at least (each takes 0.5 off), at most both workers' so far.
      ASSERT_LE(w[0], -0.5f * (c + 1)) << "worker " << id << " step " << c;
      ASSERT_GE(w[kShape - 1], -0.5f * 2 * kSteps);
    }
    ASSERT_THAT((*store)->Finish(), IsOk());
  };
  std::thread first(worker, 0), second(worker, 1);
  first.join();
  second.join();

  JobConfig config = Config();
  config.mutable_cluster()->add_servers(absl::StrCat("127.0.0.1:", (*server)->port()));
  worker::GrpcStoreOptions reader_options;
  reader_options.worker_id = 0;
  reader_options.worker_incarnation = 2;
  auto reader = worker::GrpcParameterStore::Create(config, reader_options);
  ASSERT_THAT(reader.status(), IsOk());
  std::vector<float> w(kShape);
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(w)});
  ASSERT_THAT((*reader)->Pull(pull, {}), IsOk());
  // 2 workers x 200 pushes of 1.0 at learning rate 0.5, each applied once (exact in float).
  EXPECT_THAT(w, ::testing::Each(-0.5f * 2 * kSteps));

  (*server)->RequestStop(/*final_checkpoint=*/false);
  EXPECT_THAT((*server)->Wait(), IsOk());
}

}  // namespace
}  // namespace ps::server
