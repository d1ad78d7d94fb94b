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

class ShardIterator;
namespace internal {
struct Staged;
class Pipeline;
}  // namespace internal

struct TrainerOptions {
  int32_t worker_index = 0;
  int32_t num_workers = 1;
  uint32_t batch_size = 64;
  uint32_t epochs = 1;
  // Stop once this worker's clock reaches this many steps (0 = no limit): a restarted worker
  // counts the steps before its restart (start_clock) too.
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
  // Asked after every step (may be empty): true stops the run there, gracefully: the steps
  // begun finish (their pushes included), no new one starts, and no evaluation runs.
  std::function<bool()> stop_requested;
  // Extra fields for every JSON log line (e.g. "\"mode\":\"centralized\"").
  std::string log_tag;
  // Overlapped steps (training.prefetch): while step t computes, one store call (a fused
  // PushPull) pushes step t-1's gradients and pulls the parameters of step t+1 (see Trainer).
  // The parameters of step t+1 then lack this worker's own step-t gradient: one step more
  // staleness than without prefetch, never more. REQUIRES: a store whose consistency bound is
  // not BSP (a pull of clock t issued with the push of clock t-1 would wait for itself).
  bool prefetch = false;
};

struct EvalMetrics {
  int64_t examples = 0;
  double loss = 0;      // mean
  double accuracy = 0;  // classification
  double auc = 0;       // binary
};

// Time spent per phase over a run, summed. Without prefetch, pull and push are the store's
// calls (each step's push is a PushPull that also pulls the next step's parameters; pull is
// then only the first pull of each epoch). With prefetch they are the step loop's share
// (staging the next pull, copying the prefetched parameters in, copying the gradients out),
// and `wait` is the time blocked on the background calls; without prefetch it is zero.
//
// Communication, two ways: `calls` is the wall time of the store calls of training steps,
// wherever they ran (with prefetch, on the background thread, overlapping compute); exposed()
// is the time the steps spent on communication instead of computing. Without prefetch both
// are pull + push.
struct StepBreakdown {
  absl::Duration pull, compute, push, data, wait;
  absl::Duration calls;
  absl::Duration exposed() const { return pull + push + wait; }
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
  bool stopped = false;  // by TrainerOptions::stop_requested
};

// Thread-compatible. Borrows everything it is given (Not owned).
//
// With options.prefetch, a step t of an epoch runs as:
//   wait:    until the background call that pulls step t's parameters is done
//   pull:    give the model step t's parameters (turn it to the buffer set they are in, or
//            copy them in from staging)
//   compute: ForwardBackward(batch t)
//   push:    take the gradients (spans into the model's set, or copied out to staging)
//   data:    batch t+2 from the iterator
//   pull:    queue one call: PushPull(step t's gradients at clock t, the parameters of batch
//            t+2 at clock t+1)
// One background thread runs the calls in order, back to back: ... [push t-1, pull t+1],
// [push t, pull t+2], ... The call queued at the end of step t starts when the one pulling
// step t+1's parameters ends, and runs while step t+1 computes: one round trip per server
// per step, off the step's critical path. Each pull sees every earlier push of this worker
// except the one just before it. The first two steps of an epoch pull alone; its last two
// steps push alone.
//
// Where the call's values live: a model with two buffer sets (Model::AddSecondBufferSet, the
// MLP) computes step t on set t % 2; the call queued after step t reads that set's gradients
// and fills that set's parameters for step t+2 while step t+1 computes on the other set:
// nothing is copied. Other models get staging buffers of the trainer (pulls copied into the
// model's buffers at their step, gradients copied out after compute), two of each, by step
// parity. A slot is filled again only after the call that last used it is done (the step
// that needs the next value waits for it). The pipeline does not cross epochs: it drains at
// the end of each (evaluation, progress and a following epoch see every push applied). A
// failed background call fails the run with its error ("step 12 push + step 14 pull: ...");
// the calls queued after it are dropped.
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
  // Per-step phase times: data, pull, compute, push, wait.
  using PhaseTimes = std::array<absl::Duration, 5>;
  // Where a run stands; shared by the step loops.
  struct RunState {
    TrainResult* result;
    int64_t clock = 0;
    bool stop = false;
    double loss = 0;
  };
  // One epoch of steps, each one after the other (TrainEpoch) or overlapped (prefetch).
  absl::Status TrainEpoch(uint32_t epoch, ShardIterator* it, RunState* state);
  absl::Status TrainEpochOverlapped(uint32_t epoch, ShardIterator* it, RunState* state);
  // Overlapped steps: points pipe's pull of `slot` at the parameters `batch` needs (into the
  // model's other buffer set, or into staging buffers), and its push of `slot` at the
  // gradients of the last ForwardBackward (in the model's current set, or copied out).
  absl::Status PreparePrefetch(const Batch& batch, int slot, internal::Pipeline* pipe);
  absl::Status PrepareGradients(int slot, internal::Pipeline* pipe);
  // Gives the model the parameters prefetched for `batch`: turns it to the buffer set they
  // were pulled into, or copies them in from `staged`.
  absl::Status UsePrefetched(const Batch& batch, const internal::Staged& staged);
  // This worker's steps over the remaining epochs (for the progress line), capped by
  // max_steps.
  // FAILED_PRECONDITION for a start position (options_.start_*) this job cannot reach.
  absl::Status CheckStartPosition() const;
  uint64_t EstimateTotalSteps() const;
  // Evaluates after `epoch`: prints and logs the metrics, keeps them as the final ones, and
  // sets state->stop once target_metric is reached.
  absl::Status EvaluateEpoch(uint32_t epoch, RunState* state);
  // The log's closing "done" record: totals, throughput and the time per phase.
  void LogDone(const TrainResult& result);
  // Bookkeeping after a step: counters, breakdown, metrics, on_step, progress, max_steps.
  // Whether TrainerOptions::stop_requested asks to stop.
  bool StopRequested() const;
  void EndStep(uint32_t epoch, uint64_t offset, uint64_t batch_size, double loss,
               const PhaseTimes& d, RunState* state);
  // Updates the metrics after a step.
  void RecordStep(uint32_t epoch, int64_t clock, uint64_t batch_size, double loss,
                  const PhaseTimes& d, absl::Time end, absl::Duration eval_time);
  void Progress(bool force, uint32_t epoch, uint64_t step, double loss);
  void Log(const std::string& json);

  Model* const model_;
  common::ParameterStore* const store_;
  // Asks the model once to have its gradients written where the store lends (after a first
  // call has set up shared memory with the servers).
  void LendGradientsOnce();

  const Dataset* const train_;
  const Dataset* const test_;
  const TrainerOptions options_;
  std::unique_ptr<common::metrics::Registry> own_registry_;  // when none was given
  std::unique_ptr<Metrics> metrics_;
  FILE* log_ = nullptr;
  int log_errno_ = 0;  // why log_path did not open (Run refuses to start then)
  absl::Time start_;
  absl::Time last_progress_;
  uint64_t samples_ = 0;
  uint64_t total_steps_estimate_ = 0;
  double loss_ema_ = 0;
  // Prefetch with the model's two buffer sets (Model::AddSecondBufferSet), not staging copies.
  bool buffer_sets_ = false;
  // Whether Model::LendGradients was asked (once the first pull has reached the servers) and
  // what it answered.
  bool lend_asked_ = false;
  bool lent_gradients_ = false;
};

}  // namespace ps::worker

#endif  // PS_WORKER_TRAINER_H_
