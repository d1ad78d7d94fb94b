// Model: the training-side math of one model. A step is
//   PreparePull(batch, &pull)  -> the store fills the model's parameter buffers
//   ForwardBackward(batch)     -> loss; gradients into the model's gradient buffers
//   PreparePush(&push)         -> the store sends the gradients
// Parameters and gradients live in host buffers the model owns (the spans handed out stay
// valid until the next call); compute runs on the model's kernels::Backend, which keeps
// activations on the device and copies only parameters in and gradients out.
#ifndef PS_WORKER_MODELS_MODEL_H_
#define PS_WORKER_MODELS_MODEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/parameter_store.h"
#include "worker/data/batch.h"

namespace ps::worker {

struct StepResult {
  // Mean loss over the batch.
  double loss = 0;
};

// Sums over evaluated batches; the trainer turns them into metrics.
struct EvalAccumulator {
  int64_t examples = 0;
  double loss_sum = 0;        // sum of per-example losses
  int64_t correct = 0;        // classification
  // CTR: predicted probability and label per example (for AUC).
  std::vector<float> scores;
  std::vector<float> labels;
};

// Thread-compatible.
class Model {
 public:
  virtual ~Model() = default;

  // Adds to `pull` the tables (dense) and keys (sparse) that `batch` needs, with spans into
  // the model's parameter buffers.
  virtual absl::Status PreparePull(const Batch& batch, common::PullBatch* pull) = 0;
  // Forward and backward on `batch` with the parameters last pulled. REQUIRES: PreparePull
  // for the same batch, then a successful pull.
  virtual absl::StatusOr<StepResult> ForwardBackward(const Batch& batch) = 0;
  // Adds the gradients of the last ForwardBackward to `push`.
  virtual absl::Status PreparePush(common::PushBatch* push) = 0;
  // Forward only on `batch` (after PreparePull + pull), accumulating metrics.
  virtual absl::Status Evaluate(const Batch& batch, EvalAccumulator* acc) = 0;

  // Optional, for overlapped steps (training.prefetch) without staging copies: gives the
  // model a second set of parameter and gradient buffers. Returns false when the model has no
  // such support (the default: the trainer then copies), true once the second set exists.
  // Errors: RESOURCE_EXHAUSTED (memory).
  virtual absl::StatusOr<bool> AddSecondBufferSet() { return false; }
  // Makes the other set current: every call above uses it from now on. The spans PreparePull
  // and PreparePush handed out for the set left keep pointing into it, so a store may fill
  // its parameters and read its gradients while the model computes on the current set. Only
  // a model whose PreparePull keeps no state of the batch may offer two sets: the trainer
  // prepares the pull of a later batch before computing the current one.
  // REQUIRES: AddSecondBufferSet returned true.
  virtual void SwapBufferSets() {}

  // True when PreparePull for another batch leaves the spans the last PreparePush handed out,
  // and the gradients they point at, as they are (the model keeps no state of the batch in
  // its pull). Steps without prefetch then send those gradients in the PushPull that pulls
  // the next batch's parameters as they are; otherwise (the default) the trainer copies them
  // out first, since preparing the next pull may change them.
  virtual bool PushSurvivesNextPull() const { return false; }
};

}  // namespace ps::worker

#endif  // PS_WORKER_MODELS_MODEL_H_
