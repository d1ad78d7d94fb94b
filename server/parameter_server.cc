#include "server/parameter_server.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <iostream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics/http_server.h"
#include "common/startup/atomic_file.h"
#include "common/startup/cores.h"
#include "common/startup/flag_check.h"
#include "common/status_macros.h"
#include "common/stream_copy.h"
#include "glog/logging.h"
#include "server/checkpointer.h"
#include "server/memory_budget.h"
#include "server/rpc/grpc_server.h"
#include "server/rpc/service.h"
#include "server/server_metrics.h"
#include "server/shard.h"

namespace ps::server {
namespace {

// The progress file: "<updates applied>\n", rewritten about every second, so that after a
// crash the next start can tell how many updates its checkpoint misses.
std::string ProgressPath(const std::string& data_dir) { return data_dir + "/PROGRESS"; }

std::optional<uint64_t> ReadProgress(const std::string& data_dir) {
  std::ifstream in(ProgressPath(data_dir));
  uint64_t updates = 0;
  if (in >> updates) return updates;
  return std::nullopt;
}

void WriteProgress(const std::string& data_dir, uint64_t updates) {
  absl::Status s = common::WriteFileAtomically(ProgressPath(data_dir), absl::StrCat(updates, "\n"));
  // A full disk must not stop training; the checkpoints report their own failures.
  if (!s.ok()) {
    LOG_EVERY_N(WARNING, 60) << "progress file: " << s;
  }
}

// One line per table at start: its kind, size, the part held here and its optimizer.
void LogTables(const Shard& shard, const std::string& spill_dir) {
  const common::Partitioner& p = shard.partitioner();
  for (const auto& t : p.tables()) {
    std::string what = t.kind == TABLE_KIND_DENSE
                           ? absl::StrCat("dense, ", t.numel, " values in ", t.num_blocks,
                                          " blocks, ",
                                          p.BlocksOnServer(t, shard.server_index()).size(),
                                          " here")
                           : absl::StrCat("sparse, dim ", t.dim);
    LOG(INFO) << "table '" << t.name << "': " << what << ", optimizer "
              << OptimizerConfig::Kind_Name(t.config->optimizer().kind())
              << (t.config->memory_budget_rows() > 0
                      ? absl::StrCat(", at most ", t.config->memory_budget_rows(),
                                     " rows in memory (the rest spilled to ", spill_dir, ")")
                      : "");
  }
}

// One line per sparse table: its rows, and for a table with a memory budget how many are in
// memory and spilled, and how many moved since the start.
void LogSparseTables(Shard* shard) {
  for (const auto& t : shard->partitioner().tables()) {
    if (t.kind != TABLE_KIND_SPARSE) continue;
    absl::StatusOr<SparseTableStats> stats = shard->SparseStats(t.name);
    if (!stats.ok()) continue;
    const SpillStats& st = stats->spill;
    if (!stats->spills) {
      LOG(INFO) << "table '" << t.name << "': " << st.resident_rows << " rows, all in memory";
      continue;
    }
    LOG(INFO) << "table '" << t.name << "': " << st.resident_rows + st.spilled_rows << " rows, "
              << st.resident_rows << " in memory (budget " << stats->budget_rows << "), "
              << st.spilled_rows << " spilled; since the start " << st.faults
              << " faulted in and " << st.evictions << " evicted (" << st.writes << " written)"
              << (st.eviction_errors > 0
                      ? absl::StrCat(", ", st.eviction_errors, " evictions failed")
                      : "");
  }
}

int ServingThreads(const JobConfig& config, int requested) {
  int threads = requested > 0 ? requested
                              : (config.server().num_threads() > 0
                                     ? static_cast<int>(config.server().num_threads())
                                     : static_cast<int>(std::max(2u, common::UsableCores())));
  // Pulls waiting for the bound are parked without a thread, but a deterministic push holds
  // its thread while it waits for its turn: with fewer threads than workers, the push whose
  // turn it is would never run.
  if (config.training().has_staleness()) {
    const int needed = static_cast<int>(config.cluster().num_workers()) + 2;
    if (threads < needed) {
      LOG(WARNING) << "serving with " << needed << " threads instead of " << threads
                   << ": a synchronous job needs one per worker waiting, plus room";
      threads = needed;
    }
  }
  return threads;
}

}  // namespace

int PoolRequests(const JobConfig& config) {
  const int64_t set = std::min<int64_t>(config.server().max_pool_requests(), INT_MAX);
  if (!config.training().deterministic()) return static_cast<int>(set);
  const int64_t needed =
      std::min<int64_t>(2 * int64_t{config.cluster().num_workers()} + 2, INT_MAX);
  if (set >= needed) return static_cast<int>(set);
  LOG(WARNING) << "holding up to " << needed << " requests on the serving pool instead of " << set
               << " (server.max_pool_requests): a deterministic job's pushes wait there for "
               << "their turn, two per worker";
  return static_cast<int>(needed);
}

int DataThreads(const JobConfig& config, unsigned cores) {
  if (config.server().data_threads() > 0) return static_cast<int>(config.server().data_threads());
  return static_cast<int>(std::max(1u, std::min(config.cluster().num_workers(), cores)));
}

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(
    const JobConfig& config, const ParameterServerOptions& options) {
  if (options.server_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("server index ", options.server_index, " is negative"));
  }
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics port ", options.metrics_port, ": expected -1 (off), 0 or a port"));
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port ", options.port, ": expected 0 (a free one) or a port"));
  }
  // Rows beyond a table's memory budget are spilled under the data dir.
  for (const TableConfig& t : config.tables()) {
    if (t.memory_budget_rows() > 0 && options.data_dir.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", t.name(), "' has memory_budget_rows: the server needs --data_dir (rows "
          "beyond the budget are spilled there)"));
    }
  }
  std::unique_ptr<ParameterServer> server(new ParameterServer(config, options));
  ShardOptions shard_options;
  shard_options.server_index = static_cast<uint32_t>(options.server_index);
  shard_options.incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  shard_options.reject_nonfinite = config.server().reject_nonfinite();
  shard_options.max_memory_bytes = config.server().max_memory_bytes() > 0
                                       ? config.server().max_memory_bytes()
                                       : DefaultMaxMemoryBytes();
  LOG(INFO) << "memory budget: " << shard_options.max_memory_bytes
            << " bytes for parameters, optimizer slots and sparse rows"
            << (config.server().max_memory_bytes() > 0 ? "" : " (80% of physical memory)");
  if (!options.data_dir.empty()) shard_options.spill_dir = options.data_dir + "/spill";
  // A pull touches twice its size (the answer, then the worker's copy of it): from half the
  // last-level cache on, its reader finds it in memory whichever way it was written, and
  // plain stores would first read every line they write. 64 MB pulls on the 2-core
  // development VM: 4,340-4,596 -> 6,577-7,865 MB/s, with the worker's copy streamed too
  // (GrpcStoreOptions::stream_copy_bytes; docs/lab/2026-12-03-streamed-copies.md).
  shard_options.stream_pull_bytes = common::LastLevelCacheBytes() / 2;
  shard_options.parallel_apply_values = ParallelApplyValues(config, common::UsableCores());
  shard_options.parallel_apply_range_values = ParallelApplyRangeValues(config);
  shard_options.apply_spin = ApplySpin(config, common::UsableCores());
  shard_options.apply_threads = ApplyHelpers(config, common::UsableCores());
  LOG(INFO) << "pushes of " << shard_options.parallel_apply_values
            << " dense values or more are applied on up to " << shard_options.apply_threads + 1
            << " threads, in ranges of at least " << shard_options.parallel_apply_range_values
            << " values; apply threads watch for work "
            << absl::ToInt64Microseconds(shard_options.apply_spin) << " us before they sleep";
  if (options.stop != nullptr) {
    shard_options.cancelled = [stop = options.stop] { return stop->requested(); };
  }
  ASSIGN_OR_RETURN(server->shard_, Shard::Create(config, shard_options));
  LogTables(*server->shard_, shard_options.spill_dir);
  if (options.data_dir.empty()) {
    LOG(WARNING) << "no --data_dir: this server's state is lost when it stops";
  } else {
    RETURN_IF_ERROR(server->Restore());
  }
  if (options.stop != nullptr && !options.stop->Attach(server.get())) {
    return absl::CancelledError("stopped by a signal before serving");
  }
  return server;
}

void StopRequest::Request() {
  absl::MutexLock lock(&mu_);
  requested_ = true;
  if (server_ != nullptr) server_->RequestStop();
}

bool StopRequest::requested() const {
  absl::MutexLock lock(&mu_);
  return requested_;
}

bool StopRequest::Attach(ParameterServer* server) {
  absl::MutexLock lock(&mu_);
  if (requested_) return false;
  server_ = server;
  return true;
}

void StopRequest::Detach(const ParameterServer* server) {
  absl::MutexLock lock(&mu_);
  if (server_ == server) server_ = nullptr;
}

ParameterServer::ParameterServer(const JobConfig& config, const ParameterServerOptions& options)
    : config_(config), options_(options), final_checkpoint_(config.checkpoint().on_shutdown()) {}

ParameterServer::~ParameterServer() {
  // A signal arriving from now on finds no server to stop.
  if (options_.stop != nullptr) options_.stop->Detach(this);
  // Stop serving before the service, checkpointer and shard go (reverse member order would
  // destroy the gRPC server first anyway; this also stops the checkpointer's thread). Pulls
  // parked for the bound and deterministic pushes waiting for their turn end first: the
  // shutdown waits for the pool's calls, and those would hold it to their deadlines (before
  // 2026-12-06, found in review: up to server.max_pull_wait_s, for a server destroyed
  // without Wait, e.g. when its start failed after serving began).
  if (shard_ != nullptr) shard_->CloseWaiters("the server is stopping");
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(absl::ZeroDuration());
    grpc_server_->Wait();
  }
  if (checkpointer_ != nullptr) checkpointer_->Stop();
}

absl::Status ParameterServer::Restore() {
  const std::string& data_dir = options_.data_dir;
  CheckpointerOptions options;
  options.data_dir = data_dir;
  options.keep = config_.checkpoint().keep();
  options.interval = absl::Seconds(config_.checkpoint().interval_s());
  options.every_updates = config_.checkpoint().every_updates();
  ASSIGN_OR_RETURN(checkpointer_, Checkpointer::Create(shard_.get(), options));
  if (!options_.restore) {
    // The checkpoints there belong to a run this one does not continue: a restart of this
    // server with the default --restore=latest must not go back to them.
    return checkpointer_->StartFresh();
  }
  const std::optional<uint64_t> previous_updates = ReadProgress(data_dir);
  ASSIGN_OR_RETURN(RestoreReport report, checkpointer_->Restore(options_.restore_id),
                   absl::StrCat("restoring from ", data_dir));
  for (const absl::Status& skipped : report.skipped) {
    LOG(ERROR) << "skipped a checkpoint that fails verification: " << skipped;
  }
  if (report.checkpoint_id == 0) {
    LOG(INFO) << "no checkpoint in " << data_dir << ": starting from initial values";
  } else {
    LOG(INFO) << "restored checkpoint " << report.checkpoint_id << " from " << data_dir << ": "
              << report.bytes << " bytes, " << report.updates_applied
              << " updates applied, written "
              << absl::FormatTime(absl::FromUnixMicros(report.unix_micros));
    LogSparseTables(shard_.get());
  }
  if (previous_updates.has_value()) {
    updates_lost_ = *previous_updates > report.updates_applied
                        ? *previous_updates - report.updates_applied
                        : 0;
    // PROGRESS is rewritten once a second, so updates applied after its last write are not in
    // it: the count is a lower bound, short by at most about one second of updates.
    LOG(WARNING) << "the previous run of this server had applied at least " << *previous_updates
                 << " updates: at least " << updates_lost_
                 << " updates since the restored checkpoint were lost (a lower bound: updates "
                    "applied in the last second before it stopped are not counted)";
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::Start() {
  if (config_.security().plaintext()) {
    LOG(WARNING) << "security.plaintext is set: calls are neither encrypted nor authenticated, "
                    "and identities are not checked: any client can act as any worker or as "
                    "the operator";
  }
  ServiceHooks hooks;
  if (checkpointer_ != nullptr) {
    hooks.checkpoint = [this] { return checkpointer_->CheckpointNow(); };
    hooks.stats = [this](StatsResponse* out) { checkpointer_->FillStats(out); };
    hooks.server_info = [this](ServerInfoResponse* out) {
      out->set_restored_checkpoint_id(checkpointer_->restored().checkpoint_id);
      out->set_updates_lost(updates_lost_);
    };
  }
  hooks.shutdown = [this](bool checkpoint) { RequestStop(checkpoint); };
  ServiceOptions service_options;
  service_options.num_threads = ServingThreads(config_, options_.num_threads);
  service_options.max_pull_wait = absl::Seconds(config_.server().max_pull_wait_s());
  service_options.max_pool_requests = PoolRequests(config_);
  service_options.max_pool_request_bytes = config_.server().max_pool_request_bytes();
  service_options.max_answer_bytes = config_.server().max_message_bytes();
  service_options.max_unsent_answer_bytes = config_.server().max_unsent_answer_bytes();
  service_options.max_unsent_answer_bytes_per_peer =
      config_.server().max_unsent_answer_bytes_per_peer();
  service_options.channel_busy_poll = absl::Microseconds(config_.server().busy_poll_us());
  service_options.channel_threads = std::max(1u, common::UsableCores() / 2);
  service_options.max_shared_bytes_per_worker = size_t{config_.server().max_shared_memory_mb()}
                                                << 20;
  service_options.auth.check_identities = !config_.security().plaintext();
  service_options.auth.operator_token_required =
      !config_.security().operator_token_file().empty();
  service_ = std::make_unique<ParameterServerService>(shard_.get(), service_options,
                                                      std::move(hooks), &metrics_);

  // Metrics read at scrape time.
  up_ = metrics_.AddGauge("ps_server_up", "1 while this server serves, 0 while it shuts down.");
  stats_metrics_ = RegisterServerStats(
      &metrics_,
      [this](StatsResponse* out) {
        shard_->FillStats(out);
        if (checkpointer_ != nullptr) checkpointer_->FillStats(out);
      },
      /*checkpoints=*/checkpointer_ != nullptr);
  process_metrics_ = common::metrics::RegisterProcessMetrics(&metrics_);
  if (options_.metrics_port >= 0) {
    common::metrics::HttpServerOptions http;
    http.host = config_.metrics().has_host()
                    ? config_.metrics().host()
                    : (options_.metrics_host.empty() ? options_.host : options_.metrics_host);
    http.port = options_.metrics_port;
    ASSIGN_OR_RETURN(metrics_server_, common::metrics::MetricsHttpServer::Start(http, &metrics_));
  }

  GrpcServerOptions grpc_options;
  grpc_options.address = common::HostPort(options_.host, options_.port);
  grpc_options.max_message_bytes = config_.server().max_message_bytes();
  grpc_options.max_concurrent_streams = static_cast<int>(config_.server().max_concurrent_streams());
  grpc_options.handshake_timeout = absl::Seconds(config_.server().handshake_timeout_s());
  grpc_options.busy_poll = absl::Microseconds(config_.server().busy_poll_us());
  grpc_options.data_threads = DataThreads(config_, common::UsableCores());
  LOG(INFO) << "serving the data path on " << grpc_options.data_threads << " thread"
            << (grpc_options.data_threads == 1
                    ? absl::StrCat(", polling ", config_.server().busy_poll_us(),
                                   " us before it sleeps")
                    : "s (no busy polling)");
  ASSIGN_OR_RETURN(grpc_server_,
                   GrpcServer::Start(grpc_options, config_.security(), service_.get()));
  grpc_server_->SetServing(true);
  up_->Set(1);
  if (checkpointer_ != nullptr) checkpointer_->Start();
  return absl::OkStatus();
}

int ParameterServer::port() const { return grpc_server_ ? grpc_server_->port() : 0; }

int ParameterServer::metrics_port() const {
  return metrics_server_ ? metrics_server_->port() : -1;
}

void ParameterServer::RequestStop(bool final_checkpoint) {
  absl::MutexLock lock(&mu_);
  final_checkpoint_ = final_checkpoint_ && final_checkpoint;
  if (!stop_requested_.HasBeenNotified()) stop_requested_.Notify();
}

void ParameterServer::ServeUntilStopped() {
  // Leases expire with time, not with events: wake pulls waiting on the bound now and then.
  absl::Time last_progress = absl::InfinitePast();
  while (!stop_requested_.WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
    for (int32_t worker : shard_->workers().Poke()) {
      LOG(WARNING) << "worker " << worker << " not heard from for "
                   << config_.server().worker_lease_s()
                   << " s: it leaves the consistency bound until it is back";
    }
    if (!options_.data_dir.empty() && absl::Now() - last_progress >= absl::Seconds(1)) {
      WriteProgress(options_.data_dir, shard_->updates_applied());
      last_progress = absl::Now();
    }
    if (options_.exit_when_done && shard_->workers().AllFinished()) {
      LOG(INFO) << "all " << config_.cluster().num_workers()
                << " workers finished: shutting down";
      return;
    }
  }
}

absl::Status ParameterServer::Drain() {
  grpc_server_->SetServing(false);
  up_->Set(0);
  // Pulls parked for the consistency bound would otherwise hold the drain to its end: no
  // more pushes come to release them.
  shard_->CloseWaiters("the server is shutting down");
  // Calls in flight finish (bounded), new ones are refused; the same for calls through the
  // workers' shared-memory channels.
  grpc_server_->Shutdown(absl::Seconds(5));
  service_->StopChannels(absl::Seconds(5));
  absl::Status result;
  if (checkpointer_ != nullptr) {
    checkpointer_->Stop();
    bool final_checkpoint;
    {
      absl::MutexLock lock(&mu_);
      final_checkpoint = final_checkpoint_;
    }
    if (final_checkpoint) {
      absl::StatusOr<CheckpointResponse> r = checkpointer_->CheckpointNow();
      if (r.ok()) {
        LOG(INFO) << "final checkpoint " << r->checkpoint_id() << ": " << r->bytes()
                  << " bytes in " << r->duration_s() << " s";
      } else {
        LOG(ERROR) << "final checkpoint failed: " << r.status();
        result = r.status();
      }
    }
  }
  grpc_server_->Wait();
  if (!options_.data_dir.empty()) WriteProgress(options_.data_dir, shard_->updates_applied());
  return result;
}

absl::Status ParameterServer::Wait() {
  if (grpc_server_ == nullptr) return absl::FailedPreconditionError("Wait() before Start()");
  ServeUntilStopped();
  absl::Status status = Drain();
  LogSparseTables(shard_.get());
  LOG(INFO) << "stopped after " << shard_->updates_applied() << " updates";
  StatsResponse stats;
  shard_->FillStats(&stats);
  auto per_call_us = [](double seconds, uint64_t calls) {
    return calls == 0 ? 0.0 : 1e6 * seconds / static_cast<double>(calls);
  };
  LOG(INFO) << "time in the tables: " << stats.pushes() << " pushes, check "
            << per_call_us(stats.push_check_s(), stats.pushes()) << " us + apply "
            << per_call_us(stats.push_apply_s(), stats.pushes()) << " us each; " << stats.pulls()
            << " pulls, read " << per_call_us(stats.pull_read_s(), stats.pulls()) << " us each";
  return status;
}

}  // namespace ps::server
