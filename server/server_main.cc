// ps_server: one parameter server of a job.
//
//   ps_server --config=configs/mnist_mlp_2x2_async.textproto --server_index=0 --port=0 \
//             --data_dir=/var/lib/ps/server0
//
// Holds its part of every table in memory, applies pushes with each table's optimizer,
// checkpoints into RocksDB under --data_dir (on a timer, on demand, on SIGTERM) and restores
// the newest checkpoint at start. Prints "ps_server <index> listening on <host>:<port>" once
// it serves. SIGTERM/SIGINT: health NOT_SERVING, drain in-flight calls, final checkpoint,
// exit 0.
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
#include "common/config.h"
#include "common/overrides.h"
#include "common/rpc/credentials.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/checkpointer.h"
#include "server/rpc/service.h"
#include "server/shard.h"

ABSL_FLAG(std::string, config, "", "Path of the job's JobConfig textproto (required).");
ABSL_FLAG(std::string, set, "",
          "Config overrides, comma-separated path=value (e.g. "
          "training.epochs=3,model.mlp.hidden=256,128); see README.");
ABSL_FLAG(int32_t, server_index, -1, "This server's index, 0..num_servers-1 (required).");
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

absl::Status Run() {
  const sigset_t stop_signals = BlockStopSignals();
  if (absl::GetFlag(FLAGS_config).empty()) {
    return absl::InvalidArgumentError("--config is required");
  }
  ASSIGN_OR_RETURN(JobConfig config, common::LoadAndPrepareJobConfig(
                                         absl::GetFlag(FLAGS_config), common::SplitOverrides(absl::GetFlag(FLAGS_set))));
  const int32_t index = absl::GetFlag(FLAGS_server_index);
  if (index < 0) return absl::InvalidArgumentError("--server_index is required");
  // Fields of the schema whose features are not built yet: refuse rather than ignore them.
  for (const TableConfig& t : config.tables()) {
    if (t.memory_budget_rows() > 0) {
      return absl::UnimplementedError(absl::StrCat(
          "table '", t.name(), "': memory_budget_rows (tables larger than memory) is not "
          "implemented yet"));
    }
  }
  if (config.metrics().port() >= 0) {
    return absl::UnimplementedError("metrics.port: the /metrics endpoint is not implemented yet");
  }
  if (absl::GetFlag(FLAGS_checkpoint_interval) >= 0) {
    config.mutable_checkpoint()->set_interval_s(absl::GetFlag(FLAGS_checkpoint_interval));
  }

  ShardOptions shard_options;
  shard_options.server_index = static_cast<uint32_t>(index);
  shard_options.incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  shard_options.reject_nonfinite = config.server().reject_nonfinite();
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
              << ", optimizer " << OptimizerConfig::Kind_Name(t.config->optimizer().kind());
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
  service_options.max_pull_wait = absl::Seconds(config.server().max_pull_wait_s());
  ParameterServerService service(shard.get(), service_options, hooks);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string address =
      absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
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
  if (checkpointer != nullptr) checkpointer->Start();

  std::cout << "ps_server " << index << " listening on " << absl::GetFlag(FLAGS_host) << ":"
            << port << std::endl;
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    const std::string tmp = absl::GetFlag(FLAGS_port_file) + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), absl::GetFlag(FLAGS_port_file).c_str());
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
  absl::Status status = ps::server::Run();
  if (!status.ok()) {
    LOG(ERROR) << "ps_server: " << status;
    std::cerr << "ps_server: " << status << std::endl;
    return 1;
  }
  return 0;
}
