// ps_server: one parameter server of a job.
//
//   ps_server --config=configs/fashion_mnist_2x2_async.textproto --server_index=0 --port=0
//             --data_dir=/var/lib/ps/server0
//
// Flags -> ParameterServerOptions -> ParameterServer (server/parameter_server.h), which holds
// this server's part of every table, applies pushes, checkpoints into RocksDB under
// --data_dir and restores the newest checkpoint at start. Prints "ps_server <index> listening
// on <host>:<port>" once it serves. SIGTERM/SIGINT: health NOT_SERVING, drain in-flight calls,
// final checkpoint, exit 0 (1 if the final checkpoint failed).
//
// Under Kubeflow (TF_CONFIG), SLURM (srun) or mpirun the index, the port and the cluster come
// from the environment instead (--cluster_from, see common/cluster/cluster_env.h).
#include <climits>
#include <csignal>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/cluster/cluster_env.h"
#include "common/startup/atomic_file.h"
#include "common/startup/flag_check.h"
#include "common/startup/main_flags.h"
#include "common/status_macros.h"
#include "server/parameter_server.h"

ABSL_FLAG(int32_t, server_index, -1,
          "This server's index, 0..num_servers-1 (required unless the environment gives it).");
ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on (127.0.0.1 for local only).");
ABSL_FLAG(int32_t, port, 0, "Port to listen on; 0 picks a free one (printed).");
ABSL_FLAG(std::string, port_file, "",
          "If set, the chosen port is written to this file once the server serves.");
ABSL_FLAG(std::string, data_dir, "",
          "Directory of this server's RocksDB checkpoints; empty = no persistence.");
ABSL_FLAG(double, checkpoint_interval, -1,
          "Seconds between periodic checkpoints; overrides checkpoint.interval_s (0 = off).");
ABSL_FLAG(std::string, restore, "latest",
          "Which checkpoint to restore at start: latest, none, or a checkpoint id. none, or an "
          "id older than the newest, supersedes the newer checkpoints: a later restart with "
          "latest continues from this run, not from them.");
ABSL_FLAG(int32_t, threads, 0, "Threads serving pulls and pushes (0 = server.num_threads).");
ABSL_FLAG(bool, exit_when_done, true,
          "Shut down gracefully (final checkpoint, exit 0) once every worker of the job has "
          "said it finished.");

namespace ps::server {
namespace {

// Flag ranges, checked before anything starts (common/startup/flag_check.h). The flags
// shared with ps_worker are checked in common/startup/main_flags.cc.
absl::Status ValidateFlags() {
  return common::AllFlagsInRange({
      common::CheckIntFlagRange("port", absl::GetFlag(FLAGS_port), 0, 65535, "0..65535"),
      common::CheckIntFlagRange("server_index", absl::GetFlag(FLAGS_server_index), -1,
                                INT32_MAX, "0..num_servers-1"),
      common::CheckIntFlagRange("threads", absl::GetFlag(FLAGS_threads), 0, 4096,
                                "0 (server.num_threads) or 1..4096"),
      common::CheckDoubleFlagRange("checkpoint_interval", absl::GetFlag(FLAGS_checkpoint_interval),
                                   0, common::kNoLimit,
                                   "seconds >= 0 (0 = off), or -1 for the config's", -1),
  });
}

absl::Status ParseRestore(const std::string& flag, ParameterServerOptions* options) {
  options->restore = flag != "none";
  if (flag == "latest" || flag == "none") return absl::OkStatus();
  uint64_t id;
  if (!absl::SimpleAtoi(flag, &id) || id == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--restore=", flag, ": expected latest, none or a checkpoint id"));
  }
  options->restore_id = id;
  return absl::OkStatus();
}

absl::Status Run() {
  RETURN_IF_ERROR(ValidateFlags());
  // SIGTERM/SIGINT are blocked in every thread (before any starts) and awaited on one.
  const sigset_t stop_signals = common::BlockStopSignals();
  common::ClusterOptions cluster_options;
  cluster_options.role = common::ClusterRole::kServer;
  cluster_options.index_flag = "--server_index";
  if (absl::GetFlag(FLAGS_server_index) >= 0) {
    cluster_options.index = absl::GetFlag(FLAGS_server_index);
  }
  if (absl::GetFlag(FLAGS_port) != 0) cluster_options.port = absl::GetFlag(FLAGS_port);
  ASSIGN_OR_RETURN(common::StartupConfig startup,
                   common::LoadStartupConfig(cluster_options, /*extra_overrides=*/{}));
  JobConfig& config = startup.config;
  if (common::PrintConfigIfAsked(config)) return absl::OkStatus();
  const common::ClusterIdentity& cluster = startup.cluster;
  if (!cluster.index.has_value()) return absl::InvalidArgumentError("--server_index is required");
  if (absl::GetFlag(FLAGS_checkpoint_interval) != -1) {
    config.mutable_checkpoint()->set_interval_s(absl::GetFlag(FLAGS_checkpoint_interval));
  }

  ParameterServerOptions options;
  options.server_index = *cluster.index;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = cluster.port != 0 ? cluster.port : absl::GetFlag(FLAGS_port);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  RETURN_IF_ERROR(ParseRestore(absl::GetFlag(FLAGS_restore), &options));
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.metrics_port = startup.metrics_port;
  options.exit_when_done = absl::GetFlag(FLAGS_exit_when_done);
  // From before the tables are allocated (minutes for gigabytes): a signal cancels that.
  StopRequest stop;
  common::StopSignalThread stop_signal_thread(stop_signals, [&stop] { stop.Request(); });
  options.stop = &stop;
  ASSIGN_OR_RETURN(std::unique_ptr<ParameterServer> server,
                   ParameterServer::Create(config, options));
  RETURN_IF_ERROR(server->Start());

  const int32_t index = options.server_index;
  if (server->metrics_port() >= 0) {
    RETURN_IF_ERROR(common::AnnounceMetricsPort(absl::StrCat("ps_server ", index),
                                                config.metrics().has_host()
                                                    ? config.metrics().host()
                                                    : options.host,
                                                server->metrics_port()));
  }
  std::cout << "ps_server " << index << " listening on "
            << common::HostPort(options.host, server->port()) << std::endl;
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    RETURN_IF_ERROR(common::WriteFileAtomically(absl::GetFlag(FLAGS_port_file),
                                                absl::StrCat(server->port(), "\n")));
  }
  if (!cluster.rendezvous_job_dir.empty()) {
    RETURN_IF_ERROR(common::PublishServerAddress(
        cluster.rendezvous_job_dir, index,
        common::HostPort(common::AdvertisedHost(options.host), server->port())));
  }

  return server->Wait();
}

}  // namespace
}  // namespace ps::server

int main(int argc, char** argv) {
  return ps::common::RunMain(argc, argv, "ps_server",
                             "Runs one parameter server of a job. Example:\n  ps_server "
                             "--config=job.textproto --server_index=0 --port=0 "
                             "--data_dir=/var/lib/ps/0",
                             ps::server::Run);
}
