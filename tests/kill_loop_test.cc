// Kill loop: a ps_server is SIGKILLed at random moments while a client pushes and asks for
// checkpoints, then restarted on the same data dir, for several cycles. Every push adds 1 to
// every value (SGD, lr 1, gradient -1, initial value 0), so a consistent state has every
// value equal to one integer k, and k is the number of pushes it holds. After each restart the
// restored state must be exactly a checkpoint's state: all values equal, equal to the update
// count of the checkpoint the server says it restored when that checkpoint was reported
// written, and never older than the newest checkpoint reported written. Never a mix.
#include <signal.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/rpc/credentials.h"
#include "common/status_matchers.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "tests/subprocess.h"
#include "worker/rpc/grpc_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::ps::testing::Subprocess;

constexpr char kConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 dense_block_floats: 65536 num_virtual_shards: 64 }
  tables {
    name: "w" kind: TABLE_KIND_DENSE shape: 2000000
    initializer { kind: ZEROS }
    optimizer { kind: SGD learning_rate: 1 }
  }
  tables {
    name: "emb" kind: TABLE_KIND_SPARSE dim: 8
    initializer { kind: ZEROS }
    optimizer { kind: SGD learning_rate: 1 }
  }
  checkpoint { interval_s: 0 on_shutdown: false }
  security { plaintext: true }
)pb";
constexpr int kW = 2000000;

TEST(KillLoop, RestoredStateIsAlwaysACompleteCheckpoint) {
  const std::string dir = testing::MakeTempDir("killloop");
  const std::string config_path = dir + "/job.textproto";
  std::ofstream(config_path) << kConfig;
  auto parsed = common::ParseJobConfigText(kConfig, "job");
  ASSERT_THAT(parsed.status(), IsOk());
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 100; ++k) keys.push_back(k * 7919);
  std::mt19937 rng(12345);
  std::map<uint64_t, uint64_t> reported;  // checkpoint id -> updates it holds
  int restores_checked = 0, checkpoints_in_flight_at_kill = 0;

  for (int cycle = 0; cycle < 6; ++cycle) {
    const std::string port_file = absl::StrCat(dir, "/port", cycle);
    auto server = Subprocess::Start(
        {testing::RunfilePath("server/ps_server"), "--config=" + config_path, "--server_index=0",
         "--host=127.0.0.1", "--port=0", "--port_file=" + port_file, "--data_dir=" + dir + "/data"},
        dir + "/server.log");
    ASSERT_THAT(server.status(), IsOk());
    auto port = testing::WaitForFileLine(port_file, absl::Seconds(60), server->get());
    ASSERT_THAT(port.status(), IsOk());
    JobConfig config = *parsed;
    config.mutable_cluster()->add_servers(absl::StrCat("127.0.0.1:", *port));
    worker::GrpcStoreOptions options;
    options.worker_id = 0;
    options.worker_incarnation = 1000 + cycle;
    options.max_retries = 0;
    options.deadline = absl::Seconds(20);
    auto store = *worker::GrpcParameterStore::Create(config, options);
    ASSERT_THAT(store->WaitForServers(absl::Seconds(30)), IsOk());
    auto stub = ParameterServer::NewStub(*common::MakeChannel(config.cluster().servers(0), config));

    // What was restored?
    ServerInfoResponse info;
    {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      ASSERT_TRUE(stub->ServerInfo(&context, ServerInfoRequest(), &info).ok());
    }
    std::vector<float> w(kW), rows(keys.size() * 8);
    common::PullBatch pull;
    pull.dense.push_back({"w", absl::MakeSpan(w)});
    pull.sparse.push_back({"emb", keys, absl::MakeSpan(rows)});
    ASSERT_THAT(store->Pull(pull, {}), IsOk());
    const float k = w[0];
    for (int i = 0; i < kW; ++i) ASSERT_EQ(w[i], k) << "torn state at w[" << i << "], cycle " << cycle;
    for (float v : rows) ASSERT_EQ(v, k) << "torn state in emb, cycle " << cycle;
    if (!reported.empty()) {
      const uint64_t newest = reported.rbegin()->first;
      ASSERT_GE(info.restored_checkpoint_id(), newest) << "an older checkpoint was restored";
      EXPECT_GE(k, reported.rbegin()->second);
      if (auto it = reported.find(info.restored_checkpoint_id()); it != reported.end()) {
        EXPECT_EQ(k, static_cast<float>(it->second))
            << "checkpoint " << it->first << " was reported with " << it->second << " updates";
      }
      ++restores_checked;
    } else if (info.restored_checkpoint_id() == 0) {
      EXPECT_EQ(k, 0.0f) << "nothing restored, yet the state is not the initial one";
    }
    // Else a checkpoint finished on the server but its reply was lost to the kill: the
    // state is one checkpoint's (checked above), whose count no reply told us.

    // Push and checkpoint concurrently until the kill.
    std::atomic<bool> stop{false};
    std::atomic<int> in_flight{0};
    absl::Mutex mu;
    std::thread pusher([&] {
      std::vector<float> g(kW, -1.0f), grows(keys.size() * 8, -1.0f);
      for (int64_t clock = 1; !stop; ++clock) {
        common::PushBatch push;
        push.dense.push_back({"w", g});
        push.sparse.push_back({"emb", keys, grows});
        if (!store->Push(push, {clock, false}).ok()) break;
      }
    });
    std::thread checkpointer([&] {
      std::mt19937 local(cycle);
      while (!stop) {
        absl::SleepFor(absl::Milliseconds(50 + local() % 200));
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
        CheckpointResponse r;
        ++in_flight;
        const bool ok = stub->Checkpoint(&context, CheckpointRequest(), &r).ok();
        --in_flight;
        if (!ok) break;
        absl::MutexLock lock(&mu);
        reported[r.checkpoint_id()] = r.updates_applied();
      }
    });
    absl::SleepFor(absl::Milliseconds(400 + rng() % 1600));
    checkpoints_in_flight_at_kill += in_flight.load();
    (*server)->Signal(SIGKILL);
    ASSERT_THAT((*server)->Wait(absl::Seconds(10)).status(), IsOk());
    stop = true;
    pusher.join();
    checkpointer.join();
    ASSERT_FALSE(reported.empty() && cycle > 1) << "no checkpoint was ever reported";
  }
  EXPECT_GE(restores_checked, 4);
  std::cout << "kill loop: " << restores_checked << " restores checked, " << reported.size()
            << " checkpoints reported, " << checkpoints_in_flight_at_kill
            << " kills landed while a checkpoint was being written\n";
}

}  // namespace
}  // namespace ps
