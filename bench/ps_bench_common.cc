// What ps_bench's modes share (bench/ps_bench.h): options, the signal stopper, the
// median-of-runs driver with the processes' costs per call, the report, the client stores.

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/ps_bench.h"
#include "common/config/config.h"
#include "common/status_macros.h"

namespace ps::bench {

namespace {

constexpr char kDensePrefix[] = "bench/dense_";
constexpr char kSparsePrefix[] = "bench/sparse_dim";

}  // namespace

std::string DenseTableName(uint64_t bytes) { return kDensePrefix + FormatBytes(bytes); }
std::string SparseTableName(int dim) { return absl::StrCat(kSparsePrefix, dim); }

int MaxClients(const BenchOptions& options) {
  int max_clients = 1;
  for (int c : options.clients) max_clients = std::max(max_clients, c);
  return max_clients;
}

std::string KeysLabel(uint64_t num_keys) {
  return num_keys % 1000 == 0 ? absl::StrCat(num_keys / 1000, "k keys")
                              : absl::StrCat(num_keys, " keys");
}

std::string BenchConfigText(const BenchOptions& f, int num_servers) {
  const int max_clients = MaxClients(f);
  std::string text = absl::StrCat(
      "# Written by bench/ps_bench: the bench tables, asynchronous, SGD, no checkpoints.\n",
      "name: \"ps_bench\"\n", "cluster {\n  num_servers: ", num_servers,
      "\n  num_workers: ", max_clients,
      "\n  dense_block_floats: ", f.dense_block_floats, "\n}\n",
      "default_optimizer { kind: SGD learning_rate: 0.01 }\n");
  std::string server;
  std::string rpc;
  if (f.busy_poll_us >= 0) {
    absl::StrAppend(&server, " busy_poll_us: ", f.busy_poll_us);
    absl::StrAppend(&rpc, " busy_poll_us: ", f.busy_poll_us);
  }
  if (f.shared_memory_mb >= 0) {
    absl::StrAppend(&server, " max_shared_memory_mb: ", f.shared_memory_mb);
    absl::StrAppend(&rpc, " shared_memory_mb: ", f.shared_memory_mb);
  }
  if (!f.shared_memory_calls) absl::StrAppend(&rpc, " shared_memory_calls: false");
  if (!f.overlap_push_copy) absl::StrAppend(&rpc, " overlap_push_copy: false");
  if (!f.handoff.empty())
    absl::StrAppend(&rpc, " handoff: HANDOFF_", absl::AsciiStrToUpper(f.handoff));
  if (f.data_threads >= 0) absl::StrAppend(&server, " data_threads: ", f.data_threads);
  if (f.apply_threads >= 0) absl::StrAppend(&server, " apply_threads: ", f.apply_threads);
  if (!rpc.empty()) absl::StrAppend(&text, "rpc {", rpc, " }\n");
  if (!server.empty()) absl::StrAppend(&text, "server {", server, " }\n");
  for (uint64_t bytes : f.payloads) {
    absl::StrAppend(&text, "tables {\n  name: \"", DenseTableName(bytes),
                    "\"\n  kind: TABLE_KIND_DENSE\n  shape: ", bytes / sizeof(float),
                    "\n  initializer { kind: ZEROS }\n}\n");
  }
  absl::StrAppend(&text, "tables {\n  name: \"", SparseTableName(f.sparse_dim),
                  "\"\n  kind: TABLE_KIND_SPARSE\n  dim: ", f.sparse_dim,
                  "\n  initializer { kind: ZEROS }\n}\n",
                  "checkpoint {\n  interval_s: 0\n  on_shutdown: false\n}\n",
                  "security { plaintext: true }\n");
  return text;
}

namespace {

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

}  // namespace

// --server_binary, else this binary's runfiles (the target has ps_server as data), else
// bazel-bin/server/ps_server next to bazel-bin/bench/ps_bench.
std::string FindServerBinary(const BenchOptions& options) {
  if (!options.server_binary.empty()) return options.server_binary;
  const std::string self = SelfPath();
  std::vector<std::string> candidates = {self + ".runfiles/ps/server/ps_server"};
  if (const auto dir = std::filesystem::path(self).parent_path(); !dir.empty()) {
    candidates.push_back((dir.parent_path() / "server" / "ps_server").string());
  }
  candidates.push_back("bazel-bin/server/ps_server");
  for (const std::string& c : candidates) {
    std::error_code ec;
    if (std::filesystem::exists(c, ec)) return c;
  }
  return candidates.back();
}

SignalStopper::SignalStopper() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  thread_ = std::thread([this] { Loop(); });
}

SignalStopper::~SignalStopper() {
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  pthread_kill(thread_.native_handle(), SIGTERM);
  thread_.join();
}

void SignalStopper::Watch(LocalCluster* cluster, bool keep_dir) {
  absl::MutexLock lock(&mu_);
  cluster_ = cluster;
  keep_dir_ = keep_dir;
}

void SignalStopper::Loop() {
  int sig = 0;
  sigwait(&set_, &sig);
  absl::MutexLock lock(&mu_);
  if (done_) return;
  cancelled_ = true;
  std::cerr << "\nps_bench: signal " << sig << ": stopping the servers" << std::endl;
  if (cluster_ != nullptr) {
    cluster_->Stop();
    std::error_code ec;
    if (!keep_dir_) std::filesystem::remove_all(cluster_->dir(), ec);
  }
  _exit(128 + sig);
}

BenchRow MakeRow(std::string mode, std::string op, std::string payload, uint64_t payload_bytes,
                 uint64_t rows, int clients, int window, const LoadResult& r) {
  BenchRow row;
  row.mode = std::move(mode);
  row.op = std::move(op);
  row.payload = std::move(payload);
  row.payload_bytes = payload_bytes;
  row.rows_per_call = rows;
  row.clients = clients;
  row.window = window;
  row.calls = r.calls;
  row.seconds = r.seconds;
  row.calls_per_second = r.calls_per_second;
  row.mb_per_second = r.calls_per_second * static_cast<double>(payload_bytes) / (1 << 20);
  row.rows_per_second = r.calls_per_second * static_cast<double>(rows);
  row.p50_ms = r.Percentile(0.50);
  row.p99_ms = r.Percentile(0.99);
  return row;
}

namespace {

// CPU time, minor page faults and context switches of a set of processes.
struct Usage {
  double cpu_s = 0;
  double minor_faults = 0;
  double switches = 0;
};

Usage SelfUsage() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  Usage u;
  u.cpu_s = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
            1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  u.minor_faults = static_cast<double>(ru.ru_minflt);
  u.switches = static_cast<double>(ru.ru_nvcsw + ru.ru_nivcsw);
  return u;
}

// The sum over `pids`, from /proc (what cannot be read counts as zero). Context switches are
// summed over the live threads (/proc/<pid>/task/*/status).
Usage ProcUsage(const std::vector<pid_t>& pids) {
  Usage u;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  for (pid_t pid : pids) {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos) continue;
    // After the command name: state (field 3), ..., minflt (10), ..., utime (14), stime (15).
    std::vector<std::string> f = absl::StrSplit(text.substr(paren + 2), ' ');
    double minflt = 0, utime = 0, stime = 0;
    if (f.size() > 12 && absl::SimpleAtod(f[7], &minflt) && absl::SimpleAtod(f[11], &utime) &&
        absl::SimpleAtod(f[12], &stime)) {
      u.minor_faults += minflt;
      u.cpu_s += (utime + stime) / tick;
    }
    std::error_code ec;
    for (const auto& task :
         std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
      std::ifstream status(task.path() / "status");
      std::string line;
      while (std::getline(status, line)) {
        double n = 0;
        for (const char* key : {"voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"}) {
          if (absl::StartsWith(line, key) &&
              absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(strlen(key))), &n)) {
            u.switches += n;
          }
        }
      }
    }
  }
  return u;
}

BenchRow::Usage PerCall(const Usage& before, const Usage& after, uint64_t calls) {
  BenchRow::Usage u;
  const double n = std::max<double>(1, static_cast<double>(calls));
  u.cpu_us = 1e6 * (after.cpu_s - before.cpu_s) / n;
  u.minor_faults = (after.minor_faults - before.minor_faults) / n;
  u.context_switches = (after.switches - before.switches) / n;
  return u;
}

}  // namespace

uint64_t TotalRetries(const BenchEnv& env) {
  uint64_t n = 0;
  for (auto* s : env.stores) n += s->stats().retries;
  return n;
}

namespace {

// RunChecked's driver: prime() twice, then run() --repeat times (each resets and counts the
// calls it makes in `*calls`); returns the run with the median throughput.
absl::StatusOr<LoadResult> RunMedian(const BenchEnv& env, const std::string& what,
                                     BenchRow* row, const std::function<absl::Status()>& prime,
                                     const std::function<absl::StatusOr<LoadResult>()>& run,
                                     std::atomic<uint64_t>* calls) {
  const std::vector<pid_t> servers =
      env.cluster != nullptr ? env.cluster->pids() : env.server_pids;
  std::vector<LoadResult> runs;
  std::map<double, std::pair<BenchRow::Usage, BenchRow::Usage>> usage;  // by calls/s
  // Two calls per thread first, so that the costs per call are those of the steady state, not
  // of first touches of the run's buffers (a 64 MB run makes few calls): a store's first call
  // to a server on this host asks for a shared-memory segment and goes by the socket, and only
  // its second touches the segment (before 2026-12-06 that first touch, 16,384 faults for a
  // 64 MB payload, was counted in the measured calls' CPU and faults).
  for (int round = 0; round < 2; ++round) RETURN_IF_ERROR_CTX(prime(), what);
  for (int i = 0; i < env.flags->repeat; ++i) {
    *calls = 0;
    const Usage client_before = SelfUsage(), server_before = ProcUsage(servers);
    absl::StatusOr<LoadResult> r = run();
    if (r.ok()) {
      usage[r->calls_per_second] = {PerCall(client_before, SelfUsage(), *calls),
                                    PerCall(server_before, ProcUsage(servers), *calls)};
    }
    absl::Status servers =
        env.cluster != nullptr ? env.cluster->CheckRunning() : absl::OkStatus();
    if (!r.ok() || !servers.ok()) {
      absl::Status s = r.ok() ? servers : r.status();
      std::string message = absl::StrCat(what, ": ", s.message());
      if (!r.ok() && !servers.ok()) absl::StrAppend(&message, "\n", servers.message());
      return absl::Status(s.code(), message);
    }
    runs.push_back(*std::move(r));
  }
  std::sort(runs.begin(), runs.end(), [](const LoadResult& a, const LoadResult& b) {
    return a.calls_per_second < b.calls_per_second;
  });
  LoadResult& median = runs[runs.size() / 2];
  if (row != nullptr) {
    row->client_per_call = usage[median.calls_per_second].first;
    if (!servers.empty()) row->server_per_call = usage[median.calls_per_second].second;
  }
  return std::move(median);
}

}  // namespace

absl::StatusOr<LoadResult> RunChecked(const BenchEnv& env, int threads, const LoadCall& call,
                                      const std::string& what, BenchRow* row) {
  LoadOptions options = env.flags->load;
  options.threads = threads;
  std::atomic<uint64_t> calls{0};
  const LoadCall counted = [&](int t) {
    calls.fetch_add(1, std::memory_order_relaxed);
    return call(t);
  };
  auto prime = [&]() -> absl::Status {
    for (int t = 0; t < threads; ++t) RETURN_IF_ERROR(call(t));
    return absl::OkStatus();
  };
  return RunMedian(
      env, what, row, prime, [&] { return RunLoad(options, counted, env.cancel); }, &calls);
}

absl::StatusOr<LoadResult> RunCheckedWindow(const BenchEnv& env, int threads, int window,
                                            const WindowCalls& calls, const std::string& what,
                                            BenchRow* row) {
  LoadOptions options = env.flags->load;
  options.threads = threads;
  std::atomic<uint64_t> reaped{0};
  WindowCalls counted = calls;
  counted.reap = [&](int t) {
    reaped.fetch_add(1, std::memory_order_relaxed);
    return calls.reap(t);
  };
  // Every slot of every thread once.
  auto prime = [&]() -> absl::Status {
    for (int t = 0; t < threads; ++t) {
      for (int slot = 0; slot < window; ++slot) RETURN_IF_ERROR(calls.start(t, slot));
      for (int slot = 0; slot < window; ++slot) RETURN_IF_ERROR(calls.reap(t).status());
    }
    return absl::OkStatus();
  };
  return RunMedian(
      env, what, row, prime, [&] { return RunWindowLoad(options, window, counted, env.cancel); },
      &reaped);
}

void Reporter::Add(const BenchRow& row) {
  rows_.push_back(row);
  std::cerr << absl::StrFormat("  %-4s %-11s %-10s clients=%d window=%d: ", row.mode, row.op,
                               row.payload, row.clients, row.window)
            << (row.calls > 0 ? absl::StrFormat("%.1f calls/s, ", row.calls_per_second) : "")
            << absl::StrFormat("%.1f MB/s", row.mb_per_second)
            << (row.rows_per_second > 0 ? absl::StrFormat(", %.0f rows/s", row.rows_per_second)
                                        : "")
            << (row.hit_ratio.has_value()
                    ? absl::StrFormat(", %.1f%% of rows from memory", 100 * *row.hit_ratio)
                    : "");
  for (const auto& [side, usage] : {std::make_pair("client", &row.client_per_call),
                                    std::make_pair("servers", &row.server_per_call)}) {
    if (!usage->has_value()) continue;
    std::cerr << absl::StrFormat("; %s per call: %.0f us CPU, %.1f minor faults, %.1f switches",
                                 side, (*usage)->cpu_us, (*usage)->minor_faults,
                                 (*usage)->context_switches);
  }
  std::cerr << std::endl;
  if (json_ != nullptr) *json_ << ToJsonLine(row) << std::endl;
}

absl::StatusOr<std::vector<std::unique_ptr<worker::GrpcParameterStore>>> MakeStores(
    const JobConfig& config, int n, BenchEnv* env) {
  std::vector<std::unique_ptr<worker::GrpcParameterStore>> stores;
  const uint64_t incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  for (int i = 0; i < n; ++i) {
    worker::GrpcStoreOptions options;
    options.worker_id = i;
    options.worker_incarnation = incarnation;
    options.deadline = absl::Seconds(config.rpc().deadline_s());
    options.max_retries = config.rpc().max_retries();
    options.pull_piece_bytes = env->flags->pull_piece_bytes;
    options.parallel_copy_bytes = env->flags->parallel_copy_bytes;
    options.busy_poll = absl::Microseconds(config.rpc().busy_poll_us());
    options.shared_memory_bytes = size_t{config.rpc().shared_memory_mb()} << 20;
    options.shared_memory_calls = config.rpc().shared_memory_calls();
    options.overlap_push_copy = config.rpc().overlap_push_copy();
    options.handoff = config.rpc().handoff();
    ASSIGN_OR_RETURN(auto store, worker::GrpcParameterStore::Create(config, options));
    stores.push_back(std::move(store));
    env->stores.push_back(stores.back().get());
  }
  RETURN_IF_ERROR(stores[0]->WaitForServers(absl::Seconds(30)));
  return stores;
}

absl::StatusOr<JobConfig> ClientConfig(const std::string& path,
                                       const std::vector<std::string>& addresses) {
  ASSIGN_OR_RETURN(JobConfig config, common::LoadAndPrepareJobConfig(path, {}));
  const uint32_t declared = config.cluster().num_servers() > 0
                                ? config.cluster().num_servers()
                                : static_cast<uint32_t>(config.cluster().servers_size());
  if (declared != addresses.size()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " describes ", declared, " servers but ",
                                                   addresses.size(), " addresses are given"));
  }
  config.mutable_cluster()->clear_servers();
  for (const auto& a : addresses) config.mutable_cluster()->add_servers(a);
  if (config.training().has_staleness()) {
    std::cerr << "warning: " << path << " sets training.staleness; the bench clients never "
              << "advance their clocks, so pulls may wait" << std::endl;
  }
  return config;
}

}  // namespace ps::bench
