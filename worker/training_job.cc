#include "worker/training_job.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/metrics/http_server.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/backend.h"
#include "kernels/optimizer_config.h"
#include "worker/data/load.h"
#include "worker/local_sgd_store.h"
#include "worker/models/model.h"
#include "worker/models/model_factory.h"

namespace ps::worker {
namespace {

// An MLP's data against its output layer, before any step: a label beyond it would fail only
// when its example is drawn, possibly hours into the run and after many pushes.
absl::Status CheckLabelsFitTheModel(const JobConfig& config, const LoadedData& data) {
  if (!config.model().has_mlp()) return absl::OkStatus();
  const int64_t classes = config.model().mlp().num_classes();
  for (const auto& [name, set] :
       {std::pair<const char*, const Dataset*>{"training", data.train.get()},
        {"test", data.test.get()}}) {
    if (set != nullptr && set->num_classes() > classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", name, " data's labels go up to ", set->num_classes() - 1,
                       ", beyond the model's classes (model.mlp.num_classes ", classes, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingJob>> TrainingJob::Create(
    const JobConfig& config, const TrainingJobOptions& options, const StoreFactory& make_store) {
  const int32_t num_workers =
      options.centralized ? 1 : static_cast<int32_t>(config.cluster().num_workers());
  if (options.worker_index < 0 || options.worker_index >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("--worker_index=", options.worker_index,
                                                   " is out of range: the job has ", num_workers,
                                                   " workers"));
  }
  if (options.eval != "auto" && options.eval != "always" && options.eval != "never") {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval=", options.eval, ": expected auto, always or never"));
  }
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics port ", options.metrics_port, ": expected -1 (off), 0 or a port"));
  }
  std::unique_ptr<TrainingJob> job(new TrainingJob(config, options));
  RETURN_IF_ERROR(job->Build(make_store));
  return job;
}

TrainingJob::TrainingJob(const JobConfig& config, const TrainingJobOptions& options)
    : config_(config), options_(options) {}

TrainingJob::~TrainingJob() = default;

absl::Status TrainingJob::Build(const StoreFactory& make_store) {
  const int32_t index = options_.worker_index;
  // Metrics: served from here on, while the data loads and the servers are awaited.
  metrics_
      .AddGaugeFamily("ps_worker_info", "Constant 1, labelled with the worker's index and mode.",
                      {"worker_index", "mode"})
      ->WithLabels({absl::StrCat(index), options_.centralized ? "centralized" : "distributed"})
      ->Set(1);
  process_metrics_ = common::metrics::RegisterProcessMetrics(&metrics_);
  if (options_.metrics_port >= 0) {
    common::metrics::HttpServerOptions http;
    http.host = config_.metrics().has_host() ? config_.metrics().host() : options_.metrics_host;
    http.port = options_.metrics_port;
    ASSIGN_OR_RETURN(metrics_server_, common::metrics::MetricsHttpServer::Start(http, &metrics_));
  }

  backend_ = options_.backend;
  if (backend_ == nullptr) {
    kernels::BackendOptions backend_options;
    backend_options.num_threads = options_.blas_threads;
    ASSIGN_OR_RETURN(owned_backend_,
                     kernels::CreateBackend(config_.training().device(), backend_options));
    backend_ = owned_backend_.get();
  }
  LOG(INFO) << "worker " << index << ": device " << backend_->Description();
  ASSIGN_OR_RETURN(LoadedData data, LoadData(config_.data(), config_.training()));
  data_ = std::make_unique<LoadedData>(std::move(data));
  LOG(INFO) << "data: " << data_->train->size() << " training examples, "
            << (data_->test ? data_->test->size() : 0) << " test examples";
  RETURN_IF_ERROR(CheckLabelsFitTheModel(config_, *data_));
  ASSIGN_OR_RETURN(model_, CreateModel(config_, backend_, config_.training().batch_size()));
  ASSIGN_OR_RETURN(store_, make_store(config_, &metrics_));

  // Local SGD: the trainer works on a local copy; every k steps its change goes to the store.
  if (config_.training().local_sgd().steps() > 0) {
    const std::vector<TableConfig> tables(config_.tables().begin(), config_.tables().end());
    ASSIGN_OR_RETURN(local_sgd_, LocalSgdStore::Create(store_.get(), tables,
                                                       config_.training().local_sgd().steps()));
    LOG(INFO) << "worker " << index << ": local SGD, merging every "
              << config_.training().local_sgd().steps() << " steps ("
              << LocalSgdConfig::Merge_Name(config_.training().local_sgd().merge()) << ")";
  }
  return PlaceDenseTables();
}

absl::Status TrainingJob::PlaceDenseTables() {
  const TrainingConfig::DenseTables place = config_.training().dense_tables();
  if (place == TrainingConfig::DENSE_TABLES_STORE) return absl::OkStatus();
  const bool forced = place == TrainingConfig::DENSE_TABLES_DEVICE;
  if (!options_.centralized || local_sgd_ != nullptr) {
    if (!forced) return absl::OkStatus();
    return absl::InvalidArgumentError(
        options_.centralized
            ? "training.dense_tables: DENSE_TABLES_DEVICE does not go with local_sgd (its "
              "copy of the tables is the worker's own)"
            : "training.dense_tables: DENSE_TABLES_DEVICE is for centralized mode; a "
              "distributed job's tables live on its servers");
  }
  if (!forced && backend_->kind() == kernels::DeviceKind::kCpu) return absl::OkStatus();
  DeviceTableOptions device;
  for (const TableConfig& table : config_.tables()) {
    if (table.kind() != TABLE_KIND_DENSE) continue;
    device.optimizers[table.name()] = kernels::ToOptimizerParams(table.optimizer());
  }
  device.block_floats = static_cast<int64_t>(config_.cluster().dense_block_floats());
  device.reject_nonfinite = config_.server().reject_nonfinite();
  ASSIGN_OR_RETURN(const bool kept, model_->KeepTablesOnDevice(device, store_.get()),
                   "training.dense_tables");
  if (!kept) {
    if (forced) {
      return absl::FailedPreconditionError(
          "training.dense_tables: DENSE_TABLES_DEVICE, but this model keeps its tables in the "
          "store (the MLP can keep them on the device)");
    }
    LOG(INFO) << "the model's tables stay in the store: it cannot keep them on the device";
    return absl::OkStatus();
  }
  tables_on_device_ = true;
  LOG(INFO) << "dense tables and their optimizer state on the device (" << backend_->Description()
            << "): a step copies no parameters or gradients"
            << (config_.training().prefetch()
                    ? "; training.prefetch is off (the store calls carry nothing to overlap)"
                    : "");
  return absl::OkStatus();
}

int TrainingJob::metrics_port() const {
  return metrics_server_ ? metrics_server_->port() : -1;
}

double TrainingJob::ground_truth_auc() const { return data_->ground_truth_auc; }

std::string TrainingJob::FinalReport(const TrainResult& result) const {
  std::string out;
  if (result.final_eval.has_value()) {
    if (binary()) {
      absl::StrAppendFormat(&out, "final test auc %.4f logloss %.4f", result.final_eval->auc,
                            result.final_eval->loss);
      if (ground_truth_auc() > 0) absl::StrAppendFormat(&out, " ground_truth_auc %.4f", ground_truth_auc());
      out += "\n";
    } else {
      absl::StrAppendFormat(&out, "final test accuracy %.4f\n", result.final_eval->accuracy);
    }
  }
  absl::StrAppendFormat(&out, "samples/s %.0f wall_s %.1f\n", result.samples_per_s,
                        absl::ToDoubleSeconds(result.wall));
  return out;
}

absl::StatusOr<TrainerOptions> TrainingJob::MakeTrainerOptions() {
  const int32_t index = options_.worker_index;
  TrainerOptions options;
  options.worker_index = index;
  options.num_workers =
      options_.centralized ? 1 : static_cast<int32_t>(config_.cluster().num_workers());
  options.batch_size = config_.training().batch_size();
  options.epochs = config_.training().epochs();
  options.max_steps = config_.training().max_steps();
  options.shuffle = config_.data().shuffle();
  options.seed = config_.training().seed();
  options.eval_every_epochs = config_.training().eval_every_epochs();
  options.evaluate = options_.eval == "always" ||
                     (options_.eval == "auto" && (options_.centralized || index == 0));
  options.target_metric = config_.training().target_metric();
  options.binary = binary();
  options.log_path = config_.training().log_path();
  options.progress = stderr;
  options.progress_tty = isatty(fileno(stderr));
  options.progress_interval = absl::Seconds(config_.training().progress_interval_s());
  options.prefetch = config_.training().prefetch() && !tables_on_device_;
  options.log_tag = absl::StrFormat("\"job\":\"%s\",\"mode\":\"%s\"", config_.name(),
                                    options_.centralized ? "centralized" : "distributed");
  // A restarted worker resumes where the store saw it last (its data position and clock); a
  // new one gets zeros.
  ASSIGN_OR_RETURN(common::WorkerPosition saved, store_->ReportPosition(0, 0));
  if (saved.epoch > 0 || saved.offset > 0 || saved.clock > 0) {
    LOG(INFO) << "worker " << index << ": resuming at epoch " << saved.epoch + 1 << ", example "
              << saved.offset << " of its shard, clock " << saved.clock
              << " (as the store remembers it)";
    options.start_epoch = saved.epoch;
    options.start_offset = saved.offset;
    options.start_clock = saved.clock;
  }
  // Report the position now and then (and once more at the end: Run).
  options.on_step = [this](uint32_t epoch, uint64_t offset) {
    // With local SGD a step's update reaches the servers only at its period's merge: the
    // position moves only then (a restart would skip the steps not merged), at every merge.
    if (local_sgd_ != nullptr) {
      last_position_ = {epoch, offset};  // reported at the end, once its period is merged
      const uint64_t merges = local_sgd_->stats().merges;
      if (merges == merges_seen_) return;
      merges_seen_ = merges;
    } else if (absl::Now() - last_position_report_ < options_.position_interval) {
      last_position_ = {epoch, offset};
      return;
    }
    last_position_ = {epoch, offset};
    last_position_report_ = absl::Now();
    absl::StatusOr<common::WorkerPosition> r = store_->ReportPosition(epoch, offset);
    if (!r.ok()) LOG(WARNING) << "reporting the data position: " << r.status();
  };
  if (options_.stop != nullptr) {
    options.stop_requested = [stop = options_.stop] { return stop->load(); };
  }
  return options;
}

absl::StatusOr<TrainResult> TrainingJob::Run() {
  ASSIGN_OR_RETURN(TrainerOptions options, MakeTrainerOptions());
  last_position_report_ = absl::Now();
  common::ParameterStore* const train_store =
      local_sgd_ ? static_cast<common::ParameterStore*>(local_sgd_.get()) : store_.get();
  Trainer trainer(model_.get(), train_store, data_->train.get(), data_->test.get(), options,
                  &metrics_);
  ASSIGN_OR_RETURN(TrainResult result, trainer.Run());
  // With local SGD the unfinished period is merged first: its steps are then applied, and
  // the position reported below is the last step's (before 2026-12-06, found in review, the
  // last merge's was reported and the period merged after, so a restart trained its steps
  // again).
  if (local_sgd_ != nullptr) RETURN_IF_ERROR(local_sgd_->Flush());
  // Every push of the run is applied now: where the data stands, for a restart, before the
  // finish (the last report was up to position_interval old).
  if (last_position_.has_value()) {
    if (absl::StatusOr<common::WorkerPosition> r =
            store_->ReportPosition(last_position_->first, last_position_->second);
        !r.ok()) {
      LOG(WARNING) << "reporting the final data position: " << r.status();
    }
  }
  RETURN_IF_ERROR(train_store->Finish());
  if (result.stopped) {
    LOG(INFO) << "worker " << options_.worker_index << ": stopped as asked after step "
              << result.steps << " of this process; its pushes are applied and its data "
              << "position reported";
  }
  LOG(INFO) << "worker " << options_.worker_index << ": " << result.steps << " steps, "
            << result.samples << " samples in " << result.wall << " ("
            << static_cast<int64_t>(result.samples_per_s) << " samples/s; data "
            << result.breakdown.data << ", pull " << result.breakdown.pull << ", compute "
            << result.breakdown.compute << ", push " << result.breakdown.push << ", wait "
            << result.breakdown.wait << (options.prefetch ? ", prefetch on" : "")
            << "; communication: store calls " << result.breakdown.calls << ", exposed "
            << result.breakdown.exposed() << " (pull + push + wait: what the steps waited for)"
            << ")";
  return result;
}

}  // namespace ps::worker
