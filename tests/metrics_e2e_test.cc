// End to end: a ps_server and a ps_worker (synthetic CTR, so no dataset is needed) serve
// /metrics on free ports of 127.0.0.1. Both answers parse as Prometheus text, and the values
// move while the worker trains: the worker's steps, the server's updates applied and its
// push latency count. The server keeps serving its metrics after the worker is gone, until
// SIGTERM stops it cleanly.
#include <sys/wait.h>

#include <csignal>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics/testing.h"
#include "common/status_matchers.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::ps::common::metrics::testing::HttpGet;
using ::ps::common::metrics::testing::ParsedText;
using ::ps::common::metrics::testing::ParseText;
using ::ps::testing::Subprocess;

// Scrapes /metrics until `done` holds for what came back (or `timeout` passes), checking
// that every answer is a 200 with valid text. Returns the last parse.
absl::StatusOr<ParsedText> ScrapeUntil(int port, Subprocess* process,
                                       const std::function<bool(const ParsedText&)>& done,
                                       absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    auto response = HttpGet(port, "/metrics");
    if (!response.ok()) return response.status();
    if (response->status != 200) {
      return absl::InternalError(absl::StrCat("status ", response->status));
    }
    if (response->headers["content-type"] != "text/plain; version=0.0.4; charset=utf-8") {
      return absl::InternalError("content type " + response->headers["content-type"]);
    }
    auto parsed = ParseText(response->body);
    if (!parsed.ok()) return parsed.status();
    if (done(*parsed)) return parsed;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the values did not move; last scrape:\n", response->body));
    }
    if (process != nullptr && !process->running()) {
      return absl::FailedPreconditionError("the process exited:\n" + process->ReadLog());
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

int PortFrom(const std::string& path, Subprocess* process) {
  auto line = testing::WaitForFileLine(path, absl::Seconds(60), process);
  EXPECT_THAT(line.status(), IsOk());
  int port = 0;
  EXPECT_TRUE(line.ok() && absl::SimpleAtoi(*line, &port)) << path;
  return port;
}

TEST(MetricsE2e, ServerAndWorkerMetricsMoveWhileTraining) {
  const std::string dir = testing::MakeTempDir("metrics");
  const std::string config = testing::RunfilePath("configs/ctr_synthetic_2x2.textproto");
  // A small data set and many epochs: the worker trains until the test stops it.
  const std::string overrides =
      "--set=cluster.num_servers=1,cluster.num_workers=1,training.epochs=1000,"
      "data.synthetic.num_train=20000,data.synthetic.num_test=1000,training.device=cpu,"
      "metrics.host=127.0.0.1";
  auto server = Subprocess::Start(
      {testing::RunfilePath("server/ps_server"), "--config=" + config, overrides,
       "--server_index=0", "--host=127.0.0.1", "--port=0", "--port_file=" + dir + "/port",
       "--data_dir=" + dir + "/data", "--checkpoint_interval=1", "--metrics_port=0",
       "--metrics_port_file=" + dir + "/server_metrics_port"},
      dir + "/server.log");
  ASSERT_THAT(server.status(), IsOk());
  const int port = PortFrom(dir + "/port", server->get());
  const int server_metrics = PortFrom(dir + "/server_metrics_port", server->get());
  ASSERT_GT(port, 0);
  ASSERT_GT(server_metrics, 0);

  auto health = HttpGet(server_metrics, "/healthz");
  ASSERT_THAT(health.status(), IsOk());
  EXPECT_EQ(health->status, 200);
  auto missing = HttpGet(server_metrics, "/nothing");
  ASSERT_THAT(missing.status(), IsOk());
  EXPECT_EQ(missing->status, 404);

  auto worker = Subprocess::Start(
      {testing::RunfilePath("worker/ps_worker"), "--config=" + config, overrides,
       "--worker_index=0", absl::StrCat("--servers=127.0.0.1:", port), "--eval=never",
       "--metrics_port=0", "--metrics_port_file=" + dir + "/worker_metrics_port"},
      dir + "/worker.log");
  ASSERT_THAT(worker.status(), IsOk());
  const int worker_metrics = PortFrom(dir + "/worker_metrics_port", worker->get());
  ASSERT_GT(worker_metrics, 0);

  // Training has begun on both sides.
  auto w1 = ScrapeUntil(
      worker_metrics, worker->get(),
      [](const ParsedText& m) { return m.Get("ps_worker_steps_total").value_or(0) >= 1; },
      absl::Minutes(2));
  ASSERT_THAT(w1.status(), IsOk());
  auto s1 = ScrapeUntil(
      server_metrics, server->get(),
      [](const ParsedText& m) {
        return m.Get("ps_server_updates_applied_total").value_or(0) >= 1 &&
               m.Get("ps_server_push_latency_seconds_count").value_or(0) > 0;
      },
      absl::Minutes(1));
  ASSERT_THAT(s1.status(), IsOk());
  EXPECT_EQ(s1->Get("ps_server_up"), 1);
  EXPECT_EQ(s1->types.at("ps_server_push_latency_seconds"), "histogram");
  EXPECT_GT(s1->Get("ps_server_table_rows", {{"table", "ctr/embedding"}, {"kind", "sparse"}})
                .value_or(0),
            0);
  EXPECT_GT(s1->Sum("ps_server_request_bytes_total", {{"method", "push"}}), 0);
  EXPECT_GT(s1->Get("process_resident_memory_bytes").value_or(0), 0);
  EXPECT_EQ(w1->Get("ps_worker_info", {{"worker_index", "0"}, {"mode", "distributed"}}), 1);
  EXPECT_GT(w1->Get("ps_worker_step_phase_seconds_count", {{"phase", "push"}}).value_or(0), 0);

  // And it moves.
  const double steps = *w1->Get("ps_worker_steps_total");
  const double updates = *s1->Get("ps_server_updates_applied_total");
  const double pushes_timed = *s1->Get("ps_server_push_latency_seconds_count");
  auto w2 = ScrapeUntil(
      worker_metrics, worker->get(),
      [steps](const ParsedText& m) { return m.Get("ps_worker_steps_total").value_or(0) > steps; },
      absl::Minutes(1));
  ASSERT_THAT(w2.status(), IsOk());
  EXPECT_GT(w2->Get("ps_worker_samples_total").value_or(0), 0);
  EXPECT_TRUE(w2->Get("ps_worker_loss").has_value());
  auto s2 = ScrapeUntil(
      server_metrics, server->get(),
      [&](const ParsedText& m) {
        return m.Get("ps_server_updates_applied_total").value_or(0) > updates &&
               m.Get("ps_server_push_latency_seconds_count").value_or(0) > pushes_timed &&
               m.Get("ps_server_checkpoints_written_total").value_or(0) >= 1;
      },
      absl::Minutes(1));
  ASSERT_THAT(s2.status(), IsOk());
  EXPECT_GE(s2->Get("ps_server_worker_clock", {{"worker", "0"}}).value_or(0), 1);
  EXPECT_TRUE(s2->Get("ps_server_last_checkpoint_age_seconds").has_value());

  // After training: the worker is gone; the server still answers, then stops cleanly.
  (*worker)->Signal(SIGKILL);
  ASSERT_THAT((*worker)->Wait(absl::Seconds(30)).status(), IsOk());
  auto s3 = ScrapeUntil(
      server_metrics, server->get(),
      [&](const ParsedText& m) {
        return m.Get("ps_server_updates_applied_total").value_or(0) >=
               *s2->Get("ps_server_updates_applied_total");
      },
      absl::Seconds(30));
  ASSERT_THAT(s3.status(), IsOk());
  (*server)->Signal(SIGTERM);
  auto status = (*server)->Wait(absl::Seconds(60));
  ASSERT_THAT(status.status(), IsOk());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << (*server)->ReadLog();
}

TEST(MetricsE2e, BusyMetricsPortFailsTheServerAtStart) {
  const std::string dir = testing::MakeTempDir("metrics_busy");
  const std::string config = testing::RunfilePath("configs/ctr_synthetic_2x2.textproto");
  const std::string overrides = "--set=cluster.num_servers=1,cluster.num_workers=1";
  auto first = Subprocess::Start(
      {testing::RunfilePath("server/ps_server"), "--config=" + config, overrides,
       "--server_index=0", "--host=127.0.0.1", "--port=0", "--metrics_port=0",
       "--metrics_port_file=" + dir + "/metrics_port"},
      dir + "/first.log");
  ASSERT_THAT(first.status(), IsOk());
  const int taken = PortFrom(dir + "/metrics_port", first->get());
  auto second = Subprocess::Start(
      {testing::RunfilePath("server/ps_server"), "--config=" + config, overrides,
       "--server_index=0", "--host=127.0.0.1", "--port=0",
       absl::StrCat("--metrics_port=", taken)},
      dir + "/second.log");
  ASSERT_THAT(second.status(), IsOk());
  auto status = (*second)->Wait(absl::Seconds(60));
  ASSERT_THAT(status.status(), IsOk());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << (*second)->ReadLog();
  EXPECT_NE((*second)->ReadLog().find("cannot listen"), std::string::npos)
      << (*second)->ReadLog();
  (*first)->Signal(SIGTERM);
  ASSERT_THAT((*first)->Wait(absl::Seconds(60)).status(), IsOk());
}

}  // namespace
}  // namespace ps
