// Child processes for multi-process tests: start a binary with arguments, its output going
// to a log file; signal it; wait for it with a timeout. A Subprocess that is still running
// when destroyed is killed (SIGKILL) and reaped, so a failing test leaves nothing behind.
#ifndef PS_TESTS_SUBPROCESS_H_
#define PS_TESTS_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ps::testing {

// Thread-compatible.
class Subprocess {
 public:
  // Starts argv[0] (a path) with argv; stdout and stderr go to `log_path`.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                           const std::string& log_path);
  ~Subprocess();

  pid_t pid() const { return pid_; }
  bool running();
  void Signal(int sig);
  // Waits up to `timeout`; returns the raw wait status, or DEADLINE_EXCEEDED.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  const std::string& log_path() const { return log_path_; }
  std::string ReadLog() const;

 private:
  Subprocess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::optional<int> status_;
  std::string log_path_;
};

// Waits until `path` exists and holds a line; returns its contents without the newline.
absl::StatusOr<std::string> WaitForFileLine(const std::string& path, absl::Duration timeout,
                                            Subprocess* process = nullptr);

// Path of a binary of this workspace in the test's runfiles, e.g. "server/ps_server".
std::string RunfilePath(const std::string& workspace_relative);

// A fresh directory under TEST_TMPDIR.
std::string MakeTempDir(const std::string& name);

}  // namespace ps::testing

#endif  // PS_TESTS_SUBPROCESS_H_
