// Tables larger than memory, end to end: 2 ps_server processes and 1 ps_worker train the
// synthetic CTR model of configs/ctr_synthetic_2x2.textproto (reduced: 200k examples, 20k
// values per field, 3 epochs; the same seeds every run) three times:
//   1. every row in memory, which gives the embedding table's row count N;
//   2. the embedding table with memory_budget_rows = N / 40 on each of the 2 servers (N / 20
//      rows in memory over the job, 5% of the table);
//   3. as 2, with server 0 SIGKILLed during training and restarted on its port and data dir:
//      it restores its newest checkpoint (re-spilling most of its rows) and the job finishes.
// Runs 2 and 3 must really spill (the servers' own accounting: rows in memory within the
// budget, most rows spilled, rows faulted back in). With one worker the job is deterministic,
// so run 2 must reach exactly the test AUC of run 1 (a spilled row comes back as it left);
// run 3, which loses the updates since server 0's last checkpoint, must come within 0.005.
#include <signal.h>
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

constexpr char kOverrides[] =
    "--set=data.synthetic.num_train=200000,data.synthetic.vocabulary_per_field=20000,"
    "cluster.num_workers=1,training.epochs=3,checkpoint.interval_s=1,"
    "training.progress_interval_s=0.5";
// The kill comes this many steps into the job (of 2,346: 782 a epoch), and 1.5 s later.
constexpr int64_t kKillAfterStep = 800;
constexpr char kTable[] = "ctr/embedding";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// What a server's log says about the embedding table (its last such line).
struct TableLine {
  bool found = false;
  bool spills = false;
  uint64_t rows = 0, in_memory = 0, budget = 0, spilled = 0, faulted = 0;
};

TableLine LastTableLine(const std::string& log) {
  TableLine t;
  const std::regex all(absl::StrCat("table '", kTable, "': ([0-9]+) rows, all in memory"));
  const std::regex spill(absl::StrCat(
      "table '", kTable,
      "': ([0-9]+) rows, ([0-9]+) in memory \\(budget ([0-9]+)\\), ([0-9]+) spilled; since the "
      "start ([0-9]+) faulted in"));
  for (std::sregex_iterator it(log.begin(), log.end(), all), end; it != end; ++it) {
    t = TableLine{true, false, std::stoull((*it)[1].str()), std::stoull((*it)[1].str())};
  }
  for (std::sregex_iterator it(log.begin(), log.end(), spill), end; it != end; ++it) {
    t = TableLine{true,
                  true,
                  std::stoull((*it)[1].str()),
                  std::stoull((*it)[2].str()),
                  std::stoull((*it)[3].str()),
                  std::stoull((*it)[4].str()),
                  std::stoull((*it)[5].str())};
  }
  return t;
}

// The last step a worker's progress lines report ("epoch 1/3  step 812  loss ..."); 0 if none.
int64_t LastStep(const std::string& log) {
  const std::regex progress("epoch [0-9]+/[0-9]+  step ([0-9]+)");
  int64_t step = 0;
  for (std::sregex_iterator it(log.begin(), log.end(), progress), end; it != end; ++it) {
    step = std::stoll((*it)[1].str());
  }
  return step;
}

class Job {
 public:
  // `budget`: memory_budget_rows of the embedding table (0 = none).
  Job(const std::string& name, uint64_t budget) : dir_(testing::MakeTempDir(name)) {
    std::ofstream(Config())
        << ReadFile(testing::RunfilePath("configs/ctr_synthetic_2x2.textproto"))
        << "\n# Declared to give it a memory budget; everything else as the model generates it.\n"
        << "tables { name: \"" << kTable << "\" kind: TABLE_KIND_SPARSE dim: 8"
        << (budget > 0 ? absl::StrCat(" memory_budget_rows: ", budget) : "") << " }\n";
  }

  void StartServer(int i, int port) {
    const std::string port_file = absl::StrCat(dir_, "/port", i, "_", ++starts_);
    auto p = Subprocess::Start(
        {testing::RunfilePath("server/ps_server"), "--config=" + Config(), kOverrides,
         absl::StrCat("--server_index=", i), "--host=127.0.0.1", absl::StrCat("--port=", port),
         "--port_file=" + port_file, absl::StrCat("--data_dir=", dir_, "/data", i)},
        ServerLog(i));
    ASSERT_THAT(p.status(), IsOk());
    auto got = testing::WaitForFileLine(port_file, absl::Seconds(60), p->get());
    ASSERT_THAT(got.status(), IsOk()) << ReadFile(ServerLog(i));
    if (servers_.size() <= static_cast<size_t>(i)) servers_.resize(i + 1);
    servers_[i] = *std::move(p);
    if (ports_.size() <= static_cast<size_t>(i)) ports_.resize(i + 1);
    ASSERT_TRUE(absl::SimpleAtoi(*got, &ports_[i]));
  }

  void Start() {
    for (int i = 0; i < 2; ++i) StartServer(i, 0);
    std::vector<std::string> addresses;
    for (int port : ports_) addresses.push_back(absl::StrCat("127.0.0.1:", port));
    for (int j = 0; j < 1; ++j) {
      auto p = Subprocess::Start(
          {testing::RunfilePath("worker/ps_worker"), "--config=" + Config(), kOverrides,
           absl::StrCat("--worker_index=", j), "--servers=" + absl::StrJoin(addresses, ",")},
          absl::StrCat(dir_, "/worker", j, ".log"));
      ASSERT_THAT(p.status(), IsOk());
      workers_.push_back(*std::move(p));
    }
  }

  // SIGKILL server i once worker 0 has reported kKillAfterStep steps and 1.5 s more have
  // passed (checkpoints come every second, so the newest one holds spilled rows; the updates
  // since it are lost with the server, and the restarted run must still reach the AUC of the
  // first), then restart it on the same port and data dir.
  void KillServerDuringTraining(int i) {
    const absl::Time give_up = absl::Now() + absl::Minutes(5);
    while (LastStep(workers_[0]->ReadLog()) < kKillAfterStep) {
      ASSERT_TRUE(workers_[0]->running()) << "the worker ended before step " << kKillAfterStep;
      ASSERT_LT(absl::Now(), give_up) << "no step " << kKillAfterStep << " in 5 minutes";
      absl::SleepFor(absl::Milliseconds(50));
    }
    absl::SleepFor(absl::Milliseconds(1500));
    ASSERT_TRUE(servers_[i]->running()) << "the job ended before the kill";
    servers_[i]->Signal(SIGKILL);
    ASSERT_THAT(servers_[i]->Wait(absl::Seconds(10)).status(), IsOk());
    StartServer(i, ports_[i]);
  }

  // Waits for the job; returns worker 0's final test AUC (-1 if missing).
  double Finish() {
    for (auto& w : workers_) {
      auto status = w->Wait(absl::Minutes(5));
      EXPECT_THAT(status.status(), IsOk()) << w->ReadLog();
      EXPECT_TRUE(status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << w->ReadLog();
    }
    for (auto& s : servers_) s->Signal(SIGTERM);  // final checkpoint, exit 0
    for (auto& s : servers_) {
      auto status = s->Wait(absl::Seconds(60));
      EXPECT_THAT(status.status(), IsOk()) << s->ReadLog();
      EXPECT_TRUE(status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << s->ReadLog();
    }
    std::smatch m;
    const std::string log = workers_[0]->ReadLog();
    double auc = -1;
    if (std::regex_search(log, m, std::regex("final test auc ([0-9.]+)"))) {
      EXPECT_TRUE(absl::SimpleAtod(m[1].str(), &auc));
    }
    return auc;
  }

  std::string ServerLog(int i) const { return absl::StrCat(dir_, "/server", i, ".log"); }

 private:
  std::string Config() const { return dir_ + "/job.textproto"; }
  std::string dir_;
  int starts_ = 0;
  std::vector<int> ports_;
  std::vector<std::unique_ptr<Subprocess>> servers_, workers_;
};

// The final accounting of both servers must show real spilling within the budget.
void ExpectSpilled(const Job& job, uint64_t budget, const std::string& run) {
  for (int i = 0; i < 2; ++i) {
    const TableLine t = LastTableLine(ReadFile(job.ServerLog(i)));
    ASSERT_TRUE(t.found && t.spills) << run << ": server " << i << " did not report spilling\n"
                                     << ReadFile(job.ServerLog(i));
    std::cout << run << ": server " << i << ": " << t.rows << " rows, " << t.in_memory
              << " in memory (budget " << t.budget << "), " << t.spilled << " spilled, "
              << t.faulted << " faulted in since its start\n";
    EXPECT_EQ(t.budget, budget);
    EXPECT_LE(t.in_memory, budget) << run << ": server " << i;
    EXPECT_GE(t.spilled, t.rows * 9 / 10) << run << ": server " << i;
    EXPECT_EQ(t.in_memory + t.spilled, t.rows);
    EXPECT_GT(t.faulted, 0u) << run << ": server " << i << " never read a spilled row back";
  }
}

TEST(SpillE2e, TrainsAsInMemoryAndSurvivesARestart) {
  Job memory("memory", 0);
  memory.Start();
  const double auc_memory = memory.Finish();
  ASSERT_GT(auc_memory, 0.75);
  uint64_t rows = 0;
  for (int i = 0; i < 2; ++i) {
    const TableLine t = LastTableLine(ReadFile(memory.ServerLog(i)));
    ASSERT_TRUE(t.found && !t.spills) << ReadFile(memory.ServerLog(i));
    rows += t.rows;
  }
  ASSERT_GT(rows, 50000u);            // large enough that 5% of it is a real constraint
  const uint64_t budget = rows / 40;  // per server: rows / 20 in memory over the job
  std::cout << "embedding table: " << rows << " rows; budget " << budget << " rows per server ("
            << 2 * budget << " = 5% in memory)\n";

  Job spilled("spilled", budget);
  spilled.Start();
  const double auc_spilled = spilled.Finish();
  ExpectSpilled(spilled, budget, "spilled");

  Job restarted("restarted", budget);
  restarted.Start();
  restarted.KillServerDuringTraining(0);
  const double auc_restarted = restarted.Finish();
  ExpectSpilled(restarted, budget, "restarted");
  const std::string log = ReadFile(restarted.ServerLog(0));
  EXPECT_NE(log.find("restored checkpoint"), std::string::npos) << log;
  // Right after the restore the server reports the restored table: spilled again.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      log, m,
      std::regex("restored checkpoint[^\\n]*\\n[^\\n]*table 'ctr/embedding': ([0-9]+) rows, "
                 "([0-9]+) in memory \\(budget [0-9]+\\), ([0-9]+) spilled")))
      << log;
  EXPECT_LE(std::stoull(m[2].str()), budget);
  EXPECT_GT(std::stoull(m[3].str()), 0u);

  std::cout << "test AUC: all in memory " << auc_memory << ", 5% in memory " << auc_spilled
            << ", 5% in memory with a server SIGKILLed and restarted " << auc_restarted << "\n";
  EXPECT_EQ(auc_spilled, auc_memory);
  EXPECT_NEAR(auc_restarted, auc_memory, 0.005);
}

}  // namespace
}  // namespace ps
