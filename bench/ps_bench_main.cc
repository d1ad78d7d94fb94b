// ps_bench: transport benchmark of the parameter servers over 127.0.0.1.
//
//   bazel build //bench:ps_bench && bazel-bin/bench/ps_bench --seconds=2 --json=bench.jsonl
//
// Starts --servers ps_server processes (tables-only config, plaintext, no checkpoints, each
// with a temporary data dir), or uses running ones (--connect=host:port,... --config=F, where F
// is the servers' config and holds the bench tables; --write_config=F writes one). Then, each
// for --seconds after a --warmup:
//   tcp    raw-socket request/reply (client sends the payload, server reads it all and answers
//          8 bytes) for every payload, one connection; and one-way streaming bandwidth.
//   echo   (not in the default --modes) plain gRPC unary calls of one client thread to an echo
//          server in a child process (bench/echo_server): push = payload out, empty answer;
//          pull = empty request, payload back. The reference for what gRPC itself costs.
//   dense  GrpcParameterStore push and pull of one dense table per payload, for every client
//          count; a client is its own store with its own worker id (0..C-1, asynchronous),
//          running --window calls in flight (one thread keeping them in flight with the
//          store's asynchronous calls; --window_threads: one blocked thread per call).
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
// The modes live in bench/ps_bench_*.cc (see bench/ps_bench.h); this file turns the flags into
// BenchOptions, refusing out-of-range values before anything starts.

#include <cstdint>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/bench_report.h"
#include "bench/ps_bench.h"
#include "common/startup/flag_check.h"
#include "common/startup/process_memory.h"
#include "common/status_macros.h"
#include "glog/logging.h"

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
          "What to measure: any of tcp,echo,dense,sparse,spill (spill: see --spill_budgets; "
          "echo: plain gRPC unary calls to bench/echo_server, see --echo_apis).");
ABSL_FLAG(std::string, echo_apis, "sync",
          "echo mode: the echo server's gRPC API, sync and/or callback (one row each).");
ABSL_FLAG(bool, echo_data_path_args, false,
          "echo mode: both ends use the parameter server's data-path channel arguments (16 MB "
          "frames and 64 MB stream windows to start with, no channelz) instead of gRPC's "
          "defaults.");
ABSL_FLAG(std::string, payloads, "4KB,1MB,64MB",
          "Dense and raw-TCP payloads per call (B, KB, MB; KB = 1024 bytes; multiples of 4).");
ABSL_FLAG(std::string, clients, "1,2,4", "Concurrent client counts for dense and sparse.");
ABSL_FLAG(std::string, dense_ops, "push,pull", "Dense operations to measure: push, pull or both.");
ABSL_FLAG(int32_t, window, 1,
          "Calls in flight per client (dense: kept by one thread per client; sparse and spill: "
          "threads per client).");
ABSL_FLAG(bool, window_threads, false,
          "Dense --window > 1 with one blocked thread per call in flight (for comparison).");
ABSL_FLAG(std::string, sparse_keys, "1000,10000", "Keys per sparse pull or push.");
ABSL_FLAG(std::string, sparse_ops, "pull,push",
          "Sparse operations to measure: pull, push or both (a push sends one gradient row per "
          "key; the server applies it with SGD).");
ABSL_FLAG(int32_t, sparse_dim, 16, "Width of the sparse table's rows.");
ABSL_FLAG(uint64_t, key_space, 1000000, "Sparse keys are drawn uniformly from [0, key_space).");
ABSL_FLAG(bool, sparse_prefill, true,
          "Push zeros to the whole key space once before the sparse runs, so that row creation "
          "(a key's first push) is not measured and pulls read rows that exist.");
ABSL_FLAG(uint64_t, pull_piece_bytes, ps::worker::GrpcStoreOptions().pull_piece_bytes,
          "GrpcStoreOptions::pull_piece_bytes of the bench clients: dense pulls of at least twice "
          "this many bytes per server go in pieces (0 = one frame per server).");
ABSL_FLAG(uint64_t, parallel_copy_bytes, ps::worker::GrpcStoreOptions().parallel_copy_bytes,
          "GrpcStoreOptions::parallel_copy_bytes of the bench clients: dense pull answers of at "
          "least this many bytes per server are copied into the caller's buffers by more than "
          "one thread (0 = one thread).");
ABSL_FLAG(bool, lend_push_buffers, false,
          "Dense pushes from memory each client's store lends in the server's shared-memory "
          "segment (ParameterStore::LendPushBuffer: one server holding the whole table), which "
          "the server reads where it lies: no copy in the client. Elsewhere, from the client's "
          "own memory as without it.");
ABSL_FLAG(bool, rewrite_push_payload, false,
          "Each dense push first writes its whole payload, as a backward pass writes a gradient "
          "just before it is pushed (counted in the call's time): the server then reads bytes "
          "another core has just written, not bytes it read the call before. Needs --window=1.");
ABSL_FLAG(int64_t, busy_poll_us, -1,
          "server.busy_poll_us and rpc.busy_poll_us of the generated config: how long the "
          "servers' data threads and the clients poll for events before they sleep (0 = "
          "sleep at once; -1 = the config's defaults).");
ABSL_FLAG(int64_t, shared_memory_mb, -1,
          "rpc.shared_memory_mb and server.max_shared_memory_mb of the generated config: shared "
          "memory between each client and server (0: payloads go by the socket). -1: the "
          "config's defaults.");
ABSL_FLAG(bool, shared_memory_calls, true,
          "rpc.shared_memory_calls of the generated config: with shared memory, calls go through "
          "the segment's channel (false: by the socket, their payloads through the segment).");
ABSL_FLAG(bool, overlap_push_copy, true,
          "rpc.overlap_push_copy of the generated config: a push through a channel is posted "
          "before its payload is copied, and the server checks the bytes as they come (false: "
          "the payload is all there first).");
ABSL_FLAG(std::string, handoff, "",
          "rpc.handoff of the generated config: how a client writes the bytes it hands a server "
          "through shared memory, and asks for its answers: adaptive (by measured cost), plain "
          "or streamed (non-temporal stores). Empty: the config's default, adaptive.");
ABSL_FLAG(int32_t, data_threads, -1,
          "server.data_threads of the generated config: threads serving each server's data "
          "path (0 = one per client up to the cores; -1 = the config's default, 1).");
ABSL_FLAG(int32_t, apply_threads, -1,
          "server.apply_threads of the generated config: threads of each server's parallel "
          "apply (a large push's check and update, a large pull's read), the receiving one "
          "included (1 = that thread alone; 0 = every usable core; -1 = the config's default, "
          "0).");
ABSL_FLAG(uint64_t, dense_block_floats, 131072,
          "cluster.dense_block_floats of the generated config (131072 = 512 KB blocks: a 1 MB "
          "table spans two servers, so runs with --servers=2 load both).");
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

namespace ps::bench {
namespace {

// The kernel's TCP congestion control for new connections ("unknown" if unreadable). It moves
// the raw TCP reference: on loopback BBR paces each connection with timers, and raw TCP ran at
// half cubic's rate on the development VM (docs/lab/2026-12-02-flow-window.md).
std::string CongestionControl() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string name;
  if (!(in >> name)) return "unknown";
  return name;
}

// Upper bounds of the flags: beyond them a value is a typo, not a benchmark (a 1 TB payload
// would be allocated by every client thread before failing).
constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 30;
constexpr int kMaxServers = 256;
constexpr int kMaxClients = 1024;
constexpr int kMaxWindow = 256;
constexpr int kMaxRepeat = 1000;
constexpr uint64_t kMaxSparseKeys = 10000000;
constexpr int kMaxSparseDim = 65536;
constexpr uint64_t kMaxKeySpace = uint64_t{1} << 32;
constexpr uint64_t kMaxBlockFloats = uint64_t{1} << 28;
constexpr double kMaxSeconds = 86400;

absl::Status OutOfRange(absl::string_view flag, absl::string_view value, absl::string_view range) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": expected ", range));
}

// A comma-separated list of numbers in [1, max].
template <typename T>
absl::StatusOr<std::vector<T>> ParseList(const std::string& flag, const std::string& text,
                                         T max) {
  std::vector<T> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(item, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": bad number '", item, "'"));
    }
    if (v < 1 || static_cast<uint64_t>(v) > static_cast<uint64_t>(max)) {
      return OutOfRange(flag, item, absl::StrCat("1..", max));
    }
    out.push_back(static_cast<T>(v));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return out;
}

// "push,pull" -> {true, false}.
absl::StatusOr<std::vector<bool>> ParseOps(const std::string& flag, const std::string& text) {
  std::vector<bool> out;
  for (absl::string_view op : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    if (op != "push" && op != "pull") {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": unknown op '", op, "'"));
    }
    out.push_back(op == "push");
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return out;
}

absl::Status ParseModes(const std::string& text, BenchOptions* f) {
  for (absl::string_view m : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    if (m == "tcp") {
      f->tcp = true;
    } else if (m == "dense") {
      f->dense = true;
    } else if (m == "sparse") {
      f->sparse = true;
    } else if (m == "spill") {
      f->spill = true;
    } else if (m == "echo") {
      f->echo = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--modes: unknown mode '", m, "'"));
    }
  }
  if (!f->tcp && !f->dense && !f->sparse && !f->spill && !f->echo) {
    return absl::InvalidArgumentError("--modes is empty");
  }
  return absl::OkStatus();
}

// host:port with a port in 1..65535, for every --connect entry.
absl::StatusOr<std::vector<std::string>> ParseConnect(const std::string& text) {
  std::vector<std::string> out = absl::StrSplit(text, ',', absl::SkipWhitespace());
  for (const std::string& a : out) {
    const size_t colon = a.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(a.substr(colon + 1), &port) || port < 1 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--connect: '", a, "' is not host:port with a port in 1..65535"));
    }
  }
  return out;
}

// The list flags: payloads, clients, keys, operations, modes, budgets.
absl::Status ParseLists(BenchOptions* f) {
  for (absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_payloads), ',', absl::SkipWhitespace())) {
    ASSIGN_OR_RETURN(uint64_t bytes, ParseSize("payloads", item, kMaxPayloadBytes));
    if (bytes % sizeof(float) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--payloads: ", item, " is not whole floats"));
    }
    f->payloads.push_back(bytes);
  }
  if (f->payloads.empty()) return absl::InvalidArgumentError("--payloads is empty");
  ASSIGN_OR_RETURN(f->clients, ParseList<int>("clients", absl::GetFlag(FLAGS_clients), kMaxClients));
  ASSIGN_OR_RETURN(f->sparse_keys, ParseList<uint64_t>("sparse_keys", absl::GetFlag(FLAGS_sparse_keys),
                                                       kMaxSparseKeys));
  RETURN_IF_ERROR(ParseModes(absl::GetFlag(FLAGS_modes), f));
  ASSIGN_OR_RETURN(f->dense_ops, ParseOps("dense_ops", absl::GetFlag(FLAGS_dense_ops)));
  ASSIGN_OR_RETURN(f->sparse_ops, ParseOps("sparse_ops", absl::GetFlag(FLAGS_sparse_ops)));
  ASSIGN_OR_RETURN(f->spill_budgets,
                   ParseList<int>("spill_budgets", absl::GetFlag(FLAGS_spill_budgets), 100));
  ASSIGN_OR_RETURN(f->connect, ParseConnect(absl::GetFlag(FLAGS_connect)));
  f->echo_apis = absl::StrSplit(absl::GetFlag(FLAGS_echo_apis), ',', absl::SkipWhitespace());
  for (const std::string& api : f->echo_apis) {
    if (api != "sync" && api != "callback") {
      return absl::InvalidArgumentError(absl::StrCat("--echo_apis: unknown API '", api, "'"));
    }
  }
  if (f->echo_apis.empty()) return absl::InvalidArgumentError("--echo_apis is empty");
  return absl::OkStatus();
}

// The scalar flags, each within its range.
absl::Status ParseScalars(BenchOptions* f) {
  f->servers = absl::GetFlag(FLAGS_servers);
  f->window = absl::GetFlag(FLAGS_window);
  f->window_threads = absl::GetFlag(FLAGS_window_threads);
  f->repeat = absl::GetFlag(FLAGS_repeat);
  f->sparse_dim = absl::GetFlag(FLAGS_sparse_dim);
  f->key_space = absl::GetFlag(FLAGS_key_space);
  f->dense_block_floats = absl::GetFlag(FLAGS_dense_block_floats);
  f->pull_piece_bytes = absl::GetFlag(FLAGS_pull_piece_bytes);
  f->parallel_copy_bytes = absl::GetFlag(FLAGS_parallel_copy_bytes);
  f->lend_push_buffers = absl::GetFlag(FLAGS_lend_push_buffers);
  f->rewrite_push_payload = absl::GetFlag(FLAGS_rewrite_push_payload);
  f->busy_poll_us = absl::GetFlag(FLAGS_busy_poll_us);
  if (f->busy_poll_us < -1 || f->busy_poll_us > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--busy_poll_us=", f->busy_poll_us, ": expected -1..1000000"));
  }
  f->data_threads = absl::GetFlag(FLAGS_data_threads);
  f->apply_threads = absl::GetFlag(FLAGS_apply_threads);
  f->shared_memory_mb = absl::GetFlag(FLAGS_shared_memory_mb);
  f->shared_memory_calls = absl::GetFlag(FLAGS_shared_memory_calls);
  f->overlap_push_copy = absl::GetFlag(FLAGS_overlap_push_copy);
  f->handoff = absl::GetFlag(FLAGS_handoff);
  if (!f->handoff.empty() && f->handoff != "adaptive" && f->handoff != "plain" &&
      f->handoff != "streamed") {
    return absl::InvalidArgumentError(
        absl::StrCat("--handoff=", f->handoff, ": expected adaptive, plain or streamed"));
  }
  if (f->shared_memory_mb < -1 || f->shared_memory_mb > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shared_memory_mb=", f->shared_memory_mb, ": expected -1..65536"));
  }
  if (f->data_threads < -1 || f->data_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data_threads=", f->data_threads, ": expected -1..1024"));
  }
  if (f->apply_threads < -1 || f->apply_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--apply_threads=", f->apply_threads, ": expected -1..1024"));
  }
  f->tcp_stream_write = absl::GetFlag(FLAGS_tcp_stream_write);
  f->zipf = absl::GetFlag(FLAGS_zipf);
  f->zipf_stream_keys = absl::GetFlag(FLAGS_zipf_stream_keys);
  f->spill_settle_s = absl::GetFlag(FLAGS_spill_settle_s);
  const double seconds = absl::GetFlag(FLAGS_seconds), warmup = absl::GetFlag(FLAGS_warmup);
  using common::CheckDoubleFlagRange;
  using common::CheckIntFlagRange;
  RETURN_IF_ERROR(common::AllFlagsInRange({
      CheckIntFlagRange("servers", f->servers, 1, kMaxServers, absl::StrCat("1..", kMaxServers)),
      CheckIntFlagRange("window", f->window, 1, kMaxWindow, absl::StrCat("1..", kMaxWindow)),
      CheckIntFlagRange("repeat", f->repeat, 1, kMaxRepeat, absl::StrCat("1..", kMaxRepeat)),
      CheckIntFlagRange("sparse_dim", f->sparse_dim, 1, kMaxSparseDim,
                        absl::StrCat("1..", kMaxSparseDim)),
      CheckIntFlagRange("key_space", f->key_space, 1, kMaxKeySpace,
                        absl::StrCat("1..", kMaxKeySpace)),
      CheckIntFlagRange("dense_block_floats", f->dense_block_floats, 1, kMaxBlockFloats,
                        absl::StrCat("1..", kMaxBlockFloats)),
      CheckIntFlagRange("tcp_stream_write", f->tcp_stream_write, 1, kMaxPayloadBytes,
                        absl::StrCat("1..", kMaxPayloadBytes, " bytes")),
      CheckDoubleFlagRange("zipf", f->zipf, 0, 10, "0..10"),
      CheckIntFlagRange("zipf_stream_keys", f->zipf_stream_keys, 1, kMaxKeySpace,
                        absl::StrCat("1..", kMaxKeySpace)),
      CheckDoubleFlagRange("spill_settle_s", f->spill_settle_s, 0, kMaxSeconds,
                           "0..86400 seconds"),
      CheckDoubleFlagRange("seconds", seconds, 1e-3, kMaxSeconds, "0.001..86400 seconds"),
      CheckDoubleFlagRange("warmup", warmup, 0, kMaxSeconds, "0..86400 seconds"),
  }));
  f->load.duration = absl::Seconds(seconds);
  f->load.warmup = absl::Seconds(warmup);
  return absl::OkStatus();
}

absl::StatusOr<BenchOptions> ParseFlags() {
  BenchOptions f;
  RETURN_IF_ERROR(ParseLists(&f));
  RETURN_IF_ERROR(ParseScalars(&f));
  f.server_binary = absl::GetFlag(FLAGS_server_binary);
  f.config = absl::GetFlag(FLAGS_config);
  f.keep_temp = absl::GetFlag(FLAGS_keep_temp);
  f.echo_data_path_args = absl::GetFlag(FLAGS_echo_data_path_args);
  f.sparse_prefill = absl::GetFlag(FLAGS_sparse_prefill);
  f.seed = absl::GetFlag(FLAGS_seed);
  if (f.rewrite_push_payload && f.window != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rewrite_push_payload needs --window=1 (calls in flight share a client's payload), got ",
        f.window));
  }
  for (uint64_t k : f.sparse_keys) {
    if ((f.sparse || f.spill) && k > f.key_space) {
      return absl::InvalidArgumentError(absl::StrCat("--sparse_keys: ", k, " keys per call from a --key_space of ",
                                                     f.key_space));
    }
  }
  return f;
}

absl::Status Run(SignalStopper* stopper) {
  ASSIGN_OR_RETURN(BenchOptions flags, ParseFlags());
  if (const std::string path = absl::GetFlag(FLAGS_write_config); !path.empty()) {
    std::ofstream out(path);
    out << BenchConfigText(flags, flags.servers);
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
    std::cerr << "raw TCP over 127.0.0.1 (TCP congestion control: " << CongestionControl() << ")"
              << std::endl;
    ASSIGN_OR_RETURN(std::vector<BenchRow> rows, RunTcp(&env));
    for (const auto& r : rows) reporter.Add(r);
  }
  if (flags.echo) {
    std::cerr << "plain gRPC unary (echo server) over 127.0.0.1" << std::endl;
    ASSIGN_OR_RETURN(std::vector<BenchRow> rows, RunEcho(&env));
    for (const auto& r : rows) reporter.Add(r);
  }
  if (flags.dense || flags.sparse) RETURN_IF_ERROR(RunAgainstServers(&env, stopper, &reporter));
  if (flags.spill) RETURN_IF_ERROR(RunSpill(&env, stopper, &reporter));
  std::cout << "\n" << FormatTable(reporter.rows());
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Transport benchmark of the parameter servers over 127.0.0.1. Example:\n"
      "  bazel-bin/bench/ps_bench --seconds=2 --json=bench.jsonl");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // Before any thread starts: freed payload memory stays mapped for the next call.
  if (absl::Status s = ps::common::KeepFreedMemoryForReuse(); !s.ok()) LOG(WARNING) << s;
  ps::common::SkipMutexDeadlockChecks();
  // Before any other thread exists, so that every thread inherits the blocked signals.
  ps::bench::SignalStopper stopper;
  const absl::Status status = ps::bench::Run(&stopper);
  if (!status.ok()) {
    std::cerr << "ps_bench: " << status << std::endl;
    return 1;
  }
  return 0;
}
