#include "common/startup/restart.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

constexpr char kReportVar[] = "PS_RESTART_TEST_REPORT";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs only in the program started again by the test below (the variable set): writes its
// pid and its process name where the variable says.
TEST(RestartTest, ChildReportsWhatItRunsAs) {
  const char* report = std::getenv(kReportVar);
  if (report == nullptr) GTEST_SKIP() << "only in the program started again";
  std::string comm = ReadFile("/proc/self/comm");
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  std::ofstream(report) << getpid() << " " << comm;
}

TEST(RestartTest, RunsTheSameProgramInTheSameProcessUnderItsOwnName) {
  const std::string report = absl::StrCat(::testing::TempDir(), "/restart_report_", getpid());
  std::remove(report.c_str());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char arg0[] = "restart_test";
    char filter[] = "--gtest_filter=RestartTest.ChildReportsWhatItRunsAs";
    char* argv[] = {arg0, filter, nullptr};
    const absl::Status failed = RestartWithEnvironment(argv, kReportVar, report);
    std::fprintf(stderr, "%s\n", failed.ToString().c_str());
    _exit(3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  // The same pid, and the program's own name, not "exe" (/proc/self/exe's).
  EXPECT_EQ(ReadFile(report), absl::StrCat(child, " restart_test"));
  std::remove(report.c_str());
}

TEST(RestartTest, NoArgvIsRefusedAndNothingRuns) {
  char* empty[] = {nullptr};
  EXPECT_EQ(RestartWithEnvironment(empty, kReportVar, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RestartWithEnvironment(nullptr, kReportVar, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::getenv(kReportVar), nullptr);
}

}  // namespace
}  // namespace ps::common
