// ps_worker: trains a model, against parameter servers (distributed) or in this process
// (--centralized).
//
//   ps_worker --config=configs/fashion_mnist_2x2_async.textproto --worker_index=0 \
//             --servers=host0:7000,host1:7000
//   ps_worker --config=configs/fashion_mnist_centralized.textproto --centralized
//
// Prints live progress on stderr, one evaluation line per epoch, and at the end a line
// "final test accuracy <a>" (or "final test auc <a>") on stdout. Exit status 0 on success.
#include <unistd.h>

#include <cstdio>
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
#include "common/config.h"
#include "common/overrides.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/backend.h"
#include "server/in_process_store.h"
#include "server/shard.h"
#include "worker/data/load.h"
#include "worker/models/model_factory.h"
#include "worker/rpc/grpc_store.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, config, "", "Path of the job's JobConfig textproto (required).");
ABSL_FLAG(std::string, set, "",
          "Config overrides, comma-separated path=value (e.g. "
          "training.epochs=3,model.mlp.hidden=256,128); see README.");
ABSL_FLAG(int32_t, worker_index, 0, "This worker's index, 0..cluster.num_workers-1.");
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
  ASSIGN_OR_RETURN(JobConfig config,
                   common::LoadAndPrepareJobConfig(absl::GetFlag(FLAGS_config), overrides));
  RETURN_IF_ERROR_CTX(common::CheckTrainable(config), absl::GetFlag(FLAGS_config));
  // Fields of the schema whose features are not built yet: refuse rather than ignore them.
  if (config.training().prefetch()) {
    return absl::UnimplementedError("training.prefetch is not implemented yet; remove it");
  }
  if (config.training().local_sgd().steps() > 0) {
    return absl::UnimplementedError("training.local_sgd is not implemented yet; remove it");
  }
  if (config.metrics().port() >= 0) {
    return absl::UnimplementedError("metrics.port: the /metrics endpoint is not implemented yet");
  }
  const bool centralized = absl::GetFlag(FLAGS_centralized);
  const int32_t index = absl::GetFlag(FLAGS_worker_index);
  const int32_t num_workers = centralized ? 1 : static_cast<int32_t>(config.cluster().num_workers());
  if (index < 0 || index >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("--worker_index=", index,
                                                   " is out of range: the job has ",
                                                   num_workers, " workers"));
  }
  const uint64_t incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));

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
    ASSIGN_OR_RETURN(auto s, GrpcParameterStore::Create(config, options));
    RETURN_IF_ERROR(s->WaitForServers(absl::Seconds(absl::GetFlag(FLAGS_wait_for_servers_s))));
    grpc_store = s.get();
    store = std::move(s);
  }

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
  Trainer trainer(model.get(), store.get(), data.train.get(), data.test.get(), options);
  ASSIGN_OR_RETURN(TrainResult result, trainer.Run());
  RETURN_IF_ERROR(store->Finish());
  LOG(INFO) << "worker " << index << ": " << result.steps << " steps, " << result.samples
            << " samples in " << result.wall << " (" << static_cast<int64_t>(result.samples_per_s)
            << " samples/s; pull " << result.breakdown.pull << ", compute "
            << result.breakdown.compute << ", push " << result.breakdown.push << ")";
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
  absl::Status status = ps::worker::Run();
  if (!status.ok()) {
    std::cerr << "ps_worker: " << status << std::endl;
    return 1;
  }
  return 0;
}
