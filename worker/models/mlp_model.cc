#include "worker/models/mlp_model.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "proto/config.pb.h"
#include "worker/data/batch.h"
#include "worker/models/dense_stack.h"
#include "worker/models/model.h"

namespace ps::worker {
namespace {

absl::StatusOr<kernels::Activation> ToActivation(ps::MlpConfig::Activation activation) {
  switch (activation) {
    case ps::MlpConfig::RELU:
      return kernels::Activation::kRelu;
    case ps::MlpConfig::TANH:
      return kernels::Activation::kTanh;
    case ps::MlpConfig::SIGMOID:
      return kernels::Activation::kSigmoid;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("MlpModel: unknown activation ", static_cast<int>(activation)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MlpModel>> MlpModel::Create(const ps::MlpConfig& config,
                                                           kernels::Backend* backend,
                                                           int64_t max_batch) {
  if (config.table_prefix().empty()) {
    return absl::InvalidArgumentError("MlpModel: empty table_prefix");
  }
  DenseStackOptions options;
  for (uint32_t width : common::MlpLayerWidths(config)) options.widths.push_back(width);
  for (int i = 0; i < common::MlpNumLayers(config); ++i) {
    options.weight_tables.push_back(common::MlpWeightTable(config, i));
    options.bias_tables.push_back(common::MlpBiasTable(config, i));
  }
  ASSIGN_OR_RETURN(options.hidden_activation, ToActivation(config.activation()));
  options.max_batch = max_batch;
  ASSIGN_OR_RETURN(std::unique_ptr<DenseStack> stack,
                   DenseStack::Create(std::move(options), backend), "MlpModel");
  return std::unique_ptr<MlpModel>(new MlpModel(backend, std::move(stack)));
}

MlpModel::MlpModel(kernels::Backend* backend, std::unique_ptr<DenseStack> stack)
    : backend_(backend), stack_(std::move(stack)), features_(backend), labels_(backend) {}

absl::Status MlpModel::CheckBatch(const Batch& batch) const {
  if (batch.size < 1 || batch.size > stack_->max_batch()) {
    return absl::InvalidArgumentError(absl::StrCat("MlpModel: batch of ", batch.size,
                                                   " examples, want 1..", stack_->max_batch()));
  }
  if (batch.feature_dim != stack_->input_dim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlpModel: batch feature_dim ", batch.feature_dim, " != input_dim ", stack_->input_dim()));
  }
  if (static_cast<int64_t>(batch.dense.size()) != batch.size * batch.feature_dim) {
    return absl::InvalidArgumentError(absl::StrCat("MlpModel: ", batch.dense.size(),
                                                   " dense values for ", batch.size, " x ",
                                                   batch.feature_dim));
  }
  if (static_cast<int64_t>(batch.class_labels.size()) != batch.size) {
    return absl::InvalidArgumentError(absl::StrCat("MlpModel: ", batch.class_labels.size(),
                                                   " labels for ", batch.size, " examples"));
  }
  const int64_t classes = stack_->output_dim();
  for (size_t i = 0; i < batch.class_labels.size(); ++i) {
    const int32_t label = batch.class_labels[i];
    if (label < 0 || label >= classes) {
      return absl::InvalidArgumentError(absl::StrCat("MlpModel: label ", label, " of example ", i,
                                                     " is outside [0, ", classes, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status MlpModel::PreparePull(const Batch& batch, common::PullBatch* pull) {
  RETURN_IF_ERROR(CheckBatch(batch));
  stack_->AddPulls(pull);
  return absl::OkStatus();
}

absl::StatusOr<float*> MlpModel::Forward(const Batch& batch) {
  RETURN_IF_ERROR(CheckBatch(batch));
  ASSIGN_OR_RETURN(device_features_, features_.Stage(batch.dense.data(), batch.dense.size()));
  ASSIGN_OR_RETURN(device_labels_, labels_.Stage(batch.class_labels.data(), batch.size));
  return stack_->Forward(batch.size, device_features_);
}

absl::StatusOr<StepResult> MlpModel::ForwardBackward(const Batch& batch) {
  has_gradients_ = false;
  ASSIGN_OR_RETURN(float* logits, Forward(batch));
  // The loss gradient replaces the logits in place; Backward consumes it from there.
  ASSIGN_OR_RETURN(const float loss, backend_->SoftmaxCrossEntropy(batch.size, stack_->output_dim(),
                                                                   logits, device_labels_, logits));
  RETURN_IF_ERROR(stack_->Backward(batch.size, device_features_, logits, nullptr));
  has_gradients_ = true;
  return StepResult{loss};
}

absl::Status MlpModel::PreparePush(common::PushBatch* push) {
  if (!has_gradients_) {
    return absl::FailedPreconditionError("MlpModel: PreparePush without a ForwardBackward");
  }
  stack_->AddPushes(push);
  return absl::OkStatus();
}

absl::StatusOr<bool> MlpModel::AddSecondBufferSet() {
  RETURN_IF_ERROR(stack_->AddSecondBufferSet());
  return true;
}

void MlpModel::SwapBufferSets() {
  stack_->SwapBufferSets();
  std::swap(has_gradients_, spare_has_gradients_);
}

absl::StatusOr<bool> MlpModel::KeepTablesOnDevice(const DeviceTableOptions& options,
                                                  common::ParameterStore* store) {
  RETURN_IF_ERROR(stack_->KeepOnDevice(options, store));
  return true;
}

absl::Status MlpModel::Evaluate(const Batch& batch, EvalAccumulator* acc) {
  ASSIGN_OR_RETURN(float* logits, Forward(batch));
  ASSIGN_OR_RETURN(
      const kernels::SoftmaxEvalResult result,
      backend_->SoftmaxEval(batch.size, stack_->output_dim(), logits, device_labels_, nullptr));
  acc->examples += batch.size;
  acc->loss_sum += static_cast<double>(result.mean_loss) * batch.size;
  acc->correct += result.num_correct;
  return absl::OkStatus();
}

}  // namespace ps::worker
