#include "bench/bench_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace ps::bench {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to start");
  // Everything the child needs is prepared before fork(): between fork and exec only
  // async-signal-safe calls are allowed (the parent has threads).
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return absl::InternalError(absl::StrCat("open ", log_path, ": ", strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) {
    close(log);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    dup2(log, 1);
    dup2(log, 2);
    // The parent blocks SIGINT/SIGTERM to handle them on one thread; the server must see them.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // Its own process group: a Ctrl-C in the terminal reaches only the tool, which then stops
    // its servers in order (and can still report what they logged).
    setpgid(0, 0);
    execv(args[0], args.data());
    const char msg[] = "exec failed\n";
    ssize_t ignored = write(2, msg, sizeof(msg) - 1);
    (void)ignored;
    _exit(127);
  }
  close(log);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
}

ChildProcess::~ChildProcess() { Stop(absl::Seconds(5)); }

bool ChildProcess::RunningLocked() {
  if (wait_status_.has_value()) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) wait_status_ = status;
  return !wait_status_.has_value();
}

bool ChildProcess::Running() {
  absl::MutexLock lock(&mu_);
  return RunningLocked();
}

std::string ChildProcess::ExitDescription() {
  absl::MutexLock lock(&mu_);
  if (RunningLocked()) return "running";
  const int s = *wait_status_;
  if (WIFEXITED(s)) return absl::StrCat("exit code ", WEXITSTATUS(s));
  if (WIFSIGNALED(s)) return absl::StrCat("killed by signal ", WTERMSIG(s));
  return absl::StrCat("wait status ", s);
}

void ChildProcess::Signal(int sig) {
  absl::MutexLock lock(&mu_);
  if (RunningLocked()) kill(pid_, sig);
}

void ChildProcess::Stop(absl::Duration grace) {
  absl::MutexLock lock(&mu_);
  if (!RunningLocked()) return;
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  while (RunningLocked() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  if (!RunningLocked()) return;
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  wait_status_ = status;
}

std::string ChildProcess::LogTail(int lines) const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  std::vector<std::string> all = absl::StrSplit(s.str(), '\n', absl::SkipEmpty());
  if (all.size() > static_cast<size_t>(lines)) all.erase(all.begin(), all.end() - lines);
  return absl::StrJoin(all, "\n");
}

absl::StatusOr<std::string> WaitForFileLine(const std::string& path, absl::Duration timeout,
                                            ChildProcess* process) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    std::string line;
    // The writer renames a complete file into place, so a line read here is whole.
    if (in && std::getline(in, line) && !absl::StripAsciiWhitespace(line).empty()) {
      return std::string(absl::StripAsciiWhitespace(line));
    }
    if (process != nullptr && !process->Running()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pid ", process->pid(), " ended (", process->ExitDescription(), ") before writing ",
          path));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("nothing in ", path, " after ", absl::FormatDuration(timeout)));
}

absl::StatusOr<std::string> MakeTempDir(const std::string& prefix) {
  const char* tmp = getenv("TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/", prefix,
                                     "XXXXXX");
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", strerror(errno)));
  }
  return std::string(buf.data());
}

}  // namespace ps::bench
