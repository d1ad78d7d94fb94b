// MlpModel: a multilayer perceptron classifier on dense features (e.g. Fashion-MNIST).
//
// Widths [input_dim, hidden..., num_classes] (common::MlpLayerWidths); layer i computes
// x * W_i + b_i with the dense tables common::MlpWeightTable(config, i) of shape
// [in, out] (row-major) and common::MlpBiasTable(config, i) of shape [out]. Hidden layers
// apply config.activation (ReLU, tanh or sigmoid); the last layer's outputs are logits, and
// the loss is the softmax cross-entropy averaged over the batch. Gradients are those of
// that mean loss.
//
// A step on the CPU backend copies nothing beyond what the store does: it pulls straight
// into the buffers the GEMMs read, and the gradients it pushes are those the GEMMs wrote.
// On CUDA the parameters go to the device in one copy per pull and the gradients come back
// in one copy per step; activations stay on the device.
#ifndef PS_WORKER_MODELS_MLP_MODEL_H_
#define PS_WORKER_MODELS_MLP_MODEL_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/parameter_store.h"
#include "kernels/backend.h"
#include "proto/config.pb.h"
#include "worker/data/batch.h"
#include "worker/models/dense_stack.h"
#include "worker/models/mirrored_array.h"
#include "worker/models/model.h"

namespace ps::worker {

// Thread-compatible: callers synchronize. The Backend is not owned and must outlive the
// model.
class MlpModel final : public Model {
 public:
  // A model for batches of at most `max_batch` examples.
  // Errors: INVALID_ARGUMENT for a null backend, max_batch outside [1, INT32_MAX], a zero
  // width, or an empty table_prefix; RESOURCE_EXHAUSTED when the device is out of memory.
  static absl::StatusOr<std::unique_ptr<MlpModel>> Create(const ps::MlpConfig& config,
                                                          kernels::Backend* backend,
                                                          int64_t max_batch);

  // Adds a DensePull for every weight and bias table. Errors: INVALID_ARGUMENT for a batch
  // this model cannot take (see ForwardBackward).
  absl::Status PreparePull(const Batch& batch, common::PullBatch* pull) override;

  // Returns the mean softmax cross-entropy of the batch; the gradients are left for
  // PreparePush. Errors: INVALID_ARGUMENT when batch.size is outside [1, max_batch],
  // batch.feature_dim != input_dim, the dense or label arrays have the wrong size, or a
  // label is outside [0, num_classes); backend errors otherwise.
  absl::StatusOr<StepResult> ForwardBackward(const Batch& batch) override;

  // Adds a DensePush for every table, with the gradients of the last ForwardBackward.
  // Errors: FAILED_PRECONDITION unless the last ForwardBackward succeeded.
  absl::Status PreparePush(common::PushBatch* push) override;

  // Adds the batch's size, loss sum and number of argmax-correct examples to `acc`.
  // Errors: as ForwardBackward.
  absl::Status Evaluate(const Batch& batch, EvalAccumulator* acc) override;

  // Two sets of parameter and gradient buffers (DenseStack::AddSecondBufferSet): returns true.
  absl::StatusOr<bool> AddSecondBufferSet() override;
  void SwapBufferSets() override;
  // True: every pull is every table, whatever the batch, into buffers the gradients are not in.
  bool PushSurvivesNextPull() const override { return true; }
  // Every table of the model goes to the device (DenseStack::KeepOnDevice): returns true.
  absl::StatusOr<bool> KeepTablesOnDevice(const DeviceTableOptions& options,
                                          common::ParameterStore* store) override;
  // DenseStack::LendGradients.
  bool LendGradients(common::ParameterStore* store) override {
    return stack_->LendGradients(store);
  }
  // The layers (e.g. to read the tables on the device).
  DenseStack* stack() { return stack_.get(); }

 private:
  MlpModel(kernels::Backend* backend, std::unique_ptr<DenseStack> stack);

  absl::Status CheckBatch(const Batch& batch) const;
  // Validates `batch`, stages its features and labels on the device and runs the forward
  // pass; returns the device logits.
  absl::StatusOr<float*> Forward(const Batch& batch);

  kernels::Backend* const backend_;  // Not owned.
  std::unique_ptr<DenseStack> stack_;
  // Device copies of the batch's features and labels (CUDA only; on the CPU backend the
  // kernels read the Batch's own vectors).
  MirroredArray<float> features_;
  MirroredArray<int32_t> labels_;
  // Set by Forward.
  const float* device_features_ = nullptr;
  const int32_t* device_labels_ = nullptr;
  bool has_gradients_ = false;
  bool spare_has_gradients_ = false;  // of the other buffer set
};

}  // namespace ps::worker

#endif  // PS_WORKER_MODELS_MLP_MODEL_H_
