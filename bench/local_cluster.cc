#include "bench/local_cluster.h"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ps::bench {
namespace {

std::string Indent(const std::string& text) {
  if (text.empty()) return "    (log is empty)";
  std::string out = "    ";
  for (char c : text) {
    out += c;
    if (c == '\n') out += "    ";
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  if (options.server_binary.empty() || options.num_servers <= 0) {
    return absl::InvalidArgumentError("LocalCluster needs a server binary and >= 1 server");
  }
  std::error_code ec;
  if (!std::filesystem::exists(options.server_binary, ec)) {
    return absl::NotFoundError(absl::StrCat("server binary ", options.server_binary,
                                            " does not exist (build it with "
                                            "`bazel build //server:ps_server`)"));
  }
  std::unique_ptr<LocalCluster> cluster(new LocalCluster(options));
  ASSIGN_OR_RETURN(cluster->dir_, MakeTempDir("ps_bench."));
  cluster->config_path_ = cluster->dir_ + "/config.textproto";
  {
    std::ofstream out(cluster->config_path_);
    out << options.config_text;
    if (!out.good()) {
      return absl::InternalError(absl::StrCat("cannot write ", cluster->config_path_));
    }
  }
  absl::Status started = cluster->StartServers();
  if (!started.ok()) {
    cluster->Stop();
    return started;
  }
  return cluster;
}

absl::Status LocalCluster::StartServers() {
  for (int i = 0; i < options_.num_servers; ++i) {
    const std::string data_dir = absl::StrCat(dir_, "/server", i);
    std::vector<std::string> argv = {
        options_.server_binary,
        absl::StrCat("--config=", config_path_),
        absl::StrCat("--server_index=", i),
        "--cluster_from=flags",
        "--host=127.0.0.1",
        "--port=0",
        absl::StrCat("--port_file=", dir_, "/server", i, ".port"),
        absl::StrCat("--data_dir=", data_dir),
    };
    ASSIGN_OR_RETURN(auto child,
                     ChildProcess::Start(argv, absl::StrCat(dir_, "/server", i, ".log")));
    servers_.push_back(std::move(child));
  }
  // All servers start in parallel; then each is waited for in turn.
  for (int i = 0; i < options_.num_servers; ++i) {
    absl::StatusOr<std::string> port = WaitForFileLine(
        absl::StrCat(dir_, "/server", i, ".port"), options_.start_timeout, servers_[i].get());
    if (!port.ok()) {
      return absl::Status(port.status().code(),
                          absl::StrCat("ps_server ", i, " did not start: ", port.status().message(),
                                       "\n  ", servers_[i]->log_path(), " ends with:\n",
                                       Indent(servers_[i]->LogTail(options_.log_tail_lines))));
    }
    addresses_.push_back(absl::StrCat("127.0.0.1:", *port));
  }
  return absl::OkStatus();
}

LocalCluster::~LocalCluster() {
  Stop();
  if (dir_.empty()) return;
  if (options_.keep_dir) {
    LOG(INFO) << "kept " << dir_ << " (server logs and data dirs)";
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

absl::Status LocalCluster::CheckRunning() {
  std::vector<std::string> problems;
  for (size_t i = 0; i < servers_.size(); ++i) {
    if (servers_[i]->Running()) continue;
    problems.push_back(absl::StrCat("ps_server ", i, " (pid ", servers_[i]->pid(), ") ended: ",
                                    servers_[i]->ExitDescription(), "; ",
                                    servers_[i]->log_path(), " ends with:\n",
                                    Indent(servers_[i]->LogTail(options_.log_tail_lines))));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrJoin(problems, "\n"));
}

absl::Status LocalCluster::CheckExitedCleanly() {
  std::vector<std::string> problems;
  for (size_t i = 0; i < servers_.size(); ++i) {
    const std::string how = servers_[i]->ExitDescription();
    if (how == "exit code 0") continue;
    problems.push_back(absl::StrCat("ps_server ", i, " (pid ", servers_[i]->pid(), ") ", how,
                                    "; ", servers_[i]->log_path(), " ends with:\n",
                                    Indent(servers_[i]->LogTail(options_.log_tail_lines))));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrJoin(problems, "\n"));
}

void LocalCluster::Stop() {
  // SIGTERM to all first, so that they shut down in parallel; Stop() then waits for each and
  // SIGKILLs what is left after the grace period.
  for (auto& s : servers_) s->Signal(SIGTERM);
  for (auto& s : servers_) s->Stop(options_.stop_grace);
}

std::vector<pid_t> LocalCluster::pids() const {
  std::vector<pid_t> out;
  for (const auto& s : servers_) out.push_back(s->pid());
  return out;
}

}  // namespace ps::bench
