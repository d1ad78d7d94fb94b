// ps_load: a load generator. C simulated workers (each its own GrpcParameterStore and worker
// id, asynchronous) pull and push dense tables against N servers for a fixed time; it reports
// calls/s, MB/s, p50/p99 latency, errors, and each server's resident memory before and after
// (and its peak).
//
//   bazel-bin/tools/ps_load --servers=2 --clients=32 --seconds=30
//   # Memory: 21 tables x 4M floats with Adam = 1 GB of parameters and slots on one server.
//   bazel-bin/tools/ps_load --servers=1 --clients=2 --tables=21 --table_floats=4194304 \
//       --optimizer=ADAM --seconds=60
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/status_macros.h"
#include "tools/bench_load.h"
#include "tools/local_cluster.h"
#include "worker/rpc/grpc_store.h"

ABSL_FLAG(int32_t, servers, 2, "Number of ps_server processes to start.");
ABSL_FLAG(std::string, server_binary, "",
          "ps_server to start (default: next to this binary in bazel-bin).");
ABSL_FLAG(int32_t, clients, 32, "Simulated workers, each with its own connection.");
ABSL_FLAG(int32_t, tables, 4, "Dense tables.");
ABSL_FLAG(uint64_t, table_floats, 262144, "Floats per dense table.");
ABSL_FLAG(std::string, optimizer, "SGD", "Server optimizer: SGD, MOMENTUM, ADAGRAD, ADAM, FTRL.");
ABSL_FLAG(double, seconds, 30, "Length of the run.");
ABSL_FLAG(double, checkpoint_interval, 0, "Servers' checkpoint interval, seconds (0 = off).");
ABSL_FLAG(bool, keep_temp, false, "Keep the servers' directory (logs, data dirs).");

namespace ps::tools {
namespace {

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::filesystem::path(std::string(buf, n)).parent_path().string() : ".";
}

// VmRSS and VmHWM of a process, in MiB (-1 if unreadable).
std::pair<double, double> Memory(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  double rss = -1, hwm = -1;
  while (std::getline(in, line)) {
    long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %ld kB", &kb) == 1) rss = kb / 1024.0;
    if (std::sscanf(line.c_str(), "VmHWM: %ld kB", &kb) == 1) hwm = kb / 1024.0;
  }
  return {rss, hwm};
}

std::string Config(int servers, int clients) {
  std::string text = absl::StrFormat(
      "cluster { num_servers: %d num_workers: %d dense_block_floats: 262144 }\n"
      "security { plaintext: true }\ncheckpoint { interval_s: %g }\n",
      servers, clients, absl::GetFlag(FLAGS_checkpoint_interval));
  for (int t = 0; t < absl::GetFlag(FLAGS_tables); ++t) {
    absl::StrAppendFormat(&text,
                          "tables { name: \"t%d\" kind: TABLE_KIND_DENSE shape: %d "
                          "initializer { kind: UNIFORM low: -0.1 high: 0.1 } "
                          "optimizer { kind: %s learning_rate: 0.001 } }\n",
                          t, absl::GetFlag(FLAGS_table_floats), absl::GetFlag(FLAGS_optimizer));
  }
  return text;
}

absl::Status Run() {
  const int servers = absl::GetFlag(FLAGS_servers), clients = absl::GetFlag(FLAGS_clients);
  const std::string config_text = Config(servers, clients);
  LocalClusterOptions cluster_options;
  cluster_options.server_binary = absl::GetFlag(FLAGS_server_binary).empty()
                                      ? SelfDir() + "/../server/ps_server"
                                      : absl::GetFlag(FLAGS_server_binary);
  cluster_options.num_servers = servers;
  cluster_options.config_text = config_text;
  cluster_options.start_timeout = absl::Seconds(120);
  cluster_options.keep_dir = absl::GetFlag(FLAGS_keep_temp);
  // Servers write a final checkpoint on SIGTERM: a big table needs more than a few seconds.
  cluster_options.stop_grace = absl::Minutes(2);
  ASSIGN_OR_RETURN(auto cluster, LocalCluster::Start(cluster_options));
  ASSIGN_OR_RETURN(JobConfig config, common::ParseJobConfigText(config_text, "ps_load"));
  RETURN_IF_ERROR(common::ExpandModelTables(&config));
  for (const auto& a : cluster->addresses()) config.mutable_cluster()->add_servers(a);

  std::vector<std::unique_ptr<worker::GrpcParameterStore>> stores;
  for (int c = 0; c < clients; ++c) {
    worker::GrpcStoreOptions options;
    options.worker_id = c;
    options.worker_incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
    options.deadline = absl::Seconds(120);
    ASSIGN_OR_RETURN(auto store, worker::GrpcParameterStore::Create(config, options));
    RETURN_IF_ERROR(store->WaitForServers(absl::Seconds(60)));
    stores.push_back(std::move(store));
  }
  std::vector<std::pair<double, double>> before;
  for (pid_t pid : cluster->pids()) before.push_back(Memory(pid));

  const uint64_t n = absl::GetFlag(FLAGS_table_floats);
  const int tables = absl::GetFlag(FLAGS_tables);
  std::vector<std::vector<float>> buffers(clients, std::vector<float>(n));
  std::vector<int64_t> clocks(clients, 0);
  std::vector<std::mt19937> rngs;
  for (int c = 0; c < clients; ++c) rngs.emplace_back(c + 1);
  std::atomic<uint64_t> errors{0};
  absl::Mutex error_mu;
  std::string first_error;
  // One call = pull one random table, then push a gradient for it.
  LoadCall call = [&](int c) -> absl::Status {
    const std::string table = absl::StrCat("t", rngs[c]() % tables);
    std::vector<float>& buf = buffers[c];
    common::PullBatch pull;
    pull.dense.push_back({table, absl::MakeSpan(buf)});
    absl::Status s = stores[c]->Pull(pull, {clocks[c]});
    if (s.ok()) {
      for (size_t i = 0; i < buf.size(); i += 1024) buf[i] = 0.001f * (i % 7);
      common::PushBatch push;
      push.dense.push_back({table, buf});
      s = stores[c]->Push(push, {++clocks[c], false});
    }
    if (!s.ok()) {
      ++errors;
      absl::MutexLock lock(&error_mu);
      if (first_error.empty()) first_error = s.ToString();
    }
    return absl::OkStatus();
  };
  LoadOptions load;
  load.threads = clients;
  load.warmup = absl::Seconds(1);
  load.duration = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  ASSIGN_OR_RETURN(LoadResult result, RunLoad(load, call, nullptr));
  std::vector<std::pair<double, double>> after;
  for (pid_t pid : cluster->pids()) after.push_back(Memory(pid));
  RETURN_IF_ERROR(cluster->CheckRunning());

  const double mb_per_call = 2.0 * n * sizeof(float) / (1 << 20);
  std::printf("ps_load: %d servers, %d clients, %d tables x %llu floats (%s), %.0f s\n", servers,
              clients, tables, static_cast<unsigned long long>(n),
              absl::GetFlag(FLAGS_optimizer).c_str(), result.seconds);
  std::printf("  calls (pull+push): %llu, %.1f calls/s, %.1f MB/s, p50 %.2f ms, p99 %.2f ms, "
              "errors %llu%s%s\n",
              static_cast<unsigned long long>(result.calls), result.calls_per_second,
              result.calls_per_second * mb_per_call, result.Percentile(0.5),
              result.Percentile(0.99), static_cast<unsigned long long>(errors.load()),
              first_error.empty() ? "" : " first: ", first_error.c_str());
  const double state_mb =
      tables * static_cast<double>(n) * sizeof(float) / (1 << 20) / servers;
  for (size_t i = 0; i < after.size(); ++i) {
    std::printf("  server %zu: RSS %.0f MiB before, %.0f MiB after, peak %.0f MiB "
                "(parameters only: %.0f MiB per server before slots)\n",
                i, before[i].first, after[i].first, after[i].second, state_mb);
  }
  cluster->Stop();
  RETURN_IF_ERROR(cluster->CheckExitedCleanly());
  return errors.load() == 0 ? absl::OkStatus()
                            : absl::InternalError(absl::StrCat(errors.load(), " calls failed"));
}

}  // namespace
}  // namespace ps::tools

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status s = ps::tools::Run();
  if (!s.ok()) {
    std::cerr << "ps_load: " << s << std::endl;
    return 1;
  }
  return 0;
}
