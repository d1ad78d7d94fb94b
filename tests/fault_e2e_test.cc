// Failures during training: 2 ps_server + 2 ps_worker processes train the Fashion-MNIST MLP
// (30 epochs, async, a checkpoint every second). In the disturbed run server 0 is SIGKILLed
// twice and worker 1 once; each is restarted (the server on the same port and data dir, the
// worker with a new incarnation). Nobody restarts the other processes: the workers retry, the
// restarted worker resumes its data shard, and the job must finish on its own with a test
// accuracy no more than 0.015 below an undisturbed run of the same config.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_matchers.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::ps::testing::Subprocess;

constexpr char kTrainImages[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
// Thirty epochs: the kills below need about 8 s of training after both workers have started.
// On a quiet 2-core machine 4 epochs of the 2 + 2 job once took 6.5 s (worker 1 had finished,
// and the servers with it, before the test killed it); with OpenBLAS's AVX-512 kernels
// (2026-12-05) 10 epochs took about 6.5 s. Each kill checks that the job still runs.
constexpr char kOverrides[] =
    "--set=training.epochs=30,checkpoint.interval_s=1,training.progress_interval_s=1";

class Job {
 public:
  explicit Job(const std::string& name) : dir_(testing::MakeTempDir(name)) {}

  void StartServer(int i, int port) {
    const std::string port_file = absl::StrCat(dir_, "/port", i, "_", ++starts_);
    auto p = Subprocess::Start({testing::RunfilePath("server/ps_server"), "--config=" + Config(),
                                kOverrides, absl::StrCat("--server_index=", i), "--host=127.0.0.1",
                                absl::StrCat("--port=", port), "--port_file=" + port_file,
                                absl::StrCat("--data_dir=", dir_, "/data", i)},
                               absl::StrCat(dir_, "/server", i, ".log"));
    ASSERT_THAT(p.status(), IsOk());
    auto got = testing::WaitForFileLine(port_file, absl::Seconds(60), p->get());
    ASSERT_THAT(got.status(), IsOk());
    if (servers_.size() <= static_cast<size_t>(i)) servers_.resize(i + 1);
    servers_[i] = *std::move(p);
    if (ports_.size() <= static_cast<size_t>(i)) ports_.resize(i + 1);
    ASSERT_TRUE(absl::SimpleAtoi(*got, &ports_[i]));
  }

  void StartWorker(int j) {
    std::vector<std::string> addresses;
    for (int port : ports_) addresses.push_back(absl::StrCat("127.0.0.1:", port));
    auto p = Subprocess::Start({testing::RunfilePath("worker/ps_worker"), "--config=" + Config(),
                                kOverrides, absl::StrCat("--worker_index=", j),
                                "--servers=" + absl::StrJoin(addresses, ",")},
                               absl::StrCat(dir_, "/worker", j, ".log"));
    ASSERT_THAT(p.status(), IsOk());
    if (workers_.size() <= static_cast<size_t>(j)) workers_.resize(j + 1);
    workers_[j] = *std::move(p);
  }

  void Start() {
    for (int i = 0; i < 2; ++i) StartServer(i, 0);
    for (int j = 0; j < 2; ++j) StartWorker(j);
  }

  // Both workers still train: a kill after the job ended would test nothing (a worker's last
  // progress line, printed as it finishes, counts in WaitForMoreSteps).
  void ExpectTraining() {
    for (size_t j = 0; j < workers_.size(); ++j) {
      ASSERT_TRUE(workers_[j]->running()) << "worker " << j << " ended before the kill";
    }
    for (size_t i = 0; i < servers_.size(); ++i) {
      ASSERT_TRUE(servers_[i]->running()) << "server " << i << " ended before the kill";
    }
  }

  void KillServer(int i) {
    ExpectTraining();
    if (::testing::Test::HasFatalFailure()) return;
    servers_[i]->Signal(SIGKILL);
    ASSERT_THAT(servers_[i]->Wait(absl::Seconds(10)).status(), IsOk());
    StartServer(i, ports_[i]);  // same port: the workers keep their addresses
  }

  void KillWorker(int j) {
    ExpectTraining();
    if (::testing::Test::HasFatalFailure()) return;
    workers_[j]->Signal(SIGKILL);
    ASSERT_THAT(workers_[j]->Wait(absl::Seconds(10)).status(), IsOk());
    StartWorker(j);
  }

  // Waits for the workers; returns worker 0's final test accuracy.
  double Finish() {
    for (auto& w : workers_) {
      auto status = w->Wait(absl::Minutes(5));
      EXPECT_THAT(status.status(), IsOk()) << w->ReadLog();
      EXPECT_TRUE(status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << w->ReadLog();
    }
    const std::string log = workers_[0]->ReadLog();
    std::smatch m;
    double accuracy = -1;
    if (std::regex_search(log, m, std::regex("final test accuracy ([0-9.]+)"))) {
      EXPECT_TRUE(absl::SimpleAtod(m[1].str(), &accuracy));
    }
    for (auto& s : servers_) s->Signal(SIGTERM);
    for (auto& s : servers_) EXPECT_THAT(s->Wait(absl::Seconds(60)).status(), IsOk());
    return accuracy;
  }

  // Waits until the log of `name` holds `more` progress lines (one a second while a worker
  // trains: "worker J  epoch E/N  step S ...") beyond those it holds now, so that kills land
  // while the job trains, however long the processes took to start and load their data.
  // A worker that has exited prints no more: that ends the wait at once (the kill that
  // follows then fails in ExpectTraining).
  void WaitForMoreSteps(int worker, int more) {
    const std::string name = absl::StrCat("worker", worker);
    const int start = ProgressLines(name);
    const absl::Time deadline = absl::Now() + absl::Minutes(3);
    while (absl::Now() < deadline) {
      if (ProgressLines(name) >= start + more) return;
      if (!workers_[worker]->running()) {
        ADD_FAILURE() << name << " exited before " << more << " more progress lines";
        return;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    ADD_FAILURE() << name << " printed fewer than " << more << " progress lines in 3 minutes";
  }

  int ProgressLines(const std::string& name) const {
    const std::string log = Log(name);
    int n = 0;
    for (size_t at = log.find("  step "); at != std::string::npos; at = log.find("  step ", at + 1)) {
      ++n;
    }
    return n;
  }

  std::string Log(const std::string& name) const {
    std::ifstream in(absl::StrCat(dir_, "/", name, ".log"));
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  static std::string Config() {
    return testing::RunfilePath("configs/fashion_mnist_2x2_async.textproto");
  }
  std::string dir_;
  int starts_ = 0;
  std::vector<int> ports_;
  std::vector<std::unique_ptr<Subprocess>> servers_, workers_;
};

TEST(FaultE2e, JobSurvivesKilledServersAndWorker) {
  struct stat st;
  if (stat(kTrainImages, &st) != 0) GTEST_SKIP() << "dataset-fashion-mnist is not installed";

  Job calm("calm");
  calm.Start();
  const double undisturbed = calm.Finish();
  ASSERT_GT(undisturbed, 0.8);

  Job job("faults");
  job.Start();
  // Each kill waits for training progress (printed every second, as are checkpoints and the
  // workers' positions), not for a fixed time since the start.
  job.WaitForMoreSteps(0, 2);
  job.WaitForMoreSteps(1, 2);
  ASSERT_NO_FATAL_FAILURE(job.KillServer(0));
  job.WaitForMoreSteps(1, 2);
  ASSERT_NO_FATAL_FAILURE(job.KillWorker(1));
  job.WaitForMoreSteps(1, 1);  // the restarted worker trains again
  ASSERT_NO_FATAL_FAILURE(job.KillServer(0));
  const double disturbed = job.Finish();

  const std::string server_log = job.Log("server0");
  EXPECT_NE(server_log.find("restored checkpoint"), std::string::npos) << server_log;
  EXPECT_NE(server_log.find("were lost"), std::string::npos) << server_log;
  const std::string worker_log = job.Log("worker1");
  EXPECT_NE(worker_log.find("resuming at epoch"), std::string::npos) << worker_log;
  EXPECT_NE(job.Log("worker0").find("answers again after"), std::string::npos);
  // The faults must not cost accuracy: no worse than the undisturbed run, less the spread of
  // asynchronous training between runs (about 0.01; the disturbed run may well end higher).
  EXPECT_GE(disturbed, undisturbed - 0.015)
      << "undisturbed " << undisturbed << ", with failures " << disturbed;
  // The figures for docs/reliability.md: recovery and lost updates, as the processes log them.
  std::regex facts("(answers again after[^\\n]*|[0-9]+ updates since the restored checkpoint[^\\n]*)");
  for (const char* name : {"server0", "worker0"}) {
    const std::string log = job.Log(name);
    for (std::sregex_iterator it(log.begin(), log.end(), facts), end; it != end; ++it) {
      std::cout << name << ": " << it->str() << "\n";
    }
  }
  std::cout << "test accuracy undisturbed " << undisturbed << ", with failures " << disturbed
            << "\n";
}

}  // namespace
}  // namespace ps
