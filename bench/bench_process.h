// Child processes for the benchmarks: start a binary with its output going to a log file, stop it
// (SIGTERM, then SIGKILL after a grace period), and read the end of its log for error
// messages. A ChildProcess still running when destroyed is stopped the same way, so a tool
// that returns early (an error, Ctrl-C) leaves no server behind.
//
// (tests/subprocess.h does the same for tests; it is testonly, so the benchmarks have their own.)
#ifndef PS_BENCH_BENCH_PROCESS_H_
#define PS_BENCH_BENCH_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ps::bench {

// One child process. Thread-safe (the Ctrl-C thread may stop it while the main thread waits
// on it).
class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv; stdout and stderr go to `log_path` (appended). The
  // child starts with no signals blocked, whatever the caller blocked.
  // Errors: INTERNAL naming the failing system call.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::vector<std::string>& argv,
                                                            const std::string& log_path);
  // Stop(absl::Seconds(5)).
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // False once the child has exited (and been reaped).
  bool Running();
  // A readable description of how it exited ("exit code 1", "killed by signal 9"), or
  // "running".
  std::string ExitDescription();
  // Sends `sig` if the child is still running.
  void Signal(int sig);
  // SIGTERM; after `grace` without exiting, SIGKILL. Returns when the child is reaped.
  // Safe to call more than once and from several threads.
  void Stop(absl::Duration grace);
  // The last `lines` lines of the log.
  std::string LogTail(int lines) const;

 private:
  ChildProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  bool RunningLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const pid_t pid_;
  const std::string log_path_;

  absl::Mutex mu_;
  std::optional<int> wait_status_ ABSL_GUARDED_BY(mu_);
};

// Waits until `path` exists and holds a complete line; returns it without surrounding
// whitespace. FAILED_PRECONDITION if `process` exits first, DEADLINE_EXCEEDED after
// `timeout`; both name the path.
absl::StatusOr<std::string> WaitForFileLine(const std::string& path, absl::Duration timeout,
                                            ChildProcess* process);

// A new directory under $TMPDIR (or /tmp) named <prefix>XXXXXX. INTERNAL on failure.
absl::StatusOr<std::string> MakeTempDir(const std::string& prefix);

}  // namespace ps::bench

#endif  // PS_BENCH_BENCH_PROCESS_H_
