// TrainingJob: one worker's training run, without flags: metrics endpoint, compute backend,
// data, model, the parameter store (handed in by the caller), local SGD, where the dense
// tables live (centralized on an accelerator: on the device), resuming where the store saw
// this worker last, the training loop and the store's Finish.
//
// ps_worker's main turns flags into TrainingJobOptions and a StoreFactory (the gRPC store for
// a distributed job; server/'s in-process store for --centralized: only a main links both
// sides) and calls
//
//   ASSIGN_OR_RETURN(auto job, TrainingJob::Create(config, options, factory));
//   ASSIGN_OR_RETURN(TrainResult result, job->Run());
//
// Thread-compatible: Create and Run are called once each, from one thread.
#ifndef PS_WORKER_TRAINING_JOB_H_
#define PS_WORKER_TRAINING_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "common/parameter_store.h"
#include "proto/config.pb.h"
#include "worker/trainer.h"

namespace ps::common::metrics {
class MetricsHttpServer;
}  // namespace ps::common::metrics
namespace ps::kernels {
class Backend;
}  // namespace ps::kernels

namespace ps::worker {

class LocalSgdStore;
class Model;
struct LoadedData;

struct TrainingJobOptions {
  // This worker's index, 0..num_workers-1 (num_workers = cluster.num_workers, 1 centralized).
  int32_t worker_index = 0;
  // Centralized mode (for the logs, the metrics' `mode` label and evaluation's "auto").
  bool centralized = false;
  // Evaluate on the test set: "always", "never" or "auto" (worker 0 and centralized).
  std::string eval = "auto";
  // CPU BLAS threads (0 = the library's default).
  int blas_threads = 1;
  // The Prometheus endpoint: -1 = off, 0 = a free port; served from Create to destruction.
  int32_t metrics_port = -1;
  std::string metrics_host = "0.0.0.0";
  // How often the worker tells the store where it is in its data.
  absl::Duration position_interval = absl::Seconds(1);
  // For tests: the backend to compute on instead of the one training.device names (not
  // owned; outlives the job).
  kernels::Backend* backend = nullptr;
  // Set (e.g. on SIGTERM) to stop after the steps begun: their pushes are applied, the data
  // position is reported and the store told this worker finished; no evaluation runs. Not
  // owned; outlives the job; may be null.
  const std::atomic<bool>* stop = nullptr;
};

// Makes the parameter store once the metrics endpoint serves (a gRPC store waits for its
// servers here). `metrics` outlives the store.
using StoreFactory = std::function<absl::StatusOr<std::unique_ptr<common::ParameterStore>>(
    const JobConfig& config, common::metrics::Registry* metrics)>;

class TrainingJob {
 public:
  // Validates the options against `config` (validated and trainable: common::CheckTrainable),
  // starts the metrics endpoint, creates the backend, loads the data, builds the model and
  // the store. Errors: INVALID_ARGUMENT (options), those of each step.
  static absl::StatusOr<std::unique_ptr<TrainingJob>> Create(const JobConfig& config,
                                                             const TrainingJobOptions& options,
                                                             const StoreFactory& make_store);
  ~TrainingJob();

  // Resumes where the store saw this worker last, trains, and finishes with the store (the
  // worker leaves the consistency bound). Logs the step breakdown. Errors: those of training.
  absl::StatusOr<TrainResult> Run();

  // What ps_worker prints at the end: "final test accuracy A" (or "final test auc A logloss
  // L [ground_truth_auc G]") when there was a final evaluation, then "samples/s S wall_s W",
  // each on its own line.
  std::string FinalReport(const TrainResult& result) const;

  int metrics_port() const;
  // The store the job trains against (the gRPC or in-process one; local SGD wraps it).
  common::ParameterStore* store() const { return store_.get(); }
  // A binary classifier (AUC is its metric), and the synthetic data's ground-truth AUC (0 =
  // none).
  bool binary() const { return config_.model().has_ctr(); }
  double ground_truth_auc() const;
  // The model's dense tables live on the compute device (training.dense_tables), not in the
  // store.
  bool tables_on_device() const { return tables_on_device_; }

 private:
  TrainingJob(const JobConfig& config, const TrainingJobOptions& options);
  absl::Status Build(const StoreFactory& make_store);
  absl::StatusOr<TrainerOptions> MakeTrainerOptions();
  // training.dense_tables: moves the model's dense tables to the device where the config and
  // the mode have them there.
  absl::Status PlaceDenseTables();

  const JobConfig config_;
  const TrainingJobOptions options_;
  // Declared first: outlives everything that registers metrics in it.
  common::metrics::Registry metrics_;
  common::metrics::CollectorHandle process_metrics_;
  std::unique_ptr<common::metrics::MetricsHttpServer> metrics_server_;
  std::unique_ptr<kernels::Backend> owned_backend_;  // unless TrainingJobOptions::backend
  kernels::Backend* backend_ = nullptr;
  std::unique_ptr<LoadedData> data_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<common::ParameterStore> store_;
  std::unique_ptr<LocalSgdStore> local_sgd_;  // wraps store_ when local SGD is on
  bool tables_on_device_ = false;
  absl::Time last_position_report_ = absl::InfinitePast();
  std::optional<std::pair<uint32_t, uint64_t>> last_position_;  // (epoch, offset) of the last step
  uint64_t merges_seen_ = 0;  // local SGD: the merges when the position was last reported
};

}  // namespace ps::worker

#endif  // PS_WORKER_TRAINING_JOB_H_
