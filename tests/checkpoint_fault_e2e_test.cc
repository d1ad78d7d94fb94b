// A real ps_server and its data dir under faults an operator meets: writes that fail (a file
// size limit stands in for a full disk, so no mount and no root are needed), a data dir that
// lost its CURRENT file, and flags out of range. Each must end in a non-zero exit that says
// why, never in a quiet fresh start or an exit 0.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::ps::testing::Subprocess;
using ::testing::HasSubstr;

// 2^18 floats (1 MiB) in one dense table: every checkpoint's table file is over 1 MiB.
constexpr char kConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 }
  tables {
    name: "w" kind: TABLE_KIND_DENSE shape: 262144
    initializer { kind: UNIFORM low: -1 high: 1 }
    optimizer { kind: SGD learning_rate: 0.1 }
  }
  checkpoint { interval_s: 0 }
  security { plaintext: true }
)pb";

class CheckpointFaultE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("ckptfault");
    std::ofstream(dir_ + "/job.textproto") << kConfig;
  }

  std::vector<std::string> ServerArgv(const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {testing::RunfilePath("server/ps_server"),
                                     "--config=" + dir_ + "/job.textproto", "--server_index=0",
                                     "--host=127.0.0.1", "--port=0",
                                     "--port_file=" + dir_ + "/port", "--data_dir=" + dir_ + "/data"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  // Starts the server (through `sh -c` when `shell_prefix` is set) and waits until it serves.
  std::unique_ptr<Subprocess> StartServing(const std::string& shell_prefix = "") {
    std::filesystem::remove(dir_ + "/port");
    std::vector<std::string> argv = ServerArgv({});
    if (!shell_prefix.empty()) {
      std::string command = shell_prefix + " exec";
      for (const std::string& a : argv) command += " '" + a + "'";
      argv = {"/bin/sh", "-c", command};
    }
    auto p = Subprocess::Start(argv, dir_ + "/server" + std::to_string(++starts_) + ".log");
    EXPECT_THAT(p.status(), IsOk());
    if (!p.ok()) return nullptr;
    auto port = testing::WaitForFileLine(dir_ + "/port", absl::Seconds(60), p->get());
    EXPECT_THAT(port.status(), IsOk()) << (*p)->ReadLog();
    return *std::move(p);
  }

  // Stops `p` with SIGTERM and returns its exit code (-1 if it did not exit normally).
  static int StopAndWait(Subprocess* p) {
    p->Signal(SIGTERM);
    absl::StatusOr<int> status = p->Wait(absl::Seconds(60));
    EXPECT_THAT(status.status(), IsOk());
    return status.ok() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  }

  std::vector<std::string> DataFiles() {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_ + "/data")) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
  int starts_ = 0;
};

// Seen: "final checkpoint failed" in the log and exit 0, so a supervisor took the stop for a
// clean one.
TEST_F(CheckpointFaultE2eTest, FailedFinalCheckpointIsANonZeroExit) {
  // Files may not grow past 512 KiB: the checkpoint's table file fails like on a full disk.
  // SIGXFSZ is ignored, so the write fails with EFBIG instead of killing the server.
  std::unique_ptr<Subprocess> server = StartServing("trap '' XFSZ; ulimit -f 1024;");
  ASSERT_NE(server, nullptr);
  EXPECT_NE(StopAndWait(server.get()), 0) << server->ReadLog();
  EXPECT_THAT(server->ReadLog(), HasSubstr("final checkpoint failed"));
}

TEST_F(CheckpointFaultE2eTest, CleanStopWithAGoodFinalCheckpointExitsZero) {
  std::unique_ptr<Subprocess> server = StartServing();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(StopAndWait(server.get()), 0) << server->ReadLog();
  EXPECT_THAT(server->ReadLog(), HasSubstr("final checkpoint 1"));
}

// Seen: with CURRENT and the empty log removed the server started from initial values (exit
// 0, one INFO line), and RocksDB deleted the MANIFEST and the table files of both checkpoints.
TEST_F(CheckpointFaultE2eTest, DataDirWithoutCurrentIsRefusedAndKeptIntact) {
  std::unique_ptr<Subprocess> server = StartServing();
  ASSERT_NE(server, nullptr);
  ASSERT_EQ(StopAndWait(server.get()), 0) << server->ReadLog();
  std::filesystem::remove(dir_ + "/data/CURRENT");
  for (const auto& entry : std::filesystem::directory_iterator(dir_ + "/data")) {
    if (entry.path().extension() == ".log") std::filesystem::remove(entry.path());
  }
  const std::vector<std::string> before = DataFiles();

  auto again = Subprocess::Start(ServerArgv({}), dir_ + "/refused.log");
  ASSERT_THAT(again.status(), IsOk());
  absl::StatusOr<int> status = (*again)->Wait(absl::Seconds(60));
  ASSERT_THAT(status.status(), IsOk());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << (*again)->ReadLog();
  EXPECT_THAT((*again)->ReadLog(), HasSubstr("DATA_LOSS"));
  EXPECT_THAT((*again)->ReadLog(), HasSubstr("CURRENT is missing"));
  EXPECT_EQ(DataFiles(), before);
}

// Seen: --port=99999 listened on 34463, and negative --threads and --checkpoint_interval were
// accepted.
TEST_F(CheckpointFaultE2eTest, OutOfRangeFlagsAreRefusedBeforeAnythingStarts) {
  for (const std::string& flag :
       {"--port=99999", "--threads=-3", "--checkpoint_interval=-7", "--base_port=-1"}) {
    std::vector<std::string> argv = ServerArgv({flag});
    auto p = Subprocess::Start(argv, dir_ + "/flag.log");
    ASSERT_THAT(p.status(), IsOk());
    absl::StatusOr<int> status = (*p)->Wait(absl::Seconds(60));
    ASSERT_THAT(status.status(), IsOk());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << flag;
    EXPECT_THAT((*p)->ReadLog(), HasSubstr("INVALID_ARGUMENT: " + flag.substr(0, flag.find('='))))
        << flag;
  }
}

}  // namespace
}  // namespace ps
