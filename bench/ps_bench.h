// The parts of ps_bench (bench/ps_bench_main.cc) that its modes share: the options the flags
// become, the environment a measurement runs in, the median-of-runs driver with costs per
// call, the report, and the modes' entry points. Each mode lives in its own file:
//   ps_bench_tcp.cc     raw-socket request/reply and streaming baseline
//   ps_bench_echo.cc    plain-gRPC unary reference (an echo server in a child process)
//   ps_bench_dense.cc   GrpcParameterStore dense push / pull
//   ps_bench_sparse.cc  GrpcParameterStore sparse pull / push (uniform keys)
//   ps_bench_servers.cc dense and sparse against started or --connect servers
//   ps_bench_spill.cc   Zipf pulls against servers whose sparse table spills to disk
// Nothing here reads flags: the main turns them into BenchOptions.

#ifndef PS_BENCH_PS_BENCH_H_
#define PS_BENCH_PS_BENCH_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_load.h"
#include "bench/bench_report.h"
#include "bench/local_cluster.h"
#include "proto/config.pb.h"
#include "worker/rpc/grpc_store.h"

namespace ps::bench {

// Everything the flags say, checked by the main (ranges) before any mode runs.
struct BenchOptions {
  // What to measure.
  bool tcp = false, dense = false, sparse = false, spill = false, echo = false;
  std::vector<std::string> echo_apis = {"sync"};  // echo server APIs: "sync", "callback"
  bool echo_data_path_args = false;  // echo with DataPathChannelArgs, not gRPC's defaults
  std::vector<uint64_t> payloads;     // bytes, whole floats
  std::vector<int> clients;           // concurrent client counts
  std::vector<uint64_t> sparse_keys;  // keys per sparse call
  std::vector<int> spill_budgets;     // percent of the rows in memory, 1..100
  std::vector<bool> dense_ops;        // true = push, false = pull
  std::vector<bool> sparse_ops;       // true = push, false = pull
  int window = 1;                     // calls in flight per client
  // Dense window > 1: `window` blocked threads per client instead of one thread keeping the
  // calls in flight with the store's asynchronous calls (sparse and spill always use threads).
  bool window_threads = false;
  int repeat = 1;                     // runs per measurement (the median is reported)
  LoadOptions load;                   // duration and warm-up

  // The servers: started here (servers > 0, connect empty) or running ones.
  int servers = 2;
  std::string server_binary;           // empty: found beside this binary
  std::vector<std::string> connect;    // host:port of running servers
  std::string config;                  // their JobConfig (with connect)
  bool keep_temp = false;              // keep the started servers' directory

  // Table shapes and key draws.
  int sparse_dim = 16;
  uint64_t key_space = 1000000;
  bool sparse_prefill = true;
  uint64_t dense_block_floats = 131072;
  uint64_t pull_piece_bytes = worker::GrpcStoreOptions().pull_piece_bytes;
  uint64_t parallel_copy_bytes = worker::GrpcStoreOptions().parallel_copy_bytes;
  // Dense pushes from a buffer each client's store lends (ParameterStore::LendPushBuffer),
  // where it lends one.
  bool lend_push_buffers = false;
  // Each dense push first writes its payload (as a backward pass writes a gradient), counted
  // in the call's time. REQUIRES window == 1 (calls in flight share a client's payload).
  bool rewrite_push_payload = false;
  int64_t busy_poll_us = -1;  // server and rpc busy_poll_us of the config; -1: their defaults
  int32_t data_threads = -1;  // server.data_threads of the config; -1: its default
  int32_t apply_threads = -1;  // server.apply_threads of the config; -1: its default
  // rpc.shared_memory_mb and server.max_shared_memory_mb of the config; -1: their defaults
  int64_t shared_memory_mb = -1;
  // rpc.shared_memory_calls of the config (false: payloads through shared memory, calls by
  // the socket).
  bool shared_memory_calls = true;
  // rpc.overlap_push_copy of the config (false: a push's payload is all in the segment before
  // its call is posted).
  bool overlap_push_copy = true;
  // rpc.handoff of the config: "adaptive", "plain" or "streamed"; empty: its default.
  std::string handoff;
  size_t tcp_stream_write = 4 << 20;
  uint64_t seed = 1;
  double zipf = 1.1;
  uint64_t zipf_stream_keys = 2000000;
  double spill_settle_s = 5;
};

// The largest of options.clients (1 if empty).
int MaxClients(const BenchOptions& options);

std::string DenseTableName(uint64_t bytes);
std::string SparseTableName(int dim);

// The tables-only job config the bench's servers run with: one dense table per payload, one
// sparse table, SGD everywhere (a push does real work), asynchronous (no staleness), no
// checkpoints, plaintext.
std::string BenchConfigText(const BenchOptions& options, int num_servers);

// options.server_binary, else this binary's runfiles (the target has ps_server as data), else
// bazel-bin/server/ps_server next to bazel-bin/bench/ps_bench.
std::string FindServerBinary(const BenchOptions& options);

// Blocks SIGINT/SIGTERM in every thread (construct before starting any) and waits for them
// on its own thread: on a signal it cancels the run, stops the watched cluster (SIGTERM, then
// SIGKILL) and exits 128+signal. In-flight RPCs are not waited for: with their servers gone
// they would only retry. Thread-safe.
class SignalStopper {
 public:
  SignalStopper();
  ~SignalStopper();
  // The cluster to stop on a signal (null: none). Not owned; call Watch(nullptr) before
  // destroying it.
  void Watch(LocalCluster* cluster, bool keep_dir);
  const std::atomic<bool>* cancelled() const { return &cancelled_; }

 private:
  void Loop();

  sigset_t set_;
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  LocalCluster* cluster_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool keep_dir_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Everything a measurement needs. Does not own its pointers.
struct BenchEnv {
  const BenchOptions* flags;
  std::vector<worker::GrpcParameterStore*> stores;  // store i = worker i
  LocalCluster* cluster = nullptr;                  // null with --connect
  // Without a cluster: the server processes whose costs per call are counted (echo).
  std::vector<pid_t> server_pids;
  const std::atomic<bool>* cancel;
  // Raw TCP request/reply MB/s by (payload bytes, concurrent connections).
  std::map<std::pair<uint64_t, int>, double> tcp_mb_per_s;
};

BenchRow MakeRow(std::string mode, std::string op, std::string payload, uint64_t payload_bytes,
                 uint64_t rows, int clients, int window, const LoadResult& r);

// The retries of every store of env so far.
uint64_t TotalRetries(const BenchEnv& env);

// Runs the load --repeat times and returns the run with the median throughput. When a run
// fails, says whether a server died and what it logged.
// With `row`, also fills its costs per call (of the median run).
absl::StatusOr<LoadResult> RunChecked(const BenchEnv& env, int threads, const LoadCall& call,
                                      const std::string& what, BenchRow* row = nullptr);

// RunChecked for windowed calls: `threads` threads each keep `window` calls in flight
// (bench_load.h RunWindowLoad); costs per call are per reaped call.
absl::StatusOr<LoadResult> RunCheckedWindow(const BenchEnv& env, int threads, int window,
                                            const WindowCalls& calls, const std::string& what,
                                            BenchRow* row = nullptr);

// Prints each row as it comes (and its JSON line to `json`) and keeps them for the table.
// Thread-compatible.
class Reporter {
 public:
  explicit Reporter(std::ofstream* json) : json_(json) {}
  void Add(const BenchRow& row);
  const std::vector<BenchRow>& rows() const { return rows_; }

 private:
  std::ofstream* json_;  // Not owned; may be null.
  std::vector<BenchRow> rows_;
};

// One client store per worker id 0..n-1 (env->stores points into the result).
absl::StatusOr<std::vector<std::unique_ptr<worker::GrpcParameterStore>>> MakeStores(
    const JobConfig& config, int n, BenchEnv* env);

// The config the clients use: `path` with `addresses` as its servers.
absl::StatusOr<JobConfig> ClientConfig(const std::string& path,
                                       const std::vector<std::string>& addresses);

// "1k keys" or "1500 keys".
std::string KeysLabel(uint64_t num_keys);

// ---- The modes ------------------------------------------------------------------------------

// tcp: request/reply per payload over one connection and over each larger --clients count of
// connections at once, then streaming bandwidth. Records the request/reply rates in
// env->tcp_mb_per_s (the dense rows' baseline, by payload and clients).
absl::StatusOr<std::vector<BenchRow>> RunTcp(BenchEnv* env);

// echo: for each of --echo_apis, an echo server (bench/echo_server) in a child process and one
// client thread; push and pull rows per payload, compared with raw TCP of one connection.
absl::StatusOr<std::vector<BenchRow>> RunEcho(BenchEnv* env);

// dense: one measurement of `clients` stores pushing or pulling the dense table of `bytes`.
absl::StatusOr<BenchRow> RunDense(const BenchEnv& env, uint64_t bytes, bool push, int clients);

// sparse: pushes zeros to every key of the key space once (rows are created by pushes; a
// pull of a key that is no row reads its initial values).
absl::Status PrefillSparse(const BenchEnv& env, const std::string& table, int dim);
// sparse: one measurement of `clients` stores pulling or pushing num_keys uniform keys.
absl::StatusOr<BenchRow> RunSparse(const BenchEnv& env, uint64_t num_keys, int clients,
                                   bool push);

// dense and sparse: against a local cluster started here, or the --connect servers.
absl::Status RunAgainstServers(BenchEnv* env, SignalStopper* stopper, Reporter* reporter);

// spill: fresh servers per --spill_budgets entry, Zipf pulls, hit ratios.
absl::Status RunSpill(BenchEnv* env, SignalStopper* stopper, Reporter* reporter);

}  // namespace ps::bench

#endif  // PS_BENCH_PS_BENCH_H_
