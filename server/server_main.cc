// ps_server: one parameter server of a job.
//
//   ps_server --config=configs/fashion_mnist_2x2_async.textproto --server_index=0 --port=0
//             --data_dir=/var/lib/ps/server0
//
// Holds its part of every table in memory, applies pushes with each table's optimizer,
// checkpoints into RocksDB under --data_dir (on a timer, on demand, on SIGTERM) and restores
// the newest checkpoint at start. Prints "ps_server <index> listening on <host>:<port>" once
// it serves. SIGTERM/SIGINT: health NOT_SERVING, drain in-flight calls, final checkpoint,
// exit 0.
//
// Under Kubeflow (TF_CONFIG), SLURM (srun) or mpirun the index, the port and the cluster come
// from the environment instead (--cluster_from, see common/cluster_env.h).
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/process_memory.h"
#include "common/cluster_env.h"
#include "common/config.h"
#include "common/metrics/http_server.h"
#include "common/metrics/metrics.h"
#include "common/overrides.h"
#include "common/rpc/credentials.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/checkpointer.h"
#include "server/rpc/service.h"
#include "server/server_metrics.h"
#include "server/shard.h"

ABSL_FLAG(std::string, config, "", "Path of the job's JobConfig textproto (required).");
ABSL_FLAG(std::string, set, "",
          "Config overrides, comma-separated path=value (e.g. "
          "training.epochs=3,model.mlp.hidden=256,128); see README.");
ABSL_FLAG(int32_t, server_index, -1,
          "This server's index, 0..num_servers-1 (required unless the environment gives it).");
ABSL_FLAG(std::string, cluster_from, "auto",
          "Where the index, port and cluster come from: flags, tf_config (Kubeflow TF_CONFIG), "
          "slurm (srun), mpi (mpirun, with --rendezvous_dir), or auto (TF_CONFIG if set, else "
          "SLURM if SLURM_PROCID is set, else flags).");
ABSL_FLAG(int32_t, base_port, 0,
          "SLURM: listen on this port + the local rank on the node; 0 = derived from "
          "SLURM_JOB_ID.");
ABSL_FLAG(std::string, rendezvous_dir, "",
          "MPI: a directory every rank shares, where this server leaves its host:port.");
ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on (127.0.0.1 for local only).");
ABSL_FLAG(int32_t, port, 0, "Port to listen on; 0 picks a free one (printed).");
ABSL_FLAG(std::string, port_file, "",
          "If set, the chosen port is written to this file once the server serves.");
ABSL_FLAG(std::string, data_dir, "",
          "Directory of this server's RocksDB checkpoints; empty = no persistence.");
ABSL_FLAG(double, checkpoint_interval, -1,
          "Seconds between periodic checkpoints; overrides checkpoint.interval_s (0 = off).");
ABSL_FLAG(std::string, restore, "latest",
          "Which checkpoint to restore at start: latest, none, or a checkpoint id.");
ABSL_FLAG(int32_t, threads, 0, "Threads serving pulls and pushes (0 = server.num_threads).");
ABSL_FLAG(int32_t, metrics_port, -2,
          "Port of the Prometheus /metrics endpoint; overrides metrics.port (-1 = off, 0 = a "
          "free port, printed). The default, -2, keeps metrics.port.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "If set, the metrics endpoint's port is written to this file once it serves.");
ABSL_FLAG(bool, exit_when_done, true,
          "Shut down gracefully (final checkpoint, exit 0) once every worker of the job has "
          "said it finished.");

namespace ps::server {
namespace {

// Blocks SIGTERM/SIGINT in every thread (call before starting any) and waits for them on a
// dedicated one.
sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

absl::StatusOr<std::optional<uint64_t>> ParseRestore(const std::string& flag, bool* skip) {
  *skip = false;
  if (flag == "latest") return std::optional<uint64_t>();
  if (flag == "none") {
    *skip = true;
    return std::optional<uint64_t>();
  }
  uint64_t id;
  if (!absl::SimpleAtoi(flag, &id) || id == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--restore=", flag, ": expected latest, none or a checkpoint id"));
  }
  return std::optional<uint64_t>(id);
}

// The progress file: "<updates applied>\n", rewritten about every second (write + rename),
// so that after a crash the next start can tell how many updates its checkpoint misses.
std::string ProgressPath(const std::string& data_dir) { return data_dir + "/PROGRESS"; }

std::optional<uint64_t> ReadProgress(const std::string& data_dir) {
  std::ifstream in(ProgressPath(data_dir));
  uint64_t updates = 0;
  if (in >> updates) return updates;
  return std::nullopt;
}

void WriteProgress(const std::string& data_dir, uint64_t updates) {
  const std::string path = ProgressPath(data_dir);
  {
    std::ofstream out(path + ".tmp", std::ios::trunc);
    out << updates << "\n";
    if (!out) return;  // best effort: a full disk must not stop training
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

// The name workers reach this host by: the --host address, or for a wildcard the host name.
std::string AdvertisedHost(const std::string& listen_host) {
  if (!listen_host.empty() && listen_host != "0.0.0.0" && listen_host != "::" &&
      listen_host != "[::]") {
    return listen_host;
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// One line per sparse table: its rows, and for a table with a memory budget how many are in
// memory and spilled, and how many moved since the start.
void LogSparseTables(Shard* shard) {
  for (const auto& t : shard->partitioner().tables()) {
    if (t.kind != TABLE_KIND_SPARSE) continue;
    absl::StatusOr<SparseTablePart*> part = shard->FindSparseTable(t.name);
    if (!part.ok()) continue;
    const SpillStats st = (*part)->spill_stats();
    if (!(*part)->spills()) {
      LOG(INFO) << "table '" << t.name << "': " << st.resident_rows << " rows, all in memory";
      continue;
    }
    LOG(INFO) << "table '" << t.name << "': " << st.resident_rows + st.spilled_rows << " rows, "
              << st.resident_rows << " in memory (budget " << (*part)->budget_rows() << "), "
              << st.spilled_rows << " spilled; since the start " << st.faults
              << " faulted in and " << st.evictions << " evicted (" << st.writes << " written)"
              << (st.eviction_errors > 0 ? absl::StrCat(", ", st.eviction_errors,
                                                        " evictions failed")
                                         : "");
  }
}

absl::Status Run() {
  const sigset_t stop_signals = BlockStopSignals();
  const std::string config_path = absl::GetFlag(FLAGS_config);
  if (config_path.empty()) return absl::InvalidArgumentError("--config is required");
  ASSIGN_OR_RETURN(
      JobConfig config,
      common::LoadJobConfig(config_path, common::SplitOverrides(absl::GetFlag(FLAGS_set))));
  // The cluster identity: from the flags, or from the environment (checked against them).
  common::ClusterOptions cluster_options;
  cluster_options.cluster_from = absl::GetFlag(FLAGS_cluster_from);
  cluster_options.role = common::ClusterRole::kServer;
  if (absl::GetFlag(FLAGS_server_index) >= 0) {
    cluster_options.index = absl::GetFlag(FLAGS_server_index);
  }
  cluster_options.index_flag = "--server_index";
  if (absl::GetFlag(FLAGS_port) != 0) cluster_options.port = absl::GetFlag(FLAGS_port);
  cluster_options.base_port = absl::GetFlag(FLAGS_base_port);
  cluster_options.rendezvous_dir = absl::GetFlag(FLAGS_rendezvous_dir);
  ASSIGN_OR_RETURN(
      common::ClusterIdentity cluster,
      common::ResolveCluster(cluster_options, common::EnvMapFromEnviron(environ), &config));
  RETURN_IF_ERROR_CTX(common::ExpandModelTables(&config), config_path);
  RETURN_IF_ERROR_CTX(common::ValidateJobConfig(config), config_path);
  if (!cluster.index.has_value()) return absl::InvalidArgumentError("--server_index is required");
  const int32_t index = *cluster.index;
  if (!cluster.description.empty()) LOG(INFO) << cluster.description;
  const int32_t listen_port = cluster.port != 0 ? cluster.port : absl::GetFlag(FLAGS_port);
  // Rows beyond a table's memory budget are spilled under the data dir.
  for (const TableConfig& t : config.tables()) {
    if (t.memory_budget_rows() > 0 && absl::GetFlag(FLAGS_data_dir).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", t.name(), "' has memory_budget_rows: the server needs --data_dir (rows "
          "beyond the budget are spilled there)"));
    }
  }
  const int32_t metrics_port = absl::GetFlag(FLAGS_metrics_port) == -2
                                   ? config.metrics().port()
                                   : absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port < -1 || metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port=", metrics_port, ": expected -1 (off), 0 or a port"));
  }
  // Outlives everything that registers metrics in it (declared first, destroyed last).
  common::metrics::Registry metrics;
  if (absl::GetFlag(FLAGS_checkpoint_interval) >= 0) {
    config.mutable_checkpoint()->set_interval_s(absl::GetFlag(FLAGS_checkpoint_interval));
  }

  ShardOptions shard_options;
  shard_options.server_index = static_cast<uint32_t>(index);
  shard_options.incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  shard_options.reject_nonfinite = config.server().reject_nonfinite();
  if (!absl::GetFlag(FLAGS_data_dir).empty()) {
    shard_options.spill_dir = absl::GetFlag(FLAGS_data_dir) + "/spill";
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Shard> shard, Shard::Create(config, shard_options));
  for (const auto& t : shard->partitioner().tables()) {
    LOG(INFO) << "table '" << t.name << "': "
              << (t.kind == TABLE_KIND_DENSE ? absl::StrCat("dense, ", t.numel, " values in ",
                                                            t.num_blocks, " blocks, ",
                                                            shard->partitioner()
                                                                .BlocksOnServer(t, index)
                                                                .size(),
                                                            " here")
                                             : absl::StrCat("sparse, dim ", t.dim))
              << ", optimizer " << OptimizerConfig::Kind_Name(t.config->optimizer().kind())
              << (t.config->memory_budget_rows() > 0
                      ? absl::StrCat(", at most ", t.config->memory_budget_rows(),
                                     " rows in memory (the rest spilled to ",
                                     shard_options.spill_dir, ")")
                      : "");
  }

  std::unique_ptr<Checkpointer> checkpointer;
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  std::optional<uint64_t> previous_updates;
  uint64_t updates_lost = 0;
  if (!data_dir.empty()) {
    CheckpointerOptions options;
    options.data_dir = data_dir;
    options.keep = config.checkpoint().keep();
    options.interval = absl::Seconds(config.checkpoint().interval_s());
    options.every_updates = config.checkpoint().every_updates();
    ASSIGN_OR_RETURN(checkpointer, Checkpointer::Create(shard.get(), options));
    previous_updates = ReadProgress(data_dir);
    bool skip = false;
    ASSIGN_OR_RETURN(std::optional<uint64_t> which,
                     ParseRestore(absl::GetFlag(FLAGS_restore), &skip));
    if (!skip) {
      ASSIGN_OR_RETURN(RestoreReport report, checkpointer->Restore(which),
                       absl::StrCat("restoring from ", data_dir));
      if (report.checkpoint_id == 0) {
        LOG(INFO) << "no checkpoint in " << data_dir << ": starting from initial values";
      } else {
        LOG(INFO) << "restored checkpoint " << report.checkpoint_id << " from " << data_dir
                  << ": " << report.bytes << " bytes, " << report.updates_applied
                  << " updates applied, written "
                  << absl::FormatTime(absl::FromUnixMicros(report.unix_micros));
        LogSparseTables(shard.get());
      }
      if (previous_updates.has_value()) {
        updates_lost = *previous_updates > report.updates_applied
                           ? *previous_updates - report.updates_applied
                           : 0;
        LOG(WARNING) << "the previous run of this server had applied " << *previous_updates
                     << " updates: " << updates_lost
                     << " updates since the restored checkpoint were lost";
      }
    }
  } else {
    LOG(WARNING) << "no --data_dir: this server's state is lost when it stops";
  }

  if (config.security().plaintext()) {
    LOG(WARNING) << "security.plaintext is set: calls are neither encrypted nor authenticated";
  }
  ASSIGN_OR_RETURN(auto credentials, common::MakeServerCredentials(config.security()));

  absl::Notification shutdown_requested;
  bool final_checkpoint = config.checkpoint().on_shutdown();
  ServiceHooks hooks;
  if (checkpointer != nullptr) {
    hooks.checkpoint = [&] { return checkpointer->CheckpointNow(); };
    hooks.stats = [&](StatsResponse* out) { checkpointer->FillStats(out); };
    hooks.server_info = [&](ServerInfoResponse* out) {
      out->set_restored_checkpoint_id(checkpointer->restored().checkpoint_id);
      out->set_updates_lost(updates_lost);
    };
  }
  hooks.shutdown = [&](bool checkpoint) {
    final_checkpoint = final_checkpoint && checkpoint;
    if (!shutdown_requested.HasBeenNotified()) shutdown_requested.Notify();
  };
  ServiceOptions service_options;
  service_options.num_threads = absl::GetFlag(FLAGS_threads) > 0
                                    ? absl::GetFlag(FLAGS_threads)
                                    : (config.server().num_threads() > 0
                                           ? static_cast<int>(config.server().num_threads())
                                           : std::max(2u, std::thread::hardware_concurrency()));
  // Under SSP/BSP a pull (and, deterministic, a push) holds its thread while it waits for the
  // others: with fewer threads than workers, the push that would release them never runs.
  if (config.training().has_staleness()) {
    const int needed = static_cast<int>(config.cluster().num_workers()) + 2;
    if (service_options.num_threads < needed) {
      LOG(WARNING) << "serving with " << needed << " threads instead of "
                   << service_options.num_threads
                   << ": a synchronous job needs one per worker waiting, plus room";
      service_options.num_threads = needed;
    }
  }
  service_options.max_pull_wait = absl::Seconds(config.server().max_pull_wait_s());
  ParameterServerService service(shard.get(), service_options, hooks, &metrics);

  // Metrics read at scrape time; the handles go before the shard and checkpointer they read.
  common::metrics::Gauge* up =
      metrics.AddGauge("ps_server_up", "1 while this server serves, 0 while it shuts down.");
  common::metrics::CollectorHandle stats_metrics = RegisterServerStats(
      &metrics,
      [&](StatsResponse* out) {
        shard->FillStats(out);
        if (checkpointer != nullptr) checkpointer->FillStats(out);
      },
      /*checkpoints=*/checkpointer != nullptr);
  common::metrics::CollectorHandle process_metrics =
      common::metrics::RegisterProcessMetrics(&metrics);
  std::unique_ptr<common::metrics::MetricsHttpServer> metrics_server;
  if (metrics_port >= 0) {
    common::metrics::HttpServerOptions http;
    http.host = config.metrics().has_host() ? config.metrics().host() : absl::GetFlag(FLAGS_host);
    http.port = metrics_port;
    ASSIGN_OR_RETURN(metrics_server, common::metrics::MetricsHttpServer::Start(http, &metrics));
    std::cout << "ps_server " << index << " metrics on http://" << http.host << ":"
              << metrics_server->port() << "/metrics" << std::endl;
    if (!absl::GetFlag(FLAGS_metrics_port_file).empty()) {
      const std::string tmp = absl::GetFlag(FLAGS_metrics_port_file) + ".tmp";
      std::ofstream(tmp) << metrics_server->port() << "\n";
      std::rename(tmp.c_str(), absl::GetFlag(FLAGS_metrics_port_file).c_str());
    }
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", listen_port);
  builder.AddListeningPort(address, credentials, &port);
  const int max_bytes =
      static_cast<int>(std::min<uint64_t>(config.server().max_message_bytes(), INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_bytes);
  builder.SetMaxSendMessageSize(max_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  up->Set(1);
  if (checkpointer != nullptr) checkpointer->Start();

  std::cout << "ps_server " << index << " listening on " << absl::GetFlag(FLAGS_host) << ":"
            << port << std::endl;
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    const std::string tmp = absl::GetFlag(FLAGS_port_file) + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), absl::GetFlag(FLAGS_port_file).c_str());
  }
  if (!cluster.rendezvous_job_dir.empty()) {
    RETURN_IF_ERROR(common::PublishServerAddress(
        cluster.rendezvous_job_dir, index,
        absl::StrCat(AdvertisedHost(absl::GetFlag(FLAGS_host)), ":", port)));
  }

  // Signals arrive on this thread; the Shutdown RPC notifies too.
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (sig == SIGTERM || sig == SIGINT) {
      LOG(INFO) << "signal " << sig << ": shutting down";
      if (!shutdown_requested.HasBeenNotified()) shutdown_requested.Notify();
    }
  });
  // Leases expire with time, not with events: wake pulls waiting on the bound now and then.
  absl::Time last_progress = absl::InfinitePast();
  while (!shutdown_requested.WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
    for (int32_t worker : shard->workers().Poke()) {
      LOG(WARNING) << "worker " << worker << " not heard from for "
                   << config.server().worker_lease_s()
                   << " s: it leaves the consistency bound until it is back";
    }
    if (!data_dir.empty() && absl::Now() - last_progress >= absl::Seconds(1)) {
      WriteProgress(data_dir, shard->updates_applied());
      last_progress = absl::Now();
    }
    if (absl::GetFlag(FLAGS_exit_when_done) && shard->workers().AllFinished()) {
      LOG(INFO) << "all " << config.cluster().num_workers() << " workers finished: shutting down";
      break;
    }
  }

  server->GetHealthCheckService()->SetServingStatus(false);
  up->Set(0);
  // Drain: calls in flight finish (bounded), new ones are refused.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (checkpointer != nullptr) {
    checkpointer->Stop();
    if (final_checkpoint) {
      absl::StatusOr<CheckpointResponse> r = checkpointer->CheckpointNow();
      if (r.ok()) {
        LOG(INFO) << "final checkpoint " << r->checkpoint_id() << ": " << r->bytes()
                  << " bytes in " << r->duration_s() << " s";
      } else {
        LOG(ERROR) << "final checkpoint failed: " << r.status();
      }
    }
  }
  server->Wait();
  if (!data_dir.empty()) WriteProgress(data_dir, shard->updates_applied());
  // Wake the signal thread if the shutdown came over RPC.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  LogSparseTables(shard.get());
  LOG(INFO) << "stopped after " << shard->updates_applied() << " updates";
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps::server

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Runs one parameter server of a job. Example:\n  ps_server --config=job.textproto "
      "--server_index=0 --port=0 --data_dir=/var/lib/ps/0");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // Before any thread starts: freed payload memory stays mapped for the next call.
  if (absl::Status s = ps::common::KeepFreedMemoryForReuse(); !s.ok()) LOG(WARNING) << s;
  absl::Status status = ps::server::Run();
  if (!status.ok()) {
    LOG(ERROR) << "ps_server: " << status;
    std::cerr << "ps_server: " << status << std::endl;
    return 1;
  }
  return 0;
}
