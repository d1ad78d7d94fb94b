// ps_worker: trains a model, against parameter servers (distributed) or in this process
// (--centralized).
//
//   ps_worker --config=configs/fashion_mnist_2x2_async.textproto --worker_index=0
//             --servers=host0:7000,host1:7000
//   ps_worker --config=configs/fashion_mnist_centralized.textproto --centralized
//
// Flags -> TrainingJobOptions + a parameter store -> TrainingJob (worker/training_job.h).
// Prints live progress on stderr, one evaluation line per epoch, and at the end a line
// "final test accuracy <a>" (or "final test auc <a>") on stdout. Exit status 0 on success.
//
// Under Kubeflow (TF_CONFIG), SLURM (srun) or mpirun the index and the servers come from the
// environment instead (--cluster_from, see common/cluster/cluster_env.h).
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/startup/flag_check.h"
#include "common/startup/main_flags.h"
#include "common/startup/restart.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/blas_core.h"
#include "server/in_process_store.h"
#include "worker/rpc/grpc_store.h"
#include "worker/training_job.h"

ABSL_FLAG(int32_t, worker_index, -1,
          "This worker's index, 0..cluster.num_workers-1; unset = the environment's, else 0.");
ABSL_FLAG(bool, centralized, false,
          "Train in this process through the in-process store: no servers, no sockets.");
ABSL_FLAG(std::string, servers, "",
          "Comma-separated server addresses (host:port), index order; overrides "
          "cluster.servers.");
ABSL_FLAG(std::string, device, "", "cpu, cuda or auto; overrides training.device.");
ABSL_FLAG(std::string, log_path, "", "JSON-lines log; overrides training.log_path.");
ABSL_FLAG(std::string, eval, "auto",
          "Evaluate on the test set: always, never, or auto (worker 0 and centralized only).");
ABSL_FLAG(double, wait_for_servers_s, 120, "How long to wait for the servers at start.");
ABSL_FLAG(int32_t, threads, 1,
          "CPU BLAS threads per worker (0 = the library's default: all cores). Small batches run "
          "fastest on one.");

namespace ps::worker {
namespace {

// Set by the first SIGTERM or SIGINT (lock-free: a handler may only do this).
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void OnStopSignal(int sig) {
  if (!g_stop.exchange(true)) return;
  // The second: the default action (signal and raise are async-signal-safe).
  signal(sig, SIG_DFL);
  raise(sig);
}

// The store the job trains against: in-process (centralized), or the gRPC store of a
// distributed job once every server answers; `*grpc_store` then keeps it for the transfer
// summary. One incarnation per process, so the servers tell a restarted worker apart.
StoreFactory MakeStoreFactory(bool centralized, int32_t index, GrpcParameterStore** grpc_store) {
  const uint64_t incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  return [=](const JobConfig& config, common::metrics::Registry* metrics)
             -> absl::StatusOr<std::unique_ptr<common::ParameterStore>> {
    if (centralized) {
      server::InProcessStoreOptions in_process;
      in_process.worker_incarnation = incarnation;
      ASSIGN_OR_RETURN(auto store,
                       server::InProcessParameterStore::CreateCentralized(config, in_process));
      return std::unique_ptr<common::ParameterStore>(std::move(store));
    }
    GrpcStoreOptions store_options = JobStoreOptions(config, index, incarnation);
    // Once asked to stop, a call whose server is gone fails instead of being retried.
    store_options.give_up_retries = [] { return g_stop.load(); };
    ASSIGN_OR_RETURN(auto store, GrpcParameterStore::Create(config, store_options, metrics));
    RETURN_IF_ERROR(store->WaitForServers(absl::Seconds(absl::GetFlag(FLAGS_wait_for_servers_s))));
    *grpc_store = store.get();
    return std::unique_ptr<common::ParameterStore>(std::move(store));
  };
}

// Flag ranges, checked before anything starts (common/startup/flag_check.h). The flags
// shared with ps_server are checked in common/startup/main_flags.cc.
absl::Status ValidateFlags() {
  return common::AllFlagsInRange({
      common::CheckIntFlagRange("worker_index", absl::GetFlag(FLAGS_worker_index), -1,
                                INT32_MAX, "0..num_workers-1"),
      common::CheckIntFlagRange("threads", absl::GetFlag(FLAGS_threads), 0, 4096,
                                "0 (all cores) or 1..4096"),
      common::CheckDoubleFlagRange("wait_for_servers_s", absl::GetFlag(FLAGS_wait_for_servers_s),
                                   common::kAboveZero, common::kNoLimit, "seconds > 0"),
  });
}

absl::Status Run() {
  // SIGTERM and SIGINT set a flag that training reads after each step (a handler, not a
  // blocked mask and a sigwait thread as in ps_server: the BLAS library starts its threads
  // before main, and a signal for the process may land on any of them). A second one stops
  // the process at once.
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT}) {
    if (sigaction(sig, &action, nullptr) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("sigaction(", sig, ")"));
    }
  }
  RETURN_IF_ERROR(ValidateFlags());
  const bool centralized = absl::GetFlag(FLAGS_centralized);
  const std::vector<std::string> overrides =
      common::FlagOverrides({{"cluster.servers", absl::GetFlag(FLAGS_servers)},
                             {"training.device", absl::GetFlag(FLAGS_device)},
                             {"training.log_path", absl::GetFlag(FLAGS_log_path)}});
  common::ClusterOptions cluster_options;
  cluster_options.role = common::ClusterRole::kWorker;
  if (centralized) {
    const std::string from = absl::GetFlag(FLAGS_cluster_from);
    if (from != "auto" && from != "flags") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--centralized runs no cluster: drop --cluster_from=", from));
    }
    cluster_options.cluster_from = "flags";
  }
  if (absl::GetFlag(FLAGS_worker_index) != -1) {
    cluster_options.index = absl::GetFlag(FLAGS_worker_index);
  }
  cluster_options.servers_origin =
      absl::GetFlag(FLAGS_servers).empty() ? "the config's cluster.servers" : "--servers";
  cluster_options.rendezvous_timeout = absl::Seconds(absl::GetFlag(FLAGS_wait_for_servers_s));
  ASSIGN_OR_RETURN(common::StartupConfig startup,
                   common::LoadStartupConfig(cluster_options, overrides));
  if (common::PrintConfigIfAsked(startup.config)) return absl::OkStatus();
  RETURN_IF_ERROR_CTX(common::CheckTrainable(startup.config), startup.config_path);

  TrainingJobOptions options;
  options.worker_index = startup.cluster.index.value_or(0);
  options.centralized = centralized;
  options.eval = absl::GetFlag(FLAGS_eval);
  options.blas_threads = absl::GetFlag(FLAGS_threads);
  options.metrics_port = startup.metrics_port;
  options.stop = &g_stop;
  GrpcParameterStore* grpc_store = nullptr;
  StoreFactory make_store = MakeStoreFactory(centralized, options.worker_index, &grpc_store);
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingJob> job,
                   TrainingJob::Create(startup.config, options, make_store));
  if (job->metrics_port() >= 0) {
    RETURN_IF_ERROR(common::AnnounceMetricsPort(
        absl::StrCat("ps_worker ", options.worker_index),
        startup.config.metrics().has_host() ? startup.config.metrics().host() : "0.0.0.0",
        job->metrics_port()));
  }
  ASSIGN_OR_RETURN(TrainResult result, job->Run());
  if (grpc_store != nullptr) {
    LOG(INFO) << "worker " << options.worker_index << ": " << grpc_store->stats().Summary();
  }
  std::fputs(job->FinalReport(result).c_str(), stdout);
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps::worker

int main(int argc, char** argv) {
  // First, before flags and threads: OpenBLAS chose its kernels when it loaded, and a CPU it
  // does not know may have got a set without AVX (kernels/blas_core.h). A variable already set
  // is the user's choice, or this restart's.
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    if (const std::string core = ps::kernels::BlasCoreToForce(); !core.empty()) {
      const std::string chosen = ps::kernels::BlasCoreName();
      std::fprintf(stderr,
                   "ps_worker: OpenBLAS chose its %s kernels, which use no AVX, on a CPU that "
                   "has it; starting again with OPENBLAS_CORETYPE=%s\n",
                   chosen.c_str(), core.c_str());
      const absl::Status failed =
          ps::common::RestartWithEnvironment(argv, "OPENBLAS_CORETYPE", core);
      std::fprintf(stderr, "ps_worker: not started again (%s); going on with the %s kernels\n",
                   failed.ToString().c_str(), chosen.c_str());
    }
  }
  return ps::common::RunMain(argc, argv, "ps_worker",
                             "Trains a model. Distributed: ps_worker --config=job.textproto "
                             "--worker_index=0 --servers=h0:p0,h1:p1. Centralized: ps_worker "
                             "--config=job.textproto --centralized",
                             ps::worker::Run);
}
