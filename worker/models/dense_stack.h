// DenseStack: a stack of fully connected layers on a kernels::Backend, the dense part shared
// by MlpModel (the whole network) and CtrModel (the layers on the pooled embedding).
//
// Layer i maps widths[i] -> widths[i + 1]:  z = x * W_i + b_i, with W_i a dense table of
// shape [widths[i], widths[i + 1]] (row-major) and b_i one of shape [widths[i + 1]]. Every
// layer but the last applies the hidden activation; the last is linear (logits).
//
// Memory. All parameters live in one flat MirroredArray (W_0 | b_0 | W_1 | ...), so a step
// copies them to the device in one transfer, and all gradients in another flat array copied
// back in one transfer. On the CPU backend both sides are the same memory: the store pulls
// straight into the buffers the GEMMs read and pushes straight from those they write.
// Activations stay on the device, in buffers sized for max_batch rows at creation.
//
// Tables on the device (KeepOnDevice, centralized training): the device side of the
// parameters becomes the tables themselves. Each table gets its optimizer's slots in device
// memory and a step count, and Backward ends by applying the gradients where they are
// (Backend::ApplyOptimizer) instead of copying them to the host: no transfer per step.
#ifndef PS_WORKER_MODELS_DENSE_STACK_H_
#define PS_WORKER_MODELS_DENSE_STACK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/parameter_store.h"
#include "kernels/backend.h"
#include "kernels/optimizer.h"
#include "worker/models/mirrored_array.h"
#include "worker/models/model.h"

namespace ps::worker {

struct DenseStackOptions {
  // Layer widths, input first: [in, hidden..., out]. REQUIRES at least 2 entries, each >= 1.
  std::vector<int64_t> widths;
  // Table names of each layer's weight [widths[i], widths[i + 1]] and bias [widths[i + 1]].
  // REQUIRES widths.size() - 1 entries each, non-empty.
  std::vector<std::string> weight_tables;
  std::vector<std::string> bias_tables;
  // Nonlinearity after every layer but the last. Default ReLU.
  kernels::Activation hidden_activation = kernels::Activation::kRelu;
  // Most rows a Forward may take. REQUIRES 1 <= max_batch <= INT32_MAX.
  int64_t max_batch = 0;
};

// Thread-compatible: callers synchronize. Owns its buffers; the Backend is not owned and
// must outlive the stack.
class DenseStack {
 public:
  // Errors: INVALID_ARGUMENT for options violating a REQUIRES (the message names the field),
  // or a null backend; RESOURCE_EXHAUSTED when the device is out of memory.
  static absl::StatusOr<std::unique_ptr<DenseStack>> Create(DenseStackOptions options,
                                                            kernels::Backend* backend);

  DenseStack(const DenseStack&) = delete;
  DenseStack& operator=(const DenseStack&) = delete;
  ~DenseStack();

  int num_layers() const { return static_cast<int>(layers_.size()); }
  int64_t input_dim() const { return options_.widths.front(); }
  int64_t output_dim() const { return options_.widths.back(); }
  int64_t max_batch() const { return options_.max_batch; }

  // Adds a DensePull per table into the host parameter buffers, and marks the device copy
  // stale so that the next Forward copies them in. Adds nothing once the tables are on the
  // device.
  void AddPulls(common::PullBatch* pull);
  // Adds a DensePush per table with the gradients of the last Backward (valid until the
  // next Backward). Adds nothing once the tables are on the device.
  void AddPushes(common::PushBatch* push) const;

  // Keeps the tables on the device from now on (Model::KeepTablesOnDevice, which says what
  // changes): pulls them from `store` once, copies them to the device and sets up their
  // optimizers' slots there. Errors: FAILED_PRECONDITION with a second buffer set or when
  // already on the device; INVALID_ARGUMENT for a table missing from options.optimizers, an
  // invalid optimizer or block_floats < 1; those of the pull and of the backend.
  // FAILED_PRECONDITION too once the gradients are lent (LendGradients).
  absl::Status KeepOnDevice(const DeviceTableOptions& options, common::ParameterStore* store);
  bool tables_on_device() const { return !device_tables_.empty(); }
  // Copies the parameters from the device to the host buffers (a no-op where they are the
  // same memory), e.g. to read the tables on the device. Errors: the backend's.
  absl::Status CopyParametersToHost();
  // The host parameter buffer of layer i's weight and bias (as AddPulls hands them out).
  absl::Span<const float> weight(int i) const;
  absl::Span<const float> bias(int i) const;

  // Overlapped steps without staging copies: allocates a second set of parameter and
  // gradient buffers (zeros), so that a store may fill one set's parameters and read its
  // gradients while the stack computes on the other. Idempotent.
  // Errors: RESOURCE_EXHAUSTED when the device is out of memory; FAILED_PRECONDITION once
  // the tables are on the device (the store calls then carry nothing to overlap), or once the
  // gradients are lent (LendGradients: lend after adding the set).
  absl::Status AddSecondBufferSet();
  // Makes the other set current: Forward, Backward, AddPulls and AddPushes use it from now
  // on, and the next Forward copies its parameters to the device. The spans AddPulls and
  // AddPushes handed out keep pointing into their own set. REQUIRES: AddSecondBufferSet.
  void SwapBufferSets();

  // Model::LendGradients: where the tables live in the store, the gradients of every set land
  // from now on in memory `store` lends for the stack's tables (common::LentBuffer; weight 0,
  // bias 0, weight 1, ... in AddPushes' order), so that a push reaches the server with no
  // copy. Where the device reads host memory (the CPU backend) Backward writes them there;
  // on a device with its own memory (CUDA) it copies them there from the device in one copy,
  // instead of into the stack's page-locked buffer, after registering the lent memory with
  // the backend (Backend::RegisterHost). False, and nothing changed, where the store lends
  // none or the backend cannot register it. Spans AddPushes handed out before keep pointing
  // at the buffers they did, which stay allocated. True once lent. Once the store revokes the
  // lent memory (LentBuffer::revoked: it gave up a call whose server may still read it), the
  // next Backward writes the stack's own buffers instead, in every set, and the lent memory is
  // kept, unwritten, until the stack goes; lending can then be asked again.
  bool LendGradients(common::ParameterStore* store);

  // Forward over `rows` rows of x (device memory, rows x input_dim()). Returns the output
  // (device, rows x output_dim()), valid until the next Forward; the caller may overwrite it,
  // e.g. with the loss gradient it then hands to Backward. The parameters' copy to the device
  // (after AddPulls or SwapBufferSets) is issued without waiting for it, so the host goes on
  // issuing the layers while it runs; the stack waits for it before their host side can be
  // written again (Backward's copy of the gradients, or AddPulls and SwapBufferSets).
  // Errors: INVALID_ARGUMENT unless 1 <= rows <= max_batch(); backend errors.
  absl::StatusOr<float*> Forward(int64_t rows, const float* x);

  // Backward of the last Forward (same rows and x). `d_output` (device, rows x
  // output_dim()) is the gradient of the loss w.r.t. the output; it is overwritten. Leaves
  // the parameter gradients in the host gradient buffers (see AddPushes) and, if dx is not
  // null, the gradient w.r.t. x in dx (device, rows x input_dim()). With the tables on the
  // device it applies the gradients to them instead (one step of every table).
  // Errors: as Forward; with the tables on the device and reject_nonfinite, INVALID_ARGUMENT
  // for a gradient holding NaN or Inf (no table changes).
  absl::Status Backward(int64_t rows, const float* x, float* d_output, float* dx);

 private:
  struct Layer {
    int in = 0;
    int out = 0;
    int64_t weight_offset = 0;  // into the flat parameter and gradient arrays
    int64_t bias_offset = 0;
    // Into the gradients Backward writes: the same as above, or into the lent buffers.
    int64_t grad_weight_offset = 0;
    int64_t grad_bias_offset = 0;
    kernels::DeviceBuffer output;  // max_batch x out: the activation (or logits if last)
  };

  DenseStack(DenseStackOptions options, kernels::Backend* backend);
  absl::Status Init();
  absl::Status CheckRows(int64_t rows) const;
  // Forward's layers, once the parameters' copy is issued.
  absl::StatusOr<float*> ForwardLayers(int64_t rows, const float* x);
  // Back to the stack's own gradient buffers in both sets, the lent ones kept in revoked_ and
  // unregistered.
  void StopLending();
  // Waits for the device if a parameter copy may still be reading the host side.
  absl::Status EndParameterCopy();
  // `waited`, the status of a call that waits for the device, after marking the parameters'
  // copy as ended where that call is sure to have waited (OK).
  absl::Status EndedParameterCopy(absl::Status waited);
  // EndParameterCopy where no status can be returned: a failure goes to deferred_error_.
  void EndParameterCopyOrDefer();
  // The device gradient buffer a backward step writes for layer i's input.
  float* InputGradBuffer(int layer, float* dx);
  // The current set's gradients as Backward writes them: the lent memory where the device
  // writes host memory, else grads_' device side.
  float* grads() const {
    return lent_ != nullptr && SharesHostMemory(*backend_) ? lent_->values().data()
                                                           : grads_.device();
  }

  const DenseStackOptions options_;
  kernels::Backend* const backend_;  // Not owned.
  std::vector<Layer> layers_;
  int64_t num_params_ = 0;  // of the flat arrays, padding included
  MirroredArray<float> params_;
  MirroredArray<float> grads_;
  // The other set (SwapBufferSets); empty until AddSecondBufferSet.
  MirroredArray<float> spare_params_;
  MirroredArray<float> spare_grads_;
  bool has_spare_ = false;
  // The gradients of each set in memory a store lent (LendGradients), or null.
  std::unique_ptr<common::LentBuffer> lent_;
  std::unique_ptr<common::LentBuffer> spare_lent_;
  // Where the lent memory was registered with the backend (a device with its own memory): one
  // range or two. Unregistered once the store revokes the buffers (StopLending), or before they go.
  std::vector<void*> registered_;
  // Lent buffers the store revoked: kept, never written again, until the stack goes.
  std::vector<std::unique_ptr<common::LentBuffer>> revoked_;
  // Ping-pong device buffers (max_batch x widest hidden layer) for the gradients w.r.t.
  // hidden activations during Backward.
  kernels::DeviceBuffer hidden_grad_[2];
  // False after AddPulls until Forward has copied the parameters to the device.
  bool params_on_device_ = false;
  // Forward issued the parameters' copy to the device without waiting for it, and the backend
  // has not waited since: their host side must not change until it has (EndParameterCopy).
  bool params_copy_pending_ = false;
  // What a wait outside Forward and Backward (AddPulls, SwapBufferSets) returned, if it
  // failed: the next Forward returns it.
  absl::Status deferred_error_;

  // A table kept on the device (KeepOnDevice): its place in the flat arrays, its optimizer
  // and slots (NumSlots arrays of n floats, one after the other) and the steps applied.
  struct DeviceTable {
    std::string name;
    int64_t offset = 0;
    int64_t n = 0;
    kernels::OptimizerParams optimizer;
    kernels::DeviceBuffer slots;
    int64_t step = 0;
  };
  // Applies the gradients of the last Backward to the tables on the device.
  absl::Status ApplyOnDevice();
  std::vector<DeviceTable> device_tables_;  // empty = the tables live in the store
  int64_t block_floats_ = 0;
  bool reject_nonfinite_ = true;
};

}  // namespace ps::worker

#endif  // PS_WORKER_MODELS_DENSE_STACK_H_
