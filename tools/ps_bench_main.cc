// ps_bench: transport benchmark of the parameter servers over 127.0.0.1.
//
//   bazel build //tools:ps_bench && bazel-bin/tools/ps_bench --seconds=2 --json=bench.jsonl
//
// Starts --servers ps_server processes (tables-only config, plaintext, no checkpoints, each
// with a temporary data dir), or uses running ones (--connect=host:port,... --config=F, where F
// is the servers' config and holds the bench tables; --write_config=F writes one). Then, each
// for --seconds after a --warmup:
//   tcp    raw-socket request/reply (client sends the payload, server reads it all and answers
//          8 bytes) for every payload, one connection; and one-way streaming bandwidth.
//   dense  GrpcParameterStore push and pull of one dense table per payload, for every client
//          count; a client is its own store with its own worker id (0..C-1, asynchronous),
//          running --window calls in flight (one thread per call).
//   sparse GrpcParameterStore pulls of --sparse_keys uniform keys from a --key_space key space.
//   spill  (not in the default --modes) pulls of --sparse_keys unique keys drawn from a Zipf
//          (--zipf) stream over --key_space rows, once per --spill_budgets entry: fresh servers
//          whose sparse table keeps at most that percentage of its rows in memory
//          (memory_budget_rows; 100 = no budget), the rest spilled to their data dirs. Reports
//          rows/s and the share of rows served from memory (the servers' fault counters).
// Dense and sparse rows also report costs per call in the steady state (after one call per
// thread): CPU time, minor page faults and context switches of this process and of the started
// servers (from getrusage and /proc). Prints a table (and JSON lines with --json). Servers are
// stopped on exit and on Ctrl-C.
#include <pthread.h>
#include <sys/resource.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/parameter_store.h"
#include "common/rpc/credentials.h"
#include "common/rpc/grpc_status.h"
#include "common/startup/process_memory.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "proto/config.pb.h"
#include "proto/ps.grpc.pb.h"
#include "tools/bench_load.h"
#include "tools/bench_report.h"
#include "tools/local_cluster.h"
#include "tools/raw_tcp.h"
#include "worker/rpc/grpc_store.h"

ABSL_FLAG(int32_t, servers, 2, "Number of ps_server processes to start.");
ABSL_FLAG(std::string, server_binary, "",
          "The ps_server binary; default: found next to this binary (bazel-bin/server/ps_server "
          "or this binary's runfiles).");
ABSL_FLAG(std::string, connect, "",
          "Use running servers host:port,... (index order) instead of starting any; needs "
          "--config. Do not point it at servers a job is using: the bench pushes as workers "
          "0..C-1.");
ABSL_FLAG(std::string, config, "",
          "With --connect: the servers' JobConfig (must declare the bench tables; see "
          "--write_config).");
ABSL_FLAG(std::string, write_config, "",
          "Write the bench's tables-only config for --servers servers to this file and exit.");
ABSL_FLAG(std::string, modes, "tcp,dense,sparse",
          "What to measure: any of tcp,dense,sparse,spill (spill: see --spill_budgets).");
ABSL_FLAG(std::string, payloads, "4KB,1MB,64MB",
          "Dense and raw-TCP payloads per call (B, KB, MB; KB = 1024 bytes; multiples of 4).");
ABSL_FLAG(std::string, clients, "1,2,4", "Concurrent client counts for dense and sparse.");
ABSL_FLAG(std::string, dense_ops, "push,pull", "Dense operations to measure: push, pull or both.");
ABSL_FLAG(int32_t, window, 1, "Calls in flight per client (threads per client).");
ABSL_FLAG(std::string, sparse_keys, "1000,10000", "Keys per sparse pull or push.");
ABSL_FLAG(std::string, sparse_ops, "pull,push",
          "Sparse operations to measure: pull, push or both (a push sends one gradient row per "
          "key; the server applies it with SGD).");
ABSL_FLAG(int32_t, sparse_dim, 16, "Width of the sparse table's rows.");
ABSL_FLAG(uint64_t, key_space, 1000000, "Sparse keys are drawn uniformly from [0, key_space).");
ABSL_FLAG(bool, sparse_prefill, true,
          "Pull the whole key space once before the sparse runs, so that row creation (first "
          "touch) is not measured.");
ABSL_FLAG(uint64_t, dense_block_floats, 262144,
          "cluster.dense_block_floats of the generated config (262144 = 1 MB blocks).");
ABSL_FLAG(double, seconds, 2, "Length of each measurement, seconds.");
ABSL_FLAG(double, warmup, 0.5, "Warm-up before each measurement, seconds.");
ABSL_FLAG(int32_t, repeat, 1,
          "Run each measurement this many times and report the run with the median calls/s "
          "(bandwidth for the TCP stream): steadier numbers on a shared machine.");
ABSL_FLAG(size_t, tcp_stream_write, 4 << 20, "Bytes per write() of the TCP streaming test.");
ABSL_FLAG(std::string, json, "", "Also write one JSON object per measurement to this file.");
ABSL_FLAG(bool, keep_temp, false, "Keep the servers' temporary directory (logs, data dirs).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the sparse key draws.");
ABSL_FLAG(std::string, spill_budgets, "100,25,5",
          "spill mode: the rows each server may keep in memory, in percent of its share of the "
          "--key_space rows; 100 = no memory_budget_rows (every row in memory).");
ABSL_FLAG(double, zipf, 1.1,
          "spill mode: key k of [0, key_space) is drawn with probability ~ (k + 1)^-zipf "
          "(0 = uniform).");
ABSL_FLAG(uint64_t, zipf_stream_keys, 2000000,
          "spill mode: keys pre-drawn for each client thread (in pulls of --sparse_keys unique "
          "keys), cycled through; the same streams serve every budget.");
ABSL_FLAG(double, spill_settle_s, 5,
          "spill mode: pause after the prefill, so that the servers' RocksDB has compacted what "
          "the prefill spilled before anything is measured.");

namespace ps::tools {
namespace {

constexpr char kDensePrefix[] = "bench/dense_";
constexpr char kSparsePrefix[] = "bench/sparse_dim";

// ---- Flags --------------------------------------------------------------------------------

struct BenchFlags {
  std::vector<uint64_t> payloads;
  std::vector<int> clients;
  std::vector<uint64_t> sparse_keys;
  bool tcp = false, dense = false, sparse = false, spill = false;
  std::vector<int> spill_budgets;  // percent of the rows in memory
  std::vector<bool> dense_ops;  // true = push, false = pull
  std::vector<bool> sparse_ops;  // true = push, false = pull
  int window = 1;
  int repeat = 1;
  LoadOptions load;
};

absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  std::string t = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  uint64_t unit = 1;
  for (const auto& [suffix, u] : std::vector<std::pair<std::string, uint64_t>>{
           {"MB", 1 << 20}, {"M", 1 << 20}, {"KB", 1 << 10}, {"K", 1 << 10}, {"B", 1}}) {
    if (absl::EndsWith(t, suffix)) {
      t.resize(t.size() - suffix.size());
      unit = u;
      break;
    }
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(t, &n) || n == 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad size '", text, "'"));
  }
  return n * unit;
}

template <typename T>
absl::StatusOr<std::vector<T>> ParseList(const std::string& flag, const std::string& text) {
  std::vector<T> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    T v{};
    if (!absl::SimpleAtoi(item, &v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": bad number '", item, "'"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return out;
}

absl::StatusOr<BenchFlags> ParseFlags() {
  BenchFlags f;
  for (absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_payloads), ',', absl::SkipWhitespace())) {
    ASSIGN_OR_RETURN(uint64_t bytes, ParseSize(item), "--payloads");
    if (bytes % sizeof(float) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--payloads: ", item, " is not whole floats"));
    }
    f.payloads.push_back(bytes);
  }
  ASSIGN_OR_RETURN(f.clients, ParseList<int>("clients", absl::GetFlag(FLAGS_clients)));
  ASSIGN_OR_RETURN(f.sparse_keys,
                   ParseList<uint64_t>("sparse_keys", absl::GetFlag(FLAGS_sparse_keys)));
  for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',', absl::SkipEmpty())) {
    if (m == "tcp") {
      f.tcp = true;
    } else if (m == "dense") {
      f.dense = true;
    } else if (m == "sparse") {
      f.sparse = true;
    } else if (m == "spill") {
      f.spill = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--modes: unknown mode '", m, "'"));
    }
  }
  for (absl::string_view op :
       absl::StrSplit(absl::GetFlag(FLAGS_dense_ops), ',', absl::SkipWhitespace())) {
    if (op != "push" && op != "pull") {
      return absl::InvalidArgumentError(absl::StrCat("--dense_ops: unknown op '", op, "'"));
    }
    f.dense_ops.push_back(op == "push");
  }
  for (absl::string_view op :
       absl::StrSplit(absl::GetFlag(FLAGS_sparse_ops), ',', absl::SkipWhitespace())) {
    if (op != "push" && op != "pull") {
      return absl::InvalidArgumentError(absl::StrCat("--sparse_ops: unknown op '", op, "'"));
    }
    f.sparse_ops.push_back(op == "push");
  }
  ASSIGN_OR_RETURN(f.spill_budgets,
                   ParseList<int>("spill_budgets", absl::GetFlag(FLAGS_spill_budgets)));
  for (int b : f.spill_budgets) {
    if (b > 100) return absl::InvalidArgumentError("--spill_budgets: percentages are 1..100");
  }
  if (f.spill && !(absl::GetFlag(FLAGS_zipf) >= 0)) {
    return absl::InvalidArgumentError("--zipf must be >= 0");
  }
  if (absl::GetFlag(FLAGS_zipf_stream_keys) < 1) {
    return absl::InvalidArgumentError("--zipf_stream_keys must be >= 1");
  }
  f.window = absl::GetFlag(FLAGS_window);
  if (f.window < 1) return absl::InvalidArgumentError("--window must be >= 1");
  f.repeat = absl::GetFlag(FLAGS_repeat);
  if (f.repeat < 1) return absl::InvalidArgumentError("--repeat must be >= 1");
  if (absl::GetFlag(FLAGS_seconds) <= 0 || absl::GetFlag(FLAGS_warmup) < 0) {
    return absl::InvalidArgumentError("--seconds must be > 0 and --warmup >= 0");
  }
  if (f.payloads.empty()) return absl::InvalidArgumentError("--payloads is empty");
  f.load.duration = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  f.load.warmup = absl::Seconds(absl::GetFlag(FLAGS_warmup));
  return f;
}

std::string DenseTableName(uint64_t bytes) { return kDensePrefix + FormatBytes(bytes); }
std::string SparseTableName(int dim) { return absl::StrCat(kSparsePrefix, dim); }

// ---- Config -------------------------------------------------------------------------------

// The tables-only job config the bench's servers run with: one dense table per payload, one
// sparse table, SGD everywhere (a push does real work), asynchronous (no staleness), no
// checkpoints, plaintext.
std::string BenchConfigText(const BenchFlags& f, int num_servers) {
  int max_clients = 1;
  for (int c : f.clients) max_clients = std::max(max_clients, c);
  std::string text = absl::StrCat(
      "# Written by tools/ps_bench: the bench tables, asynchronous, SGD, no checkpoints.\n",
      "name: \"ps_bench\"\n", "cluster {\n  num_servers: ", num_servers,
      "\n  num_workers: ", max_clients,
      "\n  dense_block_floats: ", absl::GetFlag(FLAGS_dense_block_floats), "\n}\n",
      "default_optimizer { kind: SGD learning_rate: 0.01 }\n");
  for (uint64_t bytes : f.payloads) {
    absl::StrAppend(&text, "tables {\n  name: \"", DenseTableName(bytes),
                    "\"\n  kind: TABLE_KIND_DENSE\n  shape: ", bytes / sizeof(float),
                    "\n  initializer { kind: ZEROS }\n}\n");
  }
  absl::StrAppend(&text, "tables {\n  name: \"", SparseTableName(absl::GetFlag(FLAGS_sparse_dim)),
                  "\"\n  kind: TABLE_KIND_SPARSE\n  dim: ", absl::GetFlag(FLAGS_sparse_dim),
                  "\n  initializer { kind: ZEROS }\n}\n",
                  "checkpoint {\n  interval_s: 0\n  on_shutdown: false\n}\n",
                  "security { plaintext: true }\n");
  return text;
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

// --server_binary, else this binary's runfiles (the target has ps_server as data), else
// bazel-bin/server/ps_server next to bazel-bin/tools/ps_bench.
std::string FindServerBinary() {
  if (!absl::GetFlag(FLAGS_server_binary).empty()) return absl::GetFlag(FLAGS_server_binary);
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

// ---- Ctrl-C -------------------------------------------------------------------------------

// Blocks SIGINT/SIGTERM in every thread (construct before starting any) and waits for them
// on its own thread: on a signal it cancels the run, stops the watched cluster (SIGTERM, then
// SIGKILL) and exits 128+signal. In-flight RPCs are not waited for: with their servers gone
// they would only retry. Thread-safe.
class SignalStopper {
 public:
  SignalStopper() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::thread([this] { Loop(); });
  }
  ~SignalStopper() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }
  // The cluster to stop on a signal (null: none). Not owned; call Watch(nullptr) before
  // destroying it.
  void Watch(LocalCluster* cluster, bool keep_dir) {
    absl::MutexLock lock(&mu_);
    cluster_ = cluster;
    keep_dir_ = keep_dir;
  }
  const std::atomic<bool>* cancelled() const { return &cancelled_; }

 private:
  void Loop() {
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

  sigset_t set_;
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  LocalCluster* cluster_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool keep_dir_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// ---- Measurements -------------------------------------------------------------------------

// Everything a measurement needs. Does not own its pointers.
struct BenchEnv {
  const BenchFlags* flags;
  std::vector<worker::GrpcParameterStore*> stores;  // store i = worker i
  LocalCluster* cluster = nullptr;                  // null with --connect
  const std::atomic<bool>* cancel;
  std::map<uint64_t, double> tcp_mb_per_s;  // req/reply baseline by payload
};

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

// ---- Cost per call -------------------------------------------------------------------------

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

uint64_t TotalRetries(const BenchEnv& env) {
  uint64_t n = 0;
  for (auto* s : env.stores) n += s->stats().retries;
  return n;
}

// Runs the load --repeat times and returns the run with the median throughput. When a run
// fails, says whether a server died and what it logged.
// With `row`, also fills its costs per call (of the median run).
absl::StatusOr<LoadResult> RunChecked(const BenchEnv& env, int threads, const LoadCall& call,
                                      const std::string& what, BenchRow* row = nullptr) {
  LoadOptions options = env.flags->load;
  options.threads = threads;
  std::vector<LoadResult> runs;
  std::atomic<uint64_t> calls{0};
  const LoadCall counted = [&](int t) {
    calls.fetch_add(1, std::memory_order_relaxed);
    return call(t);
  };
  const std::vector<pid_t> servers =
      env.cluster != nullptr ? env.cluster->pids() : std::vector<pid_t>();
  std::map<double, std::pair<BenchRow::Usage, BenchRow::Usage>> usage;  // by calls/s
  // One call per thread first, so that the costs per call are those of the steady state, not
  // of first touches of the run's buffers (a 64 MB run makes few calls).
  for (int t = 0; t < threads; ++t) RETURN_IF_ERROR_CTX(call(t), what);
  for (int i = 0; i < env.flags->repeat; ++i) {
    calls = 0;
    const Usage client_before = SelfUsage(), server_before = ProcUsage(servers);
    absl::StatusOr<LoadResult> r = RunLoad(options, counted, env.cancel);
    if (r.ok()) {
      usage[r->calls_per_second] = {PerCall(client_before, SelfUsage(), calls),
                                    PerCall(server_before, ProcUsage(servers), calls)};
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

absl::StatusOr<std::vector<BenchRow>> RunTcp(BenchEnv* env) {
  ASSIGN_OR_RETURN(auto server, RawTcpServer::Start());
  std::vector<BenchRow> rows;
  for (uint64_t bytes : env->flags->payloads) {
    ASSIGN_OR_RETURN(auto client, RawTcpClient::Connect(server->port()));
    const std::string payload(bytes, 'p');
    ASSIGN_OR_RETURN(LoadResult r,
                     RunChecked(*env, 1, [&](int) { return client->Call(payload); },
                                absl::StrCat("raw tcp ", FormatBytes(bytes))));
    rows.push_back(MakeRow("tcp", "req_reply", FormatBytes(bytes), bytes, 0, 1, 1, r));
    env->tcp_mb_per_s[bytes] = rows.back().mb_per_second;
  }
  const size_t write = absl::GetFlag(FLAGS_tcp_stream_write);
  std::vector<double> bandwidths;
  for (int i = 0; i < env->flags->repeat; ++i) {
    ASSIGN_OR_RETURN(double b,
                     MeasureStreamBandwidth(server->port(), write, env->flags->load.duration));
    bandwidths.push_back(b);
  }
  std::sort(bandwidths.begin(), bandwidths.end());
  const double bandwidth = bandwidths[bandwidths.size() / 2];
  BenchRow stream;
  stream.mode = "tcp";
  stream.op = "stream";
  stream.payload = absl::StrCat(FormatBytes(write), " writes");
  stream.payload_bytes = write;
  stream.seconds = absl::ToDoubleSeconds(env->flags->load.duration);
  stream.mb_per_second = bandwidth / (1 << 20);
  rows.push_back(stream);
  return rows;
}

absl::StatusOr<BenchRow> RunDense(const BenchEnv& env, uint64_t bytes, bool push, int clients) {
  const int window = env.flags->window;
  const int threads = clients * window;
  const std::string table = DenseTableName(bytes);
  const size_t numel = bytes / sizeof(float);
  // Small finite gradients: SGD moves the parameters a little on every push.
  const std::vector<float> gradient(push ? numel : 0, 1e-4f);
  std::vector<std::vector<float>> out(push ? 0 : threads, std::vector<float>(numel));
  auto call = [&](int t) -> absl::Status {
    worker::GrpcParameterStore* store = env.stores[t / window];
    if (push) {
      common::PushBatch batch;
      batch.dense.push_back({table, absl::MakeConstSpan(gradient)});
      return store->Push(batch, common::PushOptions{});
    }
    common::PullBatch batch;
    batch.dense.push_back({table, absl::MakeSpan(out[t])});
    return store->Pull(batch, common::PullOptions{});
  };
  const uint64_t retries = TotalRetries(env);
  BenchRow usage;
  ASSIGN_OR_RETURN(LoadResult r, RunChecked(env, threads, call,
                                            absl::StrCat("dense ", push ? "push " : "pull ",
                                                         FormatBytes(bytes), ", ", clients,
                                                         " clients"),
                                            &usage));
  BenchRow row = MakeRow("grpc", push ? "push" : "pull", FormatBytes(bytes), bytes, 0, clients,
                         window, r);
  row.client_per_call = usage.client_per_call;
  row.server_per_call = usage.server_per_call;
  row.retries = TotalRetries(env) - retries;
  if (auto it = env.tcp_mb_per_s.find(bytes); it != env.tcp_mb_per_s.end() && it->second > 0) {
    row.vs_tcp = row.mb_per_second / it->second;
  }
  return row;
}

// Pulls every key of the key space once (rows are created on first pull).
absl::Status PrefillSparse(const BenchEnv& env, const std::string& table, int dim) {
  const uint64_t space = absl::GetFlag(FLAGS_key_space);
  constexpr uint64_t kChunk = 65536;
  std::vector<uint64_t> keys;
  std::vector<float> out;
  const absl::Time start = absl::Now();
  for (uint64_t first = 0; first < space; first += kChunk) {
    if (env.cancel->load()) return absl::CancelledError("cancelled");
    keys.clear();
    for (uint64_t k = first; k < std::min(space, first + kChunk); ++k) keys.push_back(k);
    out.resize(keys.size() * dim);
    common::PullBatch batch;
    batch.sparse.push_back({table, keys, absl::MakeSpan(out)});
    RETURN_IF_ERROR_CTX(env.stores[0]->Pull(batch, common::PullOptions{}), "sparse prefill");
  }
  std::cerr << absl::StrFormat("sparse prefill: %d rows of dim %d created in %.2f s\n", space,
                               dim, absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::StatusOr<BenchRow> RunSparse(const BenchEnv& env, uint64_t num_keys, int clients,
                                   bool push) {
  const int window = env.flags->window;
  const int threads = clients * window;
  const int dim = absl::GetFlag(FLAGS_sparse_dim);
  const std::string table = SparseTableName(dim);
  // Key draws are made before measuring: a few batches per thread, used in turn.
  constexpr int kBatches = 8;
  std::vector<std::vector<std::vector<uint64_t>>> keys(threads);
  std::vector<std::vector<float>> out(threads, std::vector<float>(num_keys * dim));
  std::vector<int> next(threads, 0);
  for (int t = 0; t < threads; ++t) {
    std::mt19937_64 rng(absl::GetFlag(FLAGS_seed) * 1000003 + t * 7919 + num_keys);
    std::uniform_int_distribution<uint64_t> draw(0, absl::GetFlag(FLAGS_key_space) - 1);
    keys[t].resize(kBatches);
    for (auto& batch : keys[t]) {
      batch.resize(num_keys);
      for (auto& k : batch) k = draw(rng);
    }
  }
  // Push: small gradients (the rows stay near their values however long the bench runs).
  if (push) {
    for (auto& rows : out) std::fill(rows.begin(), rows.end(), 1e-6f);
  }
  auto call = [&](int t) -> absl::Status {
    const std::vector<uint64_t>& k = keys[t][next[t]++ % kBatches];
    if (push) {
      common::PushBatch batch;
      batch.sparse.push_back({table, k, absl::MakeConstSpan(out[t])});
      return env.stores[t / window]->Push(batch, common::PushOptions{});
    }
    common::PullBatch batch;
    batch.sparse.push_back({table, k, absl::MakeSpan(out[t])});
    return env.stores[t / window]->Pull(batch, common::PullOptions{});
  };
  const char* op = push ? "sparse_push" : "sparse_pull";
  const uint64_t retries = TotalRetries(env);
  BenchRow usage;
  ASSIGN_OR_RETURN(LoadResult r,
                   RunChecked(env, threads, call,
                              absl::StrCat(op, " ", num_keys, " keys, ", clients, " clients"),
                              &usage));
  const std::string label = num_keys % 1000 == 0 ? absl::StrCat(num_keys / 1000, "k keys")
                                                  : absl::StrCat(num_keys, " keys");
  BenchRow row = MakeRow("grpc", op, label, num_keys * dim * sizeof(float), num_keys, clients,
                         window, r);
  row.client_per_call = usage.client_per_call;
  row.server_per_call = usage.server_per_call;
  row.retries = TotalRetries(env) - retries;
  return row;
}

// ---- Driver -------------------------------------------------------------------------------

class Reporter {
 public:
  explicit Reporter(std::ofstream* json) : json_(json) {}
  void Add(const BenchRow& row) {
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
  const std::vector<BenchRow>& rows() const { return rows_; }

 private:
  std::ofstream* json_;  // Not owned; may be null.
  std::vector<BenchRow> rows_;
};

// One client store per worker id 0..n-1 (env->stores points into the result).
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
    ASSIGN_OR_RETURN(auto store, worker::GrpcParameterStore::Create(config, options));
    stores.push_back(std::move(store));
    env->stores.push_back(stores.back().get());
  }
  RETURN_IF_ERROR(stores[0]->WaitForServers(absl::Seconds(30)));
  return stores;
}

absl::Status RunGrpc(BenchEnv* env, const JobConfig& config, Reporter* reporter) {
  const BenchFlags& f = *env->flags;
  int max_clients = 1;
  for (int c : f.clients) max_clients = std::max(max_clients, c);
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<worker::GrpcParameterStore>> stores,
                   MakeStores(config, max_clients, env));
  if (f.dense) {
    for (uint64_t bytes : f.payloads) {
      for (bool push : f.dense_ops) {
        for (int c : f.clients) {
          ASSIGN_OR_RETURN(BenchRow row, RunDense(*env, bytes, push, c));
          reporter->Add(row);
        }
      }
    }
  }
  if (f.sparse) {
    const int dim = absl::GetFlag(FLAGS_sparse_dim);
    if (absl::GetFlag(FLAGS_sparse_prefill)) {
      RETURN_IF_ERROR(PrefillSparse(*env, SparseTableName(dim), dim));
    }
    for (bool push : f.sparse_ops) {
      for (uint64_t k : f.sparse_keys) {
        for (int c : f.clients) {
          ASSIGN_OR_RETURN(BenchRow row, RunSparse(*env, k, c, push));
          reporter->Add(row);
        }
      }
    }
  }
  worker::GrpcStoreStats total;
  for (auto& s : stores) {
    const worker::GrpcStoreStats st = s->stats();
    total.retries += st.retries;
    total.duplicate_pushes += st.duplicate_pushes;
    // Leave the consistency bound; matters only when connected to long-running servers.
    s->Finish().IgnoreError();
  }
  std::cerr << "client totals: " << total.retries << " retries, " << total.duplicate_pushes
            << " pushes answered as duplicates" << std::endl;
  env->stores.clear();
  return absl::OkStatus();
}

// The config the clients use: --config with --connect's addresses, or the generated one with
// the local cluster's.
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

// Every table the chosen modes use must be in the config (relevant with --connect).
absl::Status CheckTables(const BenchFlags& f, const JobConfig& config) {
  std::vector<std::string> need, missing;
  if (f.dense) {
    for (uint64_t b : f.payloads) need.push_back(DenseTableName(b));
  }
  if (f.sparse) need.push_back(SparseTableName(absl::GetFlag(FLAGS_sparse_dim)));
  for (const auto& name : need) {
    bool found = false;
    for (const auto& t : config.tables()) found = found || t.name() == name;
    if (!found) missing.push_back(name);
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(
      "the config lacks the bench tables ", absl::StrJoin(missing, ", "),
      "; start the servers with a config from `ps_bench --write_config=F` (same --payloads)"));
}

void PrintHeader(const std::vector<std::string>& addresses, const BenchFlags& f) {
  std::cerr << "ps_bench: " << addresses.size() << " servers (" << absl::StrJoin(addresses, ", ")
            << "), " << absl::FormatDuration(f.load.duration) << " per measurement after "
            << absl::FormatDuration(f.load.warmup) << " warm-up, window " << f.window
            << ", median of " << f.repeat << std::endl;
}

// Dense and sparse: against a local cluster started here, or the --connect servers.
absl::Status RunAgainstServers(BenchEnv* env, SignalStopper* stopper, Reporter* reporter) {
  const int num_servers = absl::GetFlag(FLAGS_servers);
  std::unique_ptr<LocalCluster> cluster;
  std::string config_path = absl::GetFlag(FLAGS_config);
  std::vector<std::string> addresses =
      absl::StrSplit(absl::GetFlag(FLAGS_connect), ',', absl::SkipWhitespace());
  if (addresses.empty()) {
    if (num_servers < 1) return absl::InvalidArgumentError("--servers must be >= 1");
    LocalClusterOptions options;
    options.server_binary = FindServerBinary();
    options.num_servers = num_servers;
    options.config_text = BenchConfigText(*env->flags, num_servers);
    options.keep_dir = absl::GetFlag(FLAGS_keep_temp);
    ASSIGN_OR_RETURN(cluster, LocalCluster::Start(options));
    stopper->Watch(cluster.get(), options.keep_dir);
    env->cluster = cluster.get();
    config_path = cluster->config_path();
    addresses = cluster->addresses();
  } else if (config_path.empty()) {
    return absl::InvalidArgumentError("--connect needs --config (the servers' JobConfig)");
  }
  PrintHeader(addresses, *env->flags);
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(JobConfig config, ClientConfig(config_path, addresses));
    RETURN_IF_ERROR(CheckTables(*env->flags, config));
    return RunGrpc(env, config, reporter);
  }();
  stopper->Watch(nullptr, false);
  env->cluster = nullptr;
  if (cluster != nullptr) {
    cluster->Stop();
    // After SIGTERM a server drains and exits 0; anything else is worth reporting.
    if (absl::Status exits = cluster->CheckExitedCleanly(); !exits.ok()) {
      std::cerr << "warning: " << exits.message() << std::endl;
    }
  }
  return status;
}

// ---- Spill mode ---------------------------------------------------------------------------

// The spill mode's tables-only config: the sparse bench table keeping at most budget_rows
// rows in memory on each server (0 = no budget), SGD, asynchronous, no checkpoints, plaintext.
std::string SpillConfigText(int num_servers, int num_workers, uint64_t budget_rows) {
  const int dim = absl::GetFlag(FLAGS_sparse_dim);
  return absl::StrCat(
      "# Written by tools/ps_bench --modes=spill.\n", "name: \"ps_bench_spill\"\n",
      "cluster {\n  num_servers: ", num_servers, "\n  num_workers: ", num_workers, "\n}\n",
      "default_optimizer { kind: SGD learning_rate: 0.01 }\n", "tables {\n  name: \"",
      SparseTableName(dim), "\"\n  kind: TABLE_KIND_SPARSE\n  dim: ", dim,
      "\n  initializer { kind: ZEROS }\n",
      budget_rows > 0 ? absl::StrCat("  memory_budget_rows: ", budget_rows, "\n") : "", "}\n",
      "checkpoint {\n  interval_s: 0\n  on_shutdown: false\n}\n",
      "security { plaintext: true }\n");
}

// Inverse-CDF sampling of k in [0, n) with P(k) ~ (k + 1)^-s. Thread-safe (const).
class ZipfKeys {
 public:
  ZipfKeys(uint64_t n, double s) : cdf_(n) {
    double c = 0;
    for (uint64_t k = 0; k < n; ++k) {
      c += std::pow(static_cast<double>(k) + 1, -s);
      cdf_[k] = c;
    }
    for (double& v : cdf_) v /= c;
  }
  uint64_t operator()(std::mt19937_64& rng) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    const uint64_t k = std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
    return std::min<uint64_t>(k, cdf_.size() - 1);
  }

 private:
  std::vector<double> cdf_;
};

// The servers' counters of the bench's sparse table, summed over the servers.
struct SpillCounters {
  uint64_t rows = 0, in_memory = 0, faulted_in = 0;
};

absl::StatusOr<SpillCounters> ReadSpillCounters(const JobConfig& config) {
  SpillCounters total;
  const std::string table = SparseTableName(absl::GetFlag(FLAGS_sparse_dim));
  for (const std::string& address : config.cluster().servers()) {
    ASSIGN_OR_RETURN(auto channel, common::MakeChannel(address, config));
    auto stub = ParameterServer::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    StatsResponse stats;
    RETURN_IF_ERROR_CTX(common::FromGrpcStatus(stub->Stats(&context, StatsRequest(), &stats)),
                        absl::StrCat("stats of ", address));
    for (const TableStats& t : stats.tables()) {
      if (t.name() != table) continue;
      total.rows += t.rows();
      total.in_memory += t.rows_in_memory();
      total.faulted_in += t.rows_faulted_in();
    }
  }
  return total;
}

// Each client thread's pre-drawn pulls of num_keys unique keys: streams[thread][pull].
using ZipfStreams = std::vector<std::vector<std::vector<uint64_t>>>;

ZipfStreams DrawZipfStreams(const ZipfKeys& zipf, uint64_t num_keys, int threads) {
  const uint64_t pulls =
      std::max<uint64_t>(1, absl::GetFlag(FLAGS_zipf_stream_keys) /
                                std::max<uint64_t>(num_keys, 1));
  ZipfStreams streams(threads);
  std::vector<std::thread> drawers;
  for (int t = 0; t < threads; ++t) {
    drawers.emplace_back([&, t] {
      std::mt19937_64 rng(absl::GetFlag(FLAGS_seed) * 1000003 + t * 7919 + num_keys);
      streams[t].resize(pulls);
      for (auto& pull : streams[t]) {
        absl::flat_hash_set<uint64_t> seen;
        while (pull.size() < num_keys) {
          const uint64_t k = zipf(rng);
          if (seen.insert(k).second) pull.push_back(k);
        }
      }
    });
  }
  for (auto& d : drawers) d.join();
  return streams;
}

// Pulls from the Zipf streams; the hit ratio comes from the servers' fault counters over
// exactly the pulls made (warm-up included).
absl::StatusOr<BenchRow> RunZipf(const BenchEnv& env, const JobConfig& config,
                                 const ZipfStreams& keys, uint64_t num_keys, int clients,
                                 double in_memory) {
  const int window = env.flags->window;
  const int threads = clients * window;
  const int dim = absl::GetFlag(FLAGS_sparse_dim);
  const std::string table = SparseTableName(dim);
  std::vector<std::vector<float>> out(threads, std::vector<float>(num_keys * dim));
  std::vector<int> next(threads, 0);
  std::atomic<uint64_t> rows_pulled{0};
  auto call = [&](int t) -> absl::Status {
    common::PullBatch batch;
    batch.sparse.push_back({table, keys[t][next[t]++ % keys[t].size()], absl::MakeSpan(out[t])});
    RETURN_IF_ERROR(env.stores[t / window]->Pull(batch, common::PullOptions{}));
    rows_pulled.fetch_add(num_keys);
    return absl::OkStatus();
  };
  const uint64_t retries = TotalRetries(env);
  ASSIGN_OR_RETURN(const SpillCounters before, ReadSpillCounters(config));
  ASSIGN_OR_RETURN(LoadResult r,
                   RunChecked(env, threads, call,
                              absl::StrCat("zipf pull ", num_keys, " keys, ", clients,
                                           " clients")));
  ASSIGN_OR_RETURN(const SpillCounters after, ReadSpillCounters(config));
  const std::string label =
      absl::StrCat(num_keys % 1000 == 0 ? absl::StrCat(num_keys / 1000, "k")
                                        : absl::StrCat(num_keys),
                   " keys zipf ", absl::GetFlag(FLAGS_zipf));
  BenchRow row = MakeRow("spill", "zipf_pull", label, num_keys * dim * sizeof(float), num_keys,
                         clients, window, r);
  row.retries = TotalRetries(env) - retries;
  row.in_memory = in_memory;
  if (rows_pulled.load() > 0) {
    row.hit_ratio = 1.0 - static_cast<double>(after.faulted_in - before.faulted_in) /
                              static_cast<double>(rows_pulled.load());
  }
  return row;
}

// The resident set of a process, MiB (-1 if unreadable).
double RssMiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  long kb = -1;
  while (std::getline(in, line)) {
    if (std::sscanf(line.c_str(), "VmRSS: %ld kB", &kb) == 1) break;
  }
  return kb < 0 ? -1 : kb / 1024.0;
}

// Pulls `rows` keys of a Zipf stream through store 0, so that the rows in memory are the hot
// ones (after the prefill they are the last keys created) before anything is measured.
absl::Status WarmUpSpill(const BenchEnv& env, const ZipfStreams& streams, uint64_t rows) {
  const int dim = absl::GetFlag(FLAGS_sparse_dim);
  const absl::Time start = absl::Now();
  std::vector<float> out;
  uint64_t pulled = 0;
  for (size_t i = 0; pulled < rows; ++i) {
    if (env.cancel->load()) return absl::CancelledError("cancelled");
    const std::vector<uint64_t>& keys = streams[0][i % streams[0].size()];
    out.resize(keys.size() * dim);
    common::PullBatch batch;
    batch.sparse.push_back({SparseTableName(dim), keys, absl::MakeSpan(out)});
    RETURN_IF_ERROR_CTX(env.stores[0]->Pull(batch, common::PullOptions{}), "spill warm-up");
    pulled += keys.size();
  }
  std::cerr << absl::StrFormat("  warm-up: %d rows of the Zipf stream pulled in %.2f s\n", pulled,
                               absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

// The spill rows of one budget, against fresh servers.
absl::Status RunSpillBudget(BenchEnv* env, const JobConfig& config,
                            const std::map<uint64_t, ZipfStreams>& streams, double in_memory,
                            Reporter* reporter) {
  // Warm-up: 4 times the rows that fit in memory, from the stream with the largest pulls.
  const uint64_t warm_rows =
      in_memory < 1 ? static_cast<uint64_t>(4 * in_memory * absl::GetFlag(FLAGS_key_space)) : 0;
  const BenchFlags& f = *env->flags;
  int max_clients = 1;
  for (int c : f.clients) max_clients = std::max(max_clients, c);
  ASSIGN_OR_RETURN(auto stores, MakeStores(config, max_clients, env));
  const int dim = absl::GetFlag(FLAGS_sparse_dim);
  RETURN_IF_ERROR(PrefillSparse(*env, SparseTableName(dim), dim));
  ASSIGN_OR_RETURN(const SpillCounters c, ReadSpillCounters(config));
  std::cerr << "  " << c.rows << " rows, " << c.in_memory << " of them in memory" << std::endl;
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_spill_settle_s)));
  if (warm_rows > 0) RETURN_IF_ERROR(WarmUpSpill(*env, streams.rbegin()->second, warm_rows));
  for (uint64_t k : f.sparse_keys) {
    for (int clients : f.clients) {
      ASSIGN_OR_RETURN(BenchRow row,
                       RunZipf(*env, config, streams.at(k), k, clients, in_memory));
      reporter->Add(row);
    }
  }
  if (env->cluster != nullptr) {
    std::cerr << "  servers' resident set after the runs:";
    for (pid_t pid : env->cluster->pids()) std::cerr << absl::StrFormat(" %.0f MiB", RssMiB(pid));
    std::cerr << std::endl;
  }
  for (auto& s : stores) s->Finish().IgnoreError();  // the servers are stopped right after
  env->stores.clear();
  return absl::OkStatus();
}

absl::Status RunSpill(BenchEnv* env, SignalStopper* stopper, Reporter* reporter) {
  if (!absl::GetFlag(FLAGS_connect).empty()) {
    return absl::InvalidArgumentError(
        "--modes=spill starts fresh servers for every --spill_budgets entry; it cannot use "
        "--connect");
  }
  const int num_servers = absl::GetFlag(FLAGS_servers);
  if (num_servers < 1) return absl::InvalidArgumentError("--servers must be >= 1");
  int max_clients = 1;
  for (int c : env->flags->clients) max_clients = std::max(max_clients, c);
  const uint64_t space = absl::GetFlag(FLAGS_key_space);
  std::cerr << "spill: " << space << " rows of dim " << absl::GetFlag(FLAGS_sparse_dim)
            << " over " << num_servers << " servers, keys drawn from Zipf "
            << absl::GetFlag(FLAGS_zipf) << std::endl;
  std::map<uint64_t, ZipfStreams> streams;
  {
    const ZipfKeys zipf(space, absl::GetFlag(FLAGS_zipf));
    for (uint64_t k : env->flags->sparse_keys) {
      if (k > space / 4) {
        return absl::InvalidArgumentError(
            "spill mode draws --sparse_keys unique keys per pull: keep it under --key_space / 4");
      }
      streams[k] = DrawZipfStreams(zipf, k, max_clients * env->flags->window);
    }
  }
  for (int percent : env->flags->spill_budgets) {
    const uint64_t budget =
        percent >= 100 ? 0 : std::max<uint64_t>(1, space * percent / 100 / num_servers);
    LocalClusterOptions options;
    options.server_binary = FindServerBinary();
    options.num_servers = num_servers;
    options.config_text = SpillConfigText(num_servers, max_clients, budget);
    options.keep_dir = absl::GetFlag(FLAGS_keep_temp);
    ASSIGN_OR_RETURN(auto cluster, LocalCluster::Start(options));
    stopper->Watch(cluster.get(), options.keep_dir);
    env->cluster = cluster.get();
    std::cerr << "spill: "
              << (budget == 0 ? std::string("no budget, every row in memory")
                              : absl::StrCat("memory_budget_rows ", budget, " per server (",
                                             percent, "% of the rows in memory)"))
              << std::endl;
    absl::Status status = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(JobConfig config,
                       ClientConfig(cluster->config_path(), cluster->addresses()));
      return RunSpillBudget(env, config, streams, percent / 100.0, reporter);
    }();
    stopper->Watch(nullptr, false);
    env->cluster = nullptr;
    env->stores.clear();
    cluster->Stop();
    if (absl::Status exits = cluster->CheckExitedCleanly(); !exits.ok()) {
      std::cerr << "warning: " << exits.message() << std::endl;
    }
    RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

absl::Status Run(SignalStopper* stopper) {
  ASSIGN_OR_RETURN(BenchFlags flags, ParseFlags());
  if (const std::string path = absl::GetFlag(FLAGS_write_config); !path.empty()) {
    std::ofstream out(path);
    out << BenchConfigText(flags, absl::GetFlag(FLAGS_servers));
    if (!out.good()) return absl::InvalidArgumentError(absl::StrCat("cannot write ", path));
    std::cerr << "wrote " << path << std::endl;
    return absl::OkStatus();
  }
  std::unique_ptr<std::ofstream> json;
  if (!absl::GetFlag(FLAGS_json).empty()) {
    json = std::make_unique<std::ofstream>(absl::GetFlag(FLAGS_json));
    if (!json->good()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot write ", absl::GetFlag(FLAGS_json)));
    }
  }
  Reporter reporter(json.get());
  BenchEnv env;
  env.flags = &flags;
  env.cancel = stopper->cancelled();
  if (flags.tcp) {
    std::cerr << "raw TCP over 127.0.0.1" << std::endl;
    ASSIGN_OR_RETURN(std::vector<BenchRow> rows, RunTcp(&env));
    for (const auto& r : rows) reporter.Add(r);
  }
  if (flags.dense || flags.sparse) RETURN_IF_ERROR(RunAgainstServers(&env, stopper, &reporter));
  if (flags.spill) RETURN_IF_ERROR(RunSpill(&env, stopper, &reporter));
  std::cout << "\n" << FormatTable(reporter.rows());
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Transport benchmark of the parameter servers over 127.0.0.1. Example:\n"
      "  bazel-bin/tools/ps_bench --seconds=2 --json=bench.jsonl");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // Before any thread starts: freed payload memory stays mapped for the next call.
  if (absl::Status s = ps::common::KeepFreedMemoryForReuse(); !s.ok()) LOG(WARNING) << s;
  // Before any other thread exists, so that every thread inherits the blocked signals.
  ps::tools::SignalStopper stopper;
  const absl::Status status = ps::tools::Run(&stopper);
  if (!status.ok()) {
    std::cerr << "ps_bench: " << status << std::endl;
    return 1;
  }
  return 0;
}
