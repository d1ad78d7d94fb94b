// Trainer: the worker's loop. Each step pulls what the batch needs, runs forward and
// backward, and pushes the gradients, all through a ParameterStore (gRPC in a distributed
// job, in-process in centralized mode: the same code either way). After each epoch (or as
// configured) the trainer evaluates on the test set: accuracy for classification, AUC and
// log-loss for CTR. It shows live progress and writes a JSON-lines log.
#ifndef PS_WORKER_TRAINER_H_
#define PS_WORKER_TRAINER_H_

#include <array>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "common/parameter_store.h"
#include "worker/data/dataset.h"
#include "worker/models/model.h"

namespace ps::worker {

struct TrainerOptions {
  int32_t worker_index = 0;
  int32_t num_workers = 1;
  uint32_t batch_size = 64;
  uint32_t epochs = 1;
  // Stop after this many steps of this worker (0 = no limit).
  uint64_t max_steps = 0;
  bool shuffle = true;
  uint64_t seed = 1;
  // Evaluate every this many epochs (0 = only at the end); only when evaluate is set.
  uint32_t eval_every_epochs = 1;
  bool evaluate = true;
  // Stop once the test metric (accuracy, or AUC for binary models) reaches this; 0 = off.
  double target_metric = 0;
  // Binary (CTR) model: report AUC and log-loss instead of accuracy.
  bool binary = false;
  // JSON-lines log ("" = none).
  std::string log_path;
  // Progress: a live one-line display when `progress_tty`, else a line every interval.
  FILE* progress = stderr;
  bool progress_tty = false;
  absl::Duration progress_interval = absl::Seconds(10);
  // Resume position (a restarted worker): epoch and examples consumed in it, and the clock.
  uint32_t start_epoch = 0;
  uint64_t start_offset = 0;
  int64_t start_clock = 0;
  // Called after every step with (epoch, offset in epoch); e.g. to report the position.
  std::function<void(uint32_t, uint64_t)> on_step;
  // Extra fields for every JSON log line (e.g. "\"mode\":\"centralized\"").
  std::string log_tag;
};

struct EvalMetrics {
  int64_t examples = 0;
  double loss = 0;      // mean
  double accuracy = 0;  // classification
  double auc = 0;       // binary
};

// Time spent per phase over a run, summed.
struct StepBreakdown {
  absl::Duration pull, compute, push, data;
};

struct TrainResult {
  uint64_t steps = 0;
  uint64_t samples = 0;
  absl::Duration wall;
  absl::Duration eval_time;  // part of wall spent evaluating
  // Training samples per second, evaluation excluded.
  double samples_per_s = 0;
  std::optional<EvalMetrics> final_eval;
  StepBreakdown breakdown;
};

// Thread-compatible. Borrows everything it is given (Not owned).
//
// Metrics (ps_worker_, registered in the registry given to the constructor, updated once per
// step with atomic adds): steps, samples and samples/s, epoch, clock, last and smoothed loss,
// the time of each step's phases (data, pull, compute, push) as histograms, and the last
// evaluation.
class Trainer {
 public:
  // `metrics` (may be null: a registry of its own) must outlive the trainer.
  Trainer(Model* model, common::ParameterStore* store, const Dataset* train,
          const Dataset* test /* may be null */, const TrainerOptions& options,
          common::metrics::Registry* metrics = nullptr);
  ~Trainer();

  absl::StatusOr<TrainResult> Run();
  // Evaluates the current parameters on the whole test set.
  absl::StatusOr<EvalMetrics> Evaluate(int64_t clock);

 private:
  struct Metrics;
  // Updates the metrics after a step: `t` are the times the step's phases began, and its end.
  void RecordStep(uint32_t epoch, int64_t clock, uint64_t batch_size, double loss,
                  const std::array<absl::Time, 5>& t, absl::Duration eval_time);
  void Progress(bool force, uint32_t epoch, uint64_t step, double loss);
  void Log(const std::string& json);

  Model* const model_;
  common::ParameterStore* const store_;
  const Dataset* const train_;
  const Dataset* const test_;
  const TrainerOptions options_;
  std::unique_ptr<common::metrics::Registry> own_registry_;  // when none was given
  std::unique_ptr<Metrics> metrics_;
  FILE* log_ = nullptr;
  absl::Time start_;
  absl::Time last_progress_;
  uint64_t samples_ = 0;
  uint64_t total_steps_estimate_ = 0;
  double loss_ema_ = 0;
};

}  // namespace ps::worker

#endif  // PS_WORKER_TRAINER_H_
