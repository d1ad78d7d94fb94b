// ps_worker: trains a model, against parameter servers (distributed) or in this process
// (--centralized).
//
//   ps_worker --config=configs/fashion_mnist_2x2_async.textproto --worker_index=0
//             --servers=host0:7000,host1:7000
//   ps_worker --config=configs/fashion_mnist_centralized.textproto --centralized
//
// Prints live progress on stderr, one evaluation line per epoch, and at the end a line
// "final test accuracy <a>" (or "final test auc <a>") on stdout. Exit status 0 on success.
//
// Under Kubeflow (TF_CONFIG), SLURM (srun) or mpirun the index and the servers come from the
// environment instead (--cluster_from, see common/cluster_env.h).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/process_memory.h"
#include "common/cluster_env.h"
#include "common/config.h"
#include "common/metrics/http_server.h"
#include "common/metrics/metrics.h"
#include "common/overrides.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/backend.h"
#include "server/in_process_store.h"
#include "server/shard.h"
#include "worker/data/load.h"
#include "worker/models/model_factory.h"
#include "worker/local_sgd_store.h"
#include "worker/rpc/grpc_store.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, config, "", "Path of the job's JobConfig textproto (required).");
ABSL_FLAG(std::string, set, "",
          "Config overrides, comma-separated path=value (e.g. "
          "training.epochs=3,model.mlp.hidden=256,128); see README.");
ABSL_FLAG(int32_t, worker_index, -1,
          "This worker's index, 0..cluster.num_workers-1; unset = the environment's, else 0.");
ABSL_FLAG(std::string, cluster_from, "auto",
          "Where the index and cluster come from: flags, tf_config (Kubeflow TF_CONFIG), slurm "
          "(srun), mpi (mpirun, with --rendezvous_dir), or auto (TF_CONFIG if set, else SLURM "
          "if SLURM_PROCID is set, else flags).");
ABSL_FLAG(int32_t, base_port, 0,
          "SLURM: the servers' base port (they listen on it + their local rank on the node); "
          "0 = derived from SLURM_JOB_ID.");
ABSL_FLAG(std::string, rendezvous_dir, "",
          "MPI: a directory every rank shares, where the servers leave their host:port.");
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
ABSL_FLAG(int32_t, metrics_port, -2,
          "Port of the Prometheus /metrics endpoint; overrides metrics.port (-1 = off, 0 = a "
          "free port, printed). The default, -2, keeps metrics.port.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "If set, the metrics endpoint's port is written to this file once it serves.");

namespace ps::worker {
namespace {

absl::Status Run() {
  if (absl::GetFlag(FLAGS_config).empty()) {
    return absl::InvalidArgumentError("--config is required");
  }
  std::vector<std::string> overrides = common::SplitOverrides(absl::GetFlag(FLAGS_set));
  if (!absl::GetFlag(FLAGS_servers).empty()) {
    overrides.push_back(absl::StrCat("cluster.servers=", absl::GetFlag(FLAGS_servers)));
  }
  if (!absl::GetFlag(FLAGS_device).empty()) {
    overrides.push_back(absl::StrCat("training.device=", absl::GetFlag(FLAGS_device)));
  }
  if (!absl::GetFlag(FLAGS_log_path).empty()) {
    overrides.push_back(absl::StrCat("training.log_path=", absl::GetFlag(FLAGS_log_path)));
  }
  const std::string config_path = absl::GetFlag(FLAGS_config);
  const bool centralized = absl::GetFlag(FLAGS_centralized);
  ASSIGN_OR_RETURN(JobConfig config, common::LoadJobConfig(config_path, overrides));
  // The cluster identity: from the flags, or from the environment (checked against them).
  common::ClusterOptions cluster_options;
  cluster_options.cluster_from = absl::GetFlag(FLAGS_cluster_from);
  if (centralized) {
    if (cluster_options.cluster_from != "auto" && cluster_options.cluster_from != "flags") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--centralized runs no cluster: drop --cluster_from=", cluster_options.cluster_from));
    }
    cluster_options.cluster_from = "flags";
  }
  cluster_options.role = common::ClusterRole::kWorker;
  if (absl::GetFlag(FLAGS_worker_index) != -1) {
    cluster_options.index = absl::GetFlag(FLAGS_worker_index);
  }
  cluster_options.index_flag = "--worker_index";
  cluster_options.servers_origin =
      absl::GetFlag(FLAGS_servers).empty() ? "the config's cluster.servers" : "--servers";
  cluster_options.base_port = absl::GetFlag(FLAGS_base_port);
  cluster_options.rendezvous_dir = absl::GetFlag(FLAGS_rendezvous_dir);
  cluster_options.rendezvous_timeout = absl::Seconds(absl::GetFlag(FLAGS_wait_for_servers_s));
  ASSIGN_OR_RETURN(
      common::ClusterIdentity cluster,
      common::ResolveCluster(cluster_options, common::EnvMapFromEnviron(environ), &config));
  RETURN_IF_ERROR_CTX(common::ExpandModelTables(&config), config_path);
  RETURN_IF_ERROR_CTX(common::ValidateJobConfig(config), config_path);
  RETURN_IF_ERROR_CTX(common::CheckTrainable(config), config_path);
  if (!cluster.description.empty()) LOG(INFO) << cluster.description;
  const int32_t metrics_port = absl::GetFlag(FLAGS_metrics_port) == -2
                                   ? config.metrics().port()
                                   : absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port < -1 || metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port=", metrics_port, ": expected -1 (off), 0 or a port"));
  }
  const int32_t index = cluster.index.value_or(0);
  const int32_t num_workers = centralized ? 1 : static_cast<int32_t>(config.cluster().num_workers());
  if (index < 0 || index >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("--worker_index=", index,
                                                   " is out of range: the job has ",
                                                   num_workers, " workers"));
  }
  const uint64_t incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));

  // Metrics: served from here on, while the data loads and the servers are awaited. The
  // registry outlives everything that registers in it (the store, the trainer).
  common::metrics::Registry metrics;
  metrics
      .AddGaugeFamily("ps_worker_info", "Constant 1, labelled with the worker's index and mode.",
                      {"worker_index", "mode"})
      ->WithLabels({absl::StrCat(index), centralized ? "centralized" : "distributed"})
      ->Set(1);
  common::metrics::CollectorHandle process_metrics =
      common::metrics::RegisterProcessMetrics(&metrics);
  std::unique_ptr<common::metrics::MetricsHttpServer> metrics_server;
  if (metrics_port >= 0) {
    common::metrics::HttpServerOptions http;
    http.host = config.metrics().has_host() ? config.metrics().host() : "0.0.0.0";
    http.port = metrics_port;
    ASSIGN_OR_RETURN(metrics_server, common::metrics::MetricsHttpServer::Start(http, &metrics));
    std::cout << "ps_worker " << index << " metrics on http://" << http.host << ":"
              << metrics_server->port() << "/metrics" << std::endl;
    if (!absl::GetFlag(FLAGS_metrics_port_file).empty()) {
      const std::string tmp = absl::GetFlag(FLAGS_metrics_port_file) + ".tmp";
      std::ofstream(tmp) << metrics_server->port() << "\n";
      std::rename(tmp.c_str(), absl::GetFlag(FLAGS_metrics_port_file).c_str());
    }
  }

  kernels::BackendOptions backend_options;
  backend_options.num_threads = absl::GetFlag(FLAGS_threads);
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                   kernels::CreateBackend(config.training().device(), backend_options));
  LOG(INFO) << "worker " << index << ": device " << backend->Description();

  ASSIGN_OR_RETURN(LoadedData data, LoadData(config.data(), config.training()));
  LOG(INFO) << "data: " << data.train->size() << " training examples, "
            << (data.test ? data.test->size() : 0) << " test examples";
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   CreateModel(config, backend.get(), config.training().batch_size()));

  // The parameter store: in-process shards (centralized) or the servers.
  std::vector<std::unique_ptr<server::Shard>> shards;
  std::unique_ptr<common::ParameterStore> store;
  worker::GrpcParameterStore* grpc_store = nullptr;
  if (centralized) {
    config.mutable_cluster()->set_num_workers(1);
    ASSIGN_OR_RETURN(uint32_t num_servers, common::NumServers(config.cluster()));
    std::vector<server::Shard*> raw;
    for (uint32_t s = 0; s < num_servers; ++s) {
      server::ShardOptions options;
      options.server_index = s;
      options.reject_nonfinite = config.server().reject_nonfinite();
      ASSIGN_OR_RETURN(auto shard, server::Shard::Create(config, options));
      raw.push_back(shard.get());
      shards.push_back(std::move(shard));
    }
    server::InProcessStoreOptions options;
    options.worker_id = 0;
    options.worker_incarnation = incarnation;
    ASSIGN_OR_RETURN(store, server::InProcessParameterStore::Create(raw, options));
  } else {
    GrpcStoreOptions options;
    options.worker_id = index;
    options.worker_incarnation = incarnation;
    options.deadline = absl::Seconds(config.rpc().deadline_s());
    options.max_retries = config.rpc().max_retries();
    options.initial_backoff = absl::Seconds(config.rpc().initial_backoff_s());
    options.max_backoff = absl::Seconds(config.rpc().max_backoff_s());
    options.on_retry = [](uint32_t server, uint32_t attempt, const absl::Status& status) {
      LOG(WARNING) << "server " << server << " retry " << attempt << ": " << status;
    };
    options.on_recovered = [](uint32_t server, uint32_t retries, absl::Duration down) {
      LOG(WARNING) << "server " << server << " answers again after " << retries
                   << " retries, " << absl::ToDoubleSeconds(down) << " s after the first failure";
    };
    ASSIGN_OR_RETURN(auto s, GrpcParameterStore::Create(config, options, &metrics));
    RETURN_IF_ERROR(s->WaitForServers(absl::Seconds(absl::GetFlag(FLAGS_wait_for_servers_s))));
    grpc_store = s.get();
    store = std::move(s);
  }

  // Local SGD: the trainer works on a local copy; every k steps its change goes to the servers.
  std::unique_ptr<LocalSgdStore> local_sgd;
  if (config.training().local_sgd().steps() > 0) {
    const std::vector<TableConfig> tables(config.tables().begin(), config.tables().end());
    ASSIGN_OR_RETURN(local_sgd, LocalSgdStore::Create(store.get(), tables,
                                                      config.training().local_sgd().steps()));
    LOG(INFO) << "worker " << index << ": local SGD, merging every "
              << config.training().local_sgd().steps() << " steps ("
              << LocalSgdConfig::Merge_Name(config.training().local_sgd().merge()) << ")";
  }
  common::ParameterStore* const train_store = local_sgd ? local_sgd.get() : store.get();

  TrainerOptions options;
  options.worker_index = index;
  options.num_workers = num_workers;
  options.batch_size = config.training().batch_size();
  options.epochs = config.training().epochs();
  options.max_steps = config.training().max_steps();
  options.shuffle = config.data().shuffle();
  options.seed = config.training().seed();
  options.eval_every_epochs = config.training().eval_every_epochs();
  const std::string eval = absl::GetFlag(FLAGS_eval);
  if (eval != "auto" && eval != "always" && eval != "never") {
    return absl::InvalidArgumentError(absl::StrCat("--eval=", eval, ": expected auto, always or never"));
  }
  options.evaluate = eval == "always" || (eval == "auto" && (centralized || index == 0));
  options.target_metric = config.training().target_metric();
  options.binary = config.model().has_ctr();
  options.log_path = config.training().log_path();
  options.progress = stderr;
  options.progress_tty = isatty(fileno(stderr));
  options.progress_interval = absl::Seconds(config.training().progress_interval_s());
  options.prefetch = config.training().prefetch();
  options.log_tag = absl::StrFormat("\"job\":\"%s\",\"mode\":\"%s\"", config.name(),
                                    centralized ? "centralized" : "distributed");
  absl::Time last_heartbeat = absl::Now();
  if (grpc_store != nullptr) {
    // A restarted worker resumes where the servers saw it last (its data position and
    // clock); a new one gets zeros.
    ASSIGN_OR_RETURN(GrpcParameterStore::Position saved, grpc_store->Heartbeat(0, 0, false));
    if (saved.epoch > 0 || saved.offset > 0 || saved.clock > 0) {
      LOG(INFO) << "worker " << index << ": resuming at epoch " << saved.epoch + 1 << ", example "
                << saved.offset << " of its shard, clock " << saved.clock
                << " (as the servers remember it)";
      options.start_epoch = saved.epoch;
      options.start_offset = saved.offset;
      options.start_clock = saved.clock;
    }
    // Report the position about once a second.
    options.on_step = [&](uint32_t epoch, uint64_t offset) {
      if (absl::Now() - last_heartbeat < absl::Seconds(1)) return;
      last_heartbeat = absl::Now();
      absl::StatusOr<GrpcParameterStore::Position> r = grpc_store->Heartbeat(epoch, offset, false);
      if (!r.ok()) LOG(WARNING) << "heartbeat: " << r.status();
    };
  }
  Trainer trainer(model.get(), train_store, data.train.get(), data.test.get(), options,
                  &metrics);
  ASSIGN_OR_RETURN(TrainResult result, trainer.Run());
  RETURN_IF_ERROR(train_store->Finish());
  LOG(INFO) << "worker " << index << ": " << result.steps << " steps, " << result.samples
            << " samples in " << result.wall << " (" << static_cast<int64_t>(result.samples_per_s)
            << " samples/s; data " << result.breakdown.data << ", pull "
            << result.breakdown.pull << ", compute " << result.breakdown.compute << ", push "
            << result.breakdown.push << ", wait " << result.breakdown.wait
            << (options.prefetch ? ", prefetch on" : "") << ")";
  if (grpc_store != nullptr) {
    const GrpcStoreStats s = grpc_store->stats();
    LOG(INFO) << "worker " << index << ": sent " << s.bytes_sent << " bytes, received "
              << s.bytes_received << " bytes, " << s.retries << " retries";
  }
  if (result.final_eval.has_value()) {
    if (options.binary) {
      std::printf("final test auc %.4f logloss %.4f", result.final_eval->auc,
                  result.final_eval->loss);
      if (data.ground_truth_auc > 0) std::printf(" ground_truth_auc %.4f", data.ground_truth_auc);
      std::printf("\n");
    } else {
      std::printf("final test accuracy %.4f\n", result.final_eval->accuracy);
    }
  }
  std::printf("samples/s %.0f wall_s %.1f\n", result.samples_per_s,
              absl::ToDoubleSeconds(result.wall));
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps::worker

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains a model. Distributed: ps_worker --config=job.textproto --worker_index=0 "
      "--servers=h0:p0,h1:p1. Centralized: ps_worker --config=job.textproto --centralized");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // Before any thread starts: freed payload memory stays mapped for the next call.
  if (absl::Status s = ps::common::KeepFreedMemoryForReuse(); !s.ok()) LOG(WARNING) << s;
  absl::Status status = ps::worker::Run();
  if (!status.ok()) {
    std::cerr << "ps_worker: " << status << std::endl;
    return 1;
  }
  return 0;
}
