// Calls through shared memory with a real ps_server process: a server that dies answers
// nothing through its channel and never closes it, so the worker must notice the process is
// gone and fail the call as UNAVAILABLE (retried like a call to a server that is down), not
// wait for the call's deadline.
#include <signal.h>

#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/status_matchers.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"
#include "worker/rpc/grpc_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::ps::testing::Subprocess;

// Two workers, BSP: worker 0's pull at clock 1, after its push of clock 1, waits (parked) for
// worker 1's, which never comes.
constexpr char kConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 2 }
  tables {
    name: "w"
    kind: TABLE_KIND_DENSE
    shape: 1000
    initializer { kind: ZEROS }
  }
  default_optimizer { kind: SGD learning_rate: 0.1 }
  training { staleness: 0 }
  checkpoint { interval_s: 0 }
  security { plaintext: true }
)pb";

TEST(SharedMemoryE2e, ACallWaitingInTheChannelOfAKilledServerFailsUnavailable) {
  const std::string dir = testing::MakeTempDir("shm-e2e");
  const std::string config_path = dir + "/job.textproto";
  std::ofstream(config_path) << kConfig;
  auto server = Subprocess::Start(
      {testing::RunfilePath("server/ps_server"), "--config=" + config_path, "--server_index=0",
       "--cluster_from=flags", "--host=127.0.0.1", "--port=0", "--port_file=" + dir + "/port",
       "--data_dir=" + dir + "/data", "--exit_when_done=false"},
      dir + "/server.log");
  ASSERT_THAT(server.status(), IsOk());
  auto port = testing::WaitForFileLine(dir + "/port", absl::Seconds(60), server->get());
  ASSERT_THAT(port.status(), IsOk());
  auto config = common::ParseJobConfigText(kConfig, "job");
  ASSERT_THAT(config.status(), IsOk());
  config->mutable_cluster()->add_servers(absl::StrCat("127.0.0.1:", *port));

  worker::GrpcStoreOptions options;
  options.worker_id = 0;
  options.worker_incarnation = 1;
  options.deadline = absl::Seconds(120);  // far beyond the test's own timeout
  options.max_retries = 0;
  options.shared_memory_bytes = 16 << 20;
  auto store = worker::GrpcParameterStore::Create(*config, options);
  ASSERT_THAT(store.status(), IsOk());
  ASSERT_THAT((*store)->WaitForServers(absl::Seconds(30)), IsOk());
  std::vector<float> w(1000);
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(w)});
  ASSERT_THAT((*store)->Pull(pull, common::PullOptions{0}), IsOk());  // asks for the segment
  const std::vector<float> grad(1000, 1.0f);
  common::PushBatch push;
  push.dense.push_back({"w", grad});
  ASSERT_THAT((*store)->Push(push, common::PushOptions{1, false}), IsOk());  // through the channel
  ASSERT_EQ((*store)->stats().calls_shared, 1u);

  // The pull waits in the channel (parked: worker 1 never pushed) or, if the kill comes first,
  // is posted into the channel of a dead server: either way nothing will answer it there, and
  // only the worker's check of the server process can end it before the deadline. No retry
  // (max_retries 0), so the status is the channel's own.
  absl::Status waited;
  std::thread puller([&] { waited = (*store)->Pull(pull, common::PullOptions{1}); });
  (*server)->Signal(SIGKILL);
  EXPECT_THAT((*server)->Wait(absl::Seconds(30)).status(), IsOk());
  puller.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_NE(waited.message().find("shared-memory channel is gone"), absl::string_view::npos)
      << waited;
}

}  // namespace
}  // namespace ps
