#include "tests/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace ps::testing {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (log < 0) return absl::InternalError(absl::StrCat("open ", log_path, ": ", strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    dup2(log, 1);
    dup2(log, 2);
    close(log);
    // Unblock everything the test may have blocked; the child handles its own signals.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(log);
  return std::unique_ptr<Subprocess>(new Subprocess(pid, log_path));
}

Subprocess::~Subprocess() {
  if (running()) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(10)).IgnoreError();
  }
}

bool Subprocess::running() {
  if (status_.has_value()) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) status_ = status;
  return !status_.has_value();
}

void Subprocess::Signal(int sig) {
  if (running()) kill(pid_, sig);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (running()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return *status_;
}

std::string Subprocess::ReadLog() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<std::string> WaitForFileLine(const std::string& path, absl::Duration timeout,
                                            Subprocess* process) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) {
      return std::string(absl::StripAsciiWhitespace(line));
    }
    if (process != nullptr && !process->running()) {
      return absl::FailedPreconditionError(
          absl::StrCat("process exited before writing ", path, "; its log:\n", process->ReadLog()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("no ", path, " after ", absl::FormatDuration(timeout)));
}

std::string RunfilePath(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return workspace_relative;
  return absl::StrCat(srcdir, "/", workspace ? workspace : "ps", "/", workspace_relative);
}

std::string MakeTempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string base = tmp ? tmp : "/tmp";
  mkdir(base.c_str(), 0755);  // may exist already
  std::string pattern = absl::StrCat(base, "/", name, "XXXXXX");
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  char* dir = mkdtemp(buf.data());
  return dir ? std::string(dir) : std::string();
}

}  // namespace ps::testing
