// ps_load: a load generator. C simulated workers (each its own GrpcParameterStore and worker
// id, asynchronous) pull and push dense tables against N servers for a fixed time; it reports
// calls/s, MB/s, p50/p99 latency, errors, and each server's resident memory before and after
// (and its peak).
//
//   bazel-bin/bench/ps_load --servers=2 --clients=32 --seconds=30
//   # Memory: 21 tables x 4M floats with Adam = 1 GB of parameters and slots on one server.
//   bazel-bin/bench/ps_load --servers=1 --clients=2 --tables=21 --table_floats=4194304
//       --optimizer=ADAM --seconds=60      (one command line)
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
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/startup/flag_check.h"
#include "common/status_macros.h"
#include "bench/bench_load.h"
#include "bench/local_cluster.h"
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

namespace ps::bench {
namespace {

// What the flags say, each within its range (LoadFlags::Parse).
struct LoadFlags {
  int servers = 2;
  int clients = 32;
  int tables = 4;
  uint64_t table_floats = 262144;
  std::string optimizer = "SGD";
  double seconds = 30;
  double checkpoint_interval = 0;
  std::string server_binary;
  bool keep_temp = false;
};

// Beyond these a value is a typo: every client holds one table's floats, every server its
// share of all tables (1 << 30 floats = 4 GiB per table).
constexpr int kMaxServers = 256;
constexpr int kMaxClients = 4096;
constexpr int kMaxTables = 100000;
constexpr uint64_t kMaxTableFloats = uint64_t{1} << 30;
constexpr double kMaxSeconds = 86400;

absl::StatusOr<LoadFlags> ParseFlags() {
  LoadFlags f;
  f.servers = absl::GetFlag(FLAGS_servers);
  f.clients = absl::GetFlag(FLAGS_clients);
  f.tables = absl::GetFlag(FLAGS_tables);
  f.table_floats = absl::GetFlag(FLAGS_table_floats);
  f.optimizer = absl::AsciiStrToUpper(absl::GetFlag(FLAGS_optimizer));
  f.seconds = absl::GetFlag(FLAGS_seconds);
  f.checkpoint_interval = absl::GetFlag(FLAGS_checkpoint_interval);
  f.server_binary = absl::GetFlag(FLAGS_server_binary);
  f.keep_temp = absl::GetFlag(FLAGS_keep_temp);
  using common::CheckDoubleFlagRange;
  using common::CheckIntFlagRange;
  RETURN_IF_ERROR(common::AllFlagsInRange({
      CheckIntFlagRange("servers", f.servers, 1, kMaxServers, absl::StrCat("1..", kMaxServers)),
      CheckIntFlagRange("clients", f.clients, 1, kMaxClients, absl::StrCat("1..", kMaxClients)),
      CheckIntFlagRange("tables", f.tables, 1, kMaxTables, absl::StrCat("1..", kMaxTables)),
      CheckIntFlagRange("table_floats", f.table_floats, 1, kMaxTableFloats,
                        absl::StrCat("1..", kMaxTableFloats)),
      CheckDoubleFlagRange("seconds", f.seconds, 1e-3, kMaxSeconds, "0.001..86400 seconds"),
      CheckDoubleFlagRange("checkpoint_interval", f.checkpoint_interval, 0, kMaxSeconds,
                           "0 (none) or seconds up to 86400"),
  }));
  if (f.optimizer != "SGD" && f.optimizer != "MOMENTUM" && f.optimizer != "ADAGRAD" &&
      f.optimizer != "ADAM" && f.optimizer != "FTRL") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--optimizer=", f.optimizer, " is not one of SGD, MOMENTUM, ADAGRAD, ADAM, FTRL"));
  }
  return f;
}

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

std::string Config(const LoadFlags& f) {
  std::string text = absl::StrFormat(
      "cluster { num_servers: %d num_workers: %d dense_block_floats: 262144 }\n"
      "security { plaintext: true }\ncheckpoint { interval_s: %g }\n",
      f.servers, f.clients, f.checkpoint_interval);
  for (int t = 0; t < f.tables; ++t) {
    absl::StrAppendFormat(&text,
                          "tables { name: \"t%d\" kind: TABLE_KIND_DENSE shape: %d "
                          "initializer { kind: UNIFORM low: -0.1 high: 0.1 } "
                          "optimizer { kind: %s learning_rate: 0.001 } }\n",
                          t, f.table_floats, f.optimizer);
  }
  return text;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> StartServers(const LoadFlags& f,
                                                            const std::string& config_text) {
  LocalClusterOptions options;
  options.server_binary =
      f.server_binary.empty() ? SelfDir() + "/../server/ps_server" : f.server_binary;
  options.num_servers = f.servers;
  options.config_text = config_text;
  options.start_timeout = absl::Seconds(120);
  options.keep_dir = f.keep_temp;
  // Servers write a final checkpoint on SIGTERM: a big table needs more than a few seconds.
  options.stop_grace = absl::Minutes(2);
  return LocalCluster::Start(options);
}

// One store per simulated worker (worker ids 0..clients-1: real worker slots).
absl::StatusOr<std::vector<std::unique_ptr<worker::GrpcParameterStore>>> MakeStores(
    const JobConfig& config, int clients) {
  std::vector<std::unique_ptr<worker::GrpcParameterStore>> stores;
  for (int c = 0; c < clients; ++c) {
    worker::GrpcStoreOptions options;
    options.worker_id = c;
    options.worker_incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
    options.deadline = absl::Seconds(120);
    // As a worker of the job: shared memory with the servers on this host (config defaults).
    options.shared_memory_bytes = size_t{config.rpc().shared_memory_mb()} << 20;
    options.shared_memory_calls = config.rpc().shared_memory_calls();
    options.overlap_push_copy = config.rpc().overlap_push_copy();
    options.handoff = config.rpc().handoff();
    ASSIGN_OR_RETURN(auto store, worker::GrpcParameterStore::Create(config, options));
    RETURN_IF_ERROR(store->WaitForServers(absl::Seconds(60)));
    stores.push_back(std::move(store));
  }
  return stores;
}

// The simulated workers: one call pulls one random table, then pushes a gradient for it.
// Failed calls are counted (the first one kept), not returned: the load goes on. Call(c) is
// thread-compatible per c (one thread per client).
class Workload {
 public:
  Workload(const LoadFlags& f, std::vector<worker::GrpcParameterStore*> stores)
      : tables_(f.tables),
        stores_(std::move(stores)),
        buffers_(f.clients, std::vector<float>(f.table_floats)),
        clocks_(f.clients, 0) {
    for (int c = 0; c < f.clients; ++c) rngs_.emplace_back(c + 1);
  }

  absl::Status Call(int c) {
    const std::string table = absl::StrCat("t", rngs_[c]() % tables_);
    std::vector<float>& buf = buffers_[c];
    common::PullBatch pull;
    pull.dense.push_back({table, absl::MakeSpan(buf)});
    absl::Status s = stores_[c]->Pull(pull, {clocks_[c]});
    if (s.ok()) {
      for (size_t i = 0; i < buf.size(); i += 1024) buf[i] = 0.001f * (i % 7);
      common::PushBatch push;
      push.dense.push_back({table, buf});
      s = stores_[c]->Push(push, {++clocks_[c], false});
    }
    if (!s.ok()) {
      ++errors_;
      absl::MutexLock lock(&error_mu_);
      if (first_error_.empty()) first_error_ = s.ToString();
    }
    return absl::OkStatus();
  }

  uint64_t errors() const { return errors_.load(); }
  std::string first_error() {
    absl::MutexLock lock(&error_mu_);
    return first_error_;
  }

 private:
  const int tables_;
  const std::vector<worker::GrpcParameterStore*> stores_;  // Not owned.
  std::vector<std::vector<float>> buffers_;
  std::vector<int64_t> clocks_;
  std::vector<std::mt19937> rngs_;
  std::atomic<uint64_t> errors_{0};
  absl::Mutex error_mu_;
  std::string first_error_ ABSL_GUARDED_BY(error_mu_);
};

void PrintReport(const LoadFlags& f, const LoadResult& result, Workload* work,
                 const std::vector<std::pair<double, double>>& before,
                 const std::vector<std::pair<double, double>>& after) {
  const uint64_t n = f.table_floats;
  const double mb_per_call = 2.0 * n * sizeof(float) / (1 << 20);
  const std::string first_error = work->first_error();
  std::printf("ps_load: %d servers, %d clients, %d tables x %llu floats (%s), %.0f s\n", f.servers,
              f.clients, f.tables, static_cast<unsigned long long>(n), f.optimizer.c_str(),
              result.seconds);
  std::printf("  calls (pull+push): %llu, %.1f calls/s, %.1f MB/s, p50 %.2f ms, p99 %.2f ms, "
              "errors %llu%s%s\n",
              static_cast<unsigned long long>(result.calls), result.calls_per_second,
              result.calls_per_second * mb_per_call, result.Percentile(0.5),
              result.Percentile(0.99), static_cast<unsigned long long>(work->errors()),
              first_error.empty() ? "" : " first: ", first_error.c_str());
  const double state_mb = f.tables * static_cast<double>(n) * sizeof(float) / (1 << 20) / f.servers;
  for (size_t i = 0; i < after.size(); ++i) {
    std::printf("  server %zu: RSS %.0f MiB before, %.0f MiB after, peak %.0f MiB "
                "(parameters only: %.0f MiB per server before slots)\n",
                i, before[i].first, after[i].first, after[i].second, state_mb);
  }
}

absl::Status Run() {
  ASSIGN_OR_RETURN(const LoadFlags f, ParseFlags());
  const std::string config_text = Config(f);
  ASSIGN_OR_RETURN(auto cluster, StartServers(f, config_text));
  ASSIGN_OR_RETURN(JobConfig config, common::ParseJobConfigText(config_text, "ps_load"));
  RETURN_IF_ERROR(common::ExpandModelTables(&config));
  for (const auto& a : cluster->addresses()) config.mutable_cluster()->add_servers(a);
  ASSIGN_OR_RETURN(auto stores, MakeStores(config, f.clients));
  std::vector<worker::GrpcParameterStore*> borrowed;
  for (auto& s : stores) borrowed.push_back(s.get());
  std::vector<std::pair<double, double>> before, after;
  for (pid_t pid : cluster->pids()) before.push_back(Memory(pid));

  Workload work(f, std::move(borrowed));
  LoadOptions load;
  load.threads = f.clients;
  load.warmup = absl::Seconds(1);
  load.duration = absl::Seconds(f.seconds);
  ASSIGN_OR_RETURN(LoadResult result,
                   RunLoad(load, [&work](int c) { return work.Call(c); }, nullptr));
  for (pid_t pid : cluster->pids()) after.push_back(Memory(pid));
  RETURN_IF_ERROR(cluster->CheckRunning());
  PrintReport(f, result, &work, before, after);
  cluster->Stop();
  RETURN_IF_ERROR(cluster->CheckExitedCleanly());
  return work.errors() == 0
             ? absl::OkStatus()
             : absl::InternalError(absl::StrCat(work.errors(), " calls failed"));
}

}  // namespace
}  // namespace ps::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status s = ps::bench::Run();
  if (!s.ok()) {
    std::cerr << "ps_load: " << s << std::endl;
    return 1;
  }
  return 0;
}
