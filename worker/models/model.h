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
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/parameter_store.h"
#include "kernels/optimizer.h"
#include "worker/data/batch.h"

namespace ps::worker {

// How a model updates the dense tables it keeps on its device (Model::KeepTablesOnDevice):
// as a server would apply the same gradients.
struct DeviceTableOptions {
  // The optimizer of each table, by name (from the tables' configs). Every dense table the
  // model keeps on the device must be here.
  absl::flat_hash_map<std::string, kernels::OptimizerParams> optimizers;
  // The job's dense block (cluster.dense_block_floats): a server counts steps and applies
  // clip_norm block by block, and so does the device. REQUIRES >= 1.
  int64_t block_floats = 0;
  // server.reject_nonfinite: a step whose gradients hold NaN or Inf fails with
  // INVALID_ARGUMENT and changes no table. Off: such gradients are applied as they are.
  bool reject_nonfinite = true;
};

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

  // Centralized training (one worker, tables in this process): keeps the model's dense
  // tables, and their optimizer state, on its backend's device from now on, so that a step
  // moves no parameters or gradients between host and device. Reads the tables' current
  // values from `store` once (a Pull at clock 0). From then on PreparePull and PreparePush
  // leave those tables out, and ForwardBackward ends by updating them where they are, as a
  // server applies a push (Backend::ApplyOptimizer; one step per call, counted per block).
  // The store's copies keep the values read. Returns false when the model has no such
  // support (the default). Errors: FAILED_PRECONDITION after AddSecondBufferSet;
  // INVALID_ARGUMENT for a table without an optimizer in `options` or bad options; those of
  // the pull; RESOURCE_EXHAUSTED (device memory for the optimizer's slots).
  virtual absl::StatusOr<bool> KeepTablesOnDevice(const DeviceTableOptions& options,
                                                  common::ParameterStore* store) {
    (void)options;
    (void)store;
    return false;
  }

  // Optional: the gradients PreparePush hands out (of every buffer set) are written from now
  // on into memory `store` lends (ParameterStore::LendPushBuffer), so that a push reaches the
  // server with no copy in this process. Returns false, changing nothing, where the model has
  // no such support (the default) or the store lends nothing. Called between steps, after
  // AddSecondBufferSet; spans PreparePush handed out before keep their memory.
  virtual bool LendGradients(common::ParameterStore* store) {
    (void)store;
    return false;
  }

  // True when PreparePull for another batch leaves the spans the last PreparePush handed out,
  // and the gradients they point at, as they are (the model keeps no state of the batch in
  // its pull). Steps without prefetch then send those gradients in the PushPull that pulls
  // the next batch's parameters as they are; otherwise (the default) the trainer copies them
  // out first, since preparing the next pull may change them.
  virtual bool PushSurvivesNextPull() const { return false; }
};

}  // namespace ps::worker

#endif  // PS_WORKER_MODELS_MODEL_H_
