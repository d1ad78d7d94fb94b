// SIGTERM to a training ps_worker (centralized, synthetic CTR data, with and without
// prefetch): it finishes the steps it began, reports, logs its "done" record marked stopped and
// exits 0, instead of dying mid-step with signal 15 (before 2026-12-05: no Finish, pushes of
// the prefetch pipeline dropped, no final record).
#include <sys/wait.h>

#include <csignal>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/status_matchers.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::ps::testing::Subprocess;

// Far more steps than the test waits for: only a stop ends it in time.
constexpr char kConfig[] = R"pb(
  name: "worker-stop-test"
  cluster { num_servers: 1 num_workers: 1 }
  model { ctr { embedding_table: "ctr/embedding" embedding_dim: 4 combiner: SUM } }
  default_optimizer { kind: ADAGRAD learning_rate: 0.1 initial_accumulator: 0.1 }
  data {
    format: SYNTHETIC_CTR
    synthetic { num_train: 20000 num_test: 2000 num_fields: 4 vocabulary_per_field: 100 seed: 3 }
  }
  training {
    batch_size: 64 epochs: 100000 device: "cpu" seed: 1 progress_interval_s: 0.1
    eval_every_epochs: 0
  }
  security { plaintext: true }
)pb";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void StopsGracefully(bool prefetch) {
  const std::string dir = testing::MakeTempDir(prefetch ? "stop-prefetch" : "stop");
  const std::string config = dir + "/job.textproto";
  std::string text = kConfig;
  if (prefetch) text = absl::StrReplaceAll(text, {{"training {", "training { prefetch: true"}});
  std::ofstream(config) << text;
  const std::string log = dir + "/train.jsonl";
  auto p = Subprocess::Start({testing::RunfilePath("worker/ps_worker"), "--config=" + config,
                              "--centralized", "--log_path=" + log},
                             dir + "/worker.log");
  ASSERT_THAT(p.status(), IsOk());
  // Training runs once a throughput record is written.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (!absl::StrContains(ReadFile(log), "\"type\":\"throughput\"") && (*p)->running() &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE((*p)->running()) << (*p)->ReadLog();
  ASSERT_TRUE(absl::StrContains(ReadFile(log), "\"type\":\"throughput\"")) << (*p)->ReadLog();
  (*p)->Signal(SIGTERM);
  auto status = (*p)->Wait(absl::Seconds(60));
  ASSERT_THAT(status.status(), IsOk()) << (*p)->ReadLog();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "wait status " << *status << "\n"
      << (*p)->ReadLog();
  const std::string records = ReadFile(log);
  EXPECT_TRUE(absl::StrContains(records, "\"type\":\"done\"")) << records;
  EXPECT_TRUE(absl::StrContains(records, "\"stopped\":true")) << records;
  EXPECT_FALSE(absl::StrContains(records, "\"type\":\"eval\"")) << "evaluated after the stop";
  EXPECT_TRUE(absl::StrContains((*p)->ReadLog(), "stopped as asked")) << (*p)->ReadLog();
}

TEST(WorkerStop, SigtermFinishesTheStepsBegunAndExitsZero) { StopsGracefully(false); }

TEST(WorkerStop, SigtermDrainsThePrefetchPipelineAndExitsZero) { StopsGracefully(true); }

}  // namespace
}  // namespace ps
