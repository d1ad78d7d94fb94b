#include "common/startup/main_flags.h"

#include <pthread.h>
#include <unistd.h>

#include <iostream>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/config/overrides.h"
#include "common/startup/atomic_file.h"
#include "common/startup/flag_check.h"
#include "common/startup/process_memory.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, config, "", "Path of the job's JobConfig textproto (required).");
ABSL_FLAG(std::string, set, "",
          "Config overrides, comma-separated path=value (e.g. "
          "training.epochs=3,model.mlp.hidden=256,128); see docs/configuration.md.");
ABSL_FLAG(std::string, cluster_from, "auto",
          "Where the index, port and cluster come from: flags, tf_config (Kubeflow TF_CONFIG), "
          "slurm (srun), mpi (mpirun, with --rendezvous_dir), or auto (TF_CONFIG if set, else "
          "SLURM if SLURM_PROCID is set, else flags).");
ABSL_FLAG(int32_t, base_port, 0,
          "SLURM: the servers listen on this port + their local rank on the node; 0 = derived "
          "from SLURM_JOB_ID.");
ABSL_FLAG(std::string, rendezvous_dir, "",
          "MPI: a directory every rank shares, where the servers leave their host:port.");
ABSL_FLAG(int32_t, metrics_port, -2,
          "Port of the Prometheus /metrics endpoint; overrides metrics.port (-1 = off, 0 = a "
          "free port, printed). The default, -2, keeps metrics.port.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "If set, the metrics endpoint's port is written to this file once it serves.");
ABSL_FLAG(bool, print_config, false,
          "Print the job config as this process would run it (after --set, the environment's "
          "cluster and the model's tables) as JSON on stdout, and exit.");

namespace ps::common {

absl::StatusOr<StartupConfig> LoadStartupConfig(ClusterOptions cluster_options,
                                                const std::vector<std::string>& extra_overrides) {
  StartupConfig out;
  out.config_path = absl::GetFlag(FLAGS_config);
  if (out.config_path.empty()) return absl::InvalidArgumentError("--config is required");
  std::vector<std::string> overrides = SplitOverrides(absl::GetFlag(FLAGS_set));
  overrides.insert(overrides.end(), extra_overrides.begin(), extra_overrides.end());
  ASSIGN_OR_RETURN(out.config, LoadJobConfig(out.config_path, overrides));
  if (cluster_options.cluster_from == "auto") {
    cluster_options.cluster_from = absl::GetFlag(FLAGS_cluster_from);
  }
  cluster_options.base_port = absl::GetFlag(FLAGS_base_port);
  RETURN_IF_ERROR(CheckIntFlagRange("base_port", cluster_options.base_port, 0, 65535, "0..65535"));
  cluster_options.rendezvous_dir = absl::GetFlag(FLAGS_rendezvous_dir);
  ASSIGN_OR_RETURN(out.cluster,
                   ResolveCluster(cluster_options, EnvMapFromEnviron(environ), &out.config));
  RETURN_IF_ERROR_CTX(ExpandModelTables(&out.config), out.config_path);
  RETURN_IF_ERROR_CTX(ValidateJobConfig(out.config), out.config_path);
  if (!out.cluster.description.empty()) LOG(INFO) << out.cluster.description;
  const int32_t flag = absl::GetFlag(FLAGS_metrics_port);
  out.metrics_port = flag == -2 ? out.config.metrics().port() : flag;
  RETURN_IF_ERROR(CheckIntFlagRange("metrics_port", out.metrics_port, -1, 65535,
                                    "-1 (off), 0 or a port"));
  return out;
}

std::vector<std::string> FlagOverrides(
    std::initializer_list<std::pair<const char*, std::string>> flags) {
  std::vector<std::string> overrides;
  for (const auto& [path, value] : flags) {
    if (!value.empty()) overrides.push_back(absl::StrCat(path, "=", value));
  }
  return overrides;
}

bool PrintConfigIfAsked(const JobConfig& config) {
  if (!absl::GetFlag(FLAGS_print_config)) return false;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Serializing a valid message cannot fail.
  CHECK(google::protobuf::util::MessageToJsonString(config, &json, options).ok());
  std::cout << json << std::endl;
  return true;
}

absl::Status AnnounceMetricsPort(const std::string& who, const std::string& host, int port) {
  std::cout << who << " metrics on http://" << HostPort(host, port) << "/metrics" << std::endl;
  const std::string path = absl::GetFlag(FLAGS_metrics_port_file);
  if (path.empty()) return absl::OkStatus();
  return WriteFileAtomically(path, absl::StrCat(port, "\n"));
}

sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

bool WaitForStopSignal(const sigset_t& signals, const std::atomic<bool>* woken_internally) {
  int sig = 0;
  sigwait(&signals, &sig);
  if (woken_internally != nullptr && woken_internally->load()) return false;
  LOG(INFO) << "signal " << sig << ": shutting down";
  return true;
}

StopSignalThread::StopSignalThread(const sigset_t& signals, std::function<void()> on_signal)
    : thread_([this, signals, on_signal = std::move(on_signal)] {
        if (WaitForStopSignal(signals, &stopping_)) on_signal();
      }) {}

StopSignalThread::~StopSignalThread() {
  stopping_ = true;
  // The signals are blocked everywhere, so this lands in the sigwait, which then sees
  // stopping_ and returns without calling on_signal. Harmless if the thread already returned.
  pthread_kill(thread_.native_handle(), SIGTERM);
  thread_.join();
}

int RunMain(int argc, char** argv, const char* program, const char* usage,
            absl::Status (*run)()) {
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (absl::Status s = KeepFreedMemoryForReuse(); !s.ok()) LOG(WARNING) << s;
  SkipMutexDeadlockChecks();
  const absl::Status status = run();
  if (status.ok()) return 0;
  std::cerr << program << ": " << status << std::endl;
  return 1;
}

std::string AdvertisedHost(const std::string& listen_host) {
  if (!listen_host.empty() && listen_host != "0.0.0.0" && listen_host != "::" &&
      listen_host != "[::]") {
    return listen_host;
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace ps::common
