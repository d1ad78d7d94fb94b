// LocalCluster: N ps_server processes on 127.0.0.1 for the benchmarks.
//
// Everything lives in one temporary directory: the job config (config.textproto), each
// server's data dir (server<i>/) and log (server<i>.log). Servers bind port 0 and report the
// port through a port file. Stop() sends SIGTERM to all, then SIGKILL to those still running
// after the grace period; the destructor stops and removes the directory.
#ifndef PS_BENCH_LOCAL_CLUSTER_H_
#define PS_BENCH_LOCAL_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/bench_process.h"

namespace ps::bench {

struct LocalClusterOptions {
  // Path of the ps_server binary. REQUIRES: non-empty.
  std::string server_binary;
  // Number of servers started (index 0..num_servers-1). REQUIRES: > 0.
  int num_servers = 2;
  // The job config (textproto) every server gets; its cluster must describe num_servers.
  std::string config_text;
  // How long each server may take to write its port file.
  absl::Duration start_timeout = absl::Seconds(30);
  // SIGTERM -> SIGKILL grace period when stopping.
  absl::Duration stop_grace = absl::Seconds(5);
  // Keep the temporary directory (logs, data dirs) after the cluster is destroyed.
  bool keep_dir = false;
  // Lines of a failed server's log quoted in errors.
  int log_tail_lines = 20;
};

// Thread-safe: Stop() and CheckRunning() may be called from any thread.
class LocalCluster {
 public:
  // Writes the config, starts the servers and waits for their ports. On failure every
  // started server is stopped; the error names the server and quotes its log tail
  // (FAILED_PRECONDITION: it exited; DEADLINE_EXCEEDED: no port in time; INTERNAL: I/O).
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // "127.0.0.1:<port>" of server i at index i.
  const std::vector<std::string>& addresses() const { return addresses_; }
  // Process ids of the servers, index order.
  std::vector<pid_t> pids() const;
  const std::string& dir() const { return dir_; }
  const std::string& config_path() const { return config_path_; }
  // OK while every server runs; else FAILED_PRECONDITION naming each server that ended, how,
  // and its log tail.
  absl::Status CheckRunning();
  // After Stop(): OK if every server exited with code 0; else FAILED_PRECONDITION naming
  // each that did not, how it ended, and its log tail.
  absl::Status CheckExitedCleanly();
  // Stops every server (in parallel). Idempotent.
  void Stop();

 private:
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  absl::Status StartServers();

  // Constant after Start().
  const LocalClusterOptions options_;
  std::string dir_;
  std::string config_path_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<ChildProcess>> servers_;
};

}  // namespace ps::bench

#endif  // PS_BENCH_LOCAL_CLUSTER_H_
