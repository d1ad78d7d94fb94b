#include "worker/models/ctr_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/config/config.h"
#include "common/hash.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "proto/config.pb.h"
#include "worker/data/batch.h"
#include "worker/models/dense_stack.h"
#include "worker/models/model.h"

namespace ps::worker {

absl::StatusOr<std::unique_ptr<CtrModel>> CtrModel::Create(const ps::CtrConfig& config,
                                                           kernels::Backend* backend,
                                                           int64_t max_batch) {
  if (config.embedding_table().empty()) {
    return absl::InvalidArgumentError("CtrModel: empty embedding_table");
  }
  if (config.dense_prefix().empty()) {
    return absl::InvalidArgumentError("CtrModel: empty dense_prefix");
  }
  DenseStackOptions options;
  for (uint32_t width : common::CtrLayerWidths(config)) options.widths.push_back(width);
  for (int i = 0; i < common::CtrNumDenseLayers(config); ++i) {
    options.weight_tables.push_back(common::CtrWeightTable(config, i));
    options.bias_tables.push_back(common::CtrBiasTable(config, i));
  }
  options.hidden_activation = kernels::Activation::kRelu;
  options.max_batch = max_batch;
  ASSIGN_OR_RETURN(std::unique_ptr<DenseStack> stack,
                   DenseStack::Create(std::move(options), backend), "CtrModel");
  std::unique_ptr<CtrModel> model(new CtrModel(config, backend, std::move(stack)));
  const int64_t pooled_floats = max_batch * model->dim_;
  RETURN_IF_ERROR(model->pooled_.Reserve(pooled_floats));
  RETURN_IF_ERROR(model->d_pooled_.Reserve(pooled_floats));
  RETURN_IF_ERROR(model->labels_.Reserve(max_batch));
  RETURN_IF_ERROR(model->probabilities_.Reserve(max_batch));
  return model;
}

CtrModel::CtrModel(const ps::CtrConfig& config, kernels::Backend* backend,
                   std::unique_ptr<DenseStack> stack)
    : backend_(backend),
      embedding_table_(config.embedding_table()),
      mean_combiner_(config.combiner() == ps::CtrConfig::MEAN),
      hash_buckets_(config.hash_buckets()),
      dim_(stack->input_dim()),
      stack_(std::move(stack)),
      pooled_(backend),
      d_pooled_(backend),
      labels_(backend),
      probabilities_(backend) {}

uint64_t CtrModel::KeyOf(uint64_t feature_id) const {
  return hash_buckets_ > 0 ? common::Mix64(feature_id) % hash_buckets_ : feature_id;
}

absl::Status CtrModel::CheckBatch(const Batch& batch) const {
  if (batch.size < 1 || batch.size > stack_->max_batch()) {
    return absl::InvalidArgumentError(absl::StrCat("CtrModel: batch of ", batch.size,
                                                   " examples, want 1..", stack_->max_batch()));
  }
  const size_t num_features = batch.feature_ids.size();
  if (num_features > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("CtrModel: ", num_features, " features in one batch"));
  }
  if (batch.feature_values.size() != num_features) {
    return absl::InvalidArgumentError(absl::StrCat("CtrModel: ", batch.feature_values.size(),
                                                   " feature values for ", num_features,
                                                   " feature ids"));
  }
  if (static_cast<int64_t>(batch.offsets.size()) != batch.size + 1 || batch.offsets[0] != 0 ||
      batch.offsets.back() != num_features) {
    return absl::InvalidArgumentError(
        absl::StrCat("CtrModel: offsets must have batch size + 1 = ", batch.size + 1,
                     " entries from 0 to the number of features ", num_features));
  }
  for (int64_t b = 0; b < batch.size; ++b) {
    if (batch.offsets[b + 1] < batch.offsets[b]) {
      return absl::InvalidArgumentError(absl::StrCat("CtrModel: offsets decrease at example ", b));
    }
  }
  if (static_cast<int64_t>(batch.binary_labels.size()) != batch.size) {
    return absl::InvalidArgumentError(absl::StrCat("CtrModel: ", batch.binary_labels.size(),
                                                   " labels for ", batch.size, " examples"));
  }
  for (size_t i = 0; i < batch.binary_labels.size(); ++i) {
    const float label = batch.binary_labels[i];
    if (!(label >= 0.f && label <= 1.f)) {  // Also rejects NaN.
      return absl::InvalidArgumentError(
          absl::StrCat("CtrModel: label ", label, " of example ", i, " is outside [0, 1]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CtrModel::PreparePull(const Batch& batch, common::PullBatch* pull) {
  // The keys, rows and gradient rows below change size: nothing of the previous batch may
  // be pushed any more.
  prepared_size_ = -1;
  has_gradients_ = false;
  RETURN_IF_ERROR(CheckBatch(batch));
  key_rows_.clear();
  unique_keys_.clear();
  feature_rows_.resize(batch.feature_ids.size());
  for (size_t f = 0; f < batch.feature_ids.size(); ++f) {
    const uint64_t key = KeyOf(batch.feature_ids[f]);
    const auto [it, inserted] =
        key_rows_.try_emplace(key, static_cast<int32_t>(unique_keys_.size()));
    if (inserted) unique_keys_.push_back(key);
    feature_rows_[f] = it->second;
  }
  rows_.resize(unique_keys_.size() * dim_);
  if (!unique_keys_.empty()) {
    pull->sparse.push_back(
        {embedding_table_, absl::MakeConstSpan(unique_keys_), absl::MakeSpan(rows_)});
  }
  stack_->AddPulls(pull);
  prepared_size_ = batch.size;
  return absl::OkStatus();
}

float CtrModel::FeatureScale(float value, int64_t count) const {
  return mean_combiner_ ? value / static_cast<float>(count) : value;
}

void CtrModel::PoolOnHost(const Batch& batch, float* pooled) const {
  std::fill_n(pooled, batch.size * dim_, 0.f);
  for (int64_t b = 0; b < batch.size; ++b) {
    const uint32_t begin = batch.offsets[b], end = batch.offsets[b + 1];
    float* __restrict out = pooled + b * dim_;
    for (uint32_t f = begin; f < end; ++f) {
      const float scale = FeatureScale(batch.feature_values[f], end - begin);
      const float* __restrict row = rows_.data() + int64_t{feature_rows_[f]} * dim_;
      for (int64_t j = 0; j < dim_; ++j) out[j] += scale * row[j];
    }
  }
}

void CtrModel::ScatterGradsOnHost(const Batch& batch, const float* d_pooled) {
  // Every use of a key adds into the key's one row, so duplicates within and across
  // examples sum, and the push carries each key once.
  row_grads_.assign(rows_.size(), 0.f);
  for (int64_t b = 0; b < batch.size; ++b) {
    const uint32_t begin = batch.offsets[b], end = batch.offsets[b + 1];
    const float* __restrict grad = d_pooled + b * dim_;
    for (uint32_t f = begin; f < end; ++f) {
      const float scale = FeatureScale(batch.feature_values[f], end - begin);
      float* __restrict out = row_grads_.data() + int64_t{feature_rows_[f]} * dim_;
      for (int64_t j = 0; j < dim_; ++j) out[j] += scale * grad[j];
    }
  }
}

absl::StatusOr<float*> CtrModel::Forward(const Batch& batch) {
  RETURN_IF_ERROR(CheckBatch(batch));
  if (prepared_size_ != batch.size || feature_rows_.size() != batch.feature_ids.size()) {
    return absl::FailedPreconditionError(
        "CtrModel: the batch is not the one of the last PreparePull");
  }
  PoolOnHost(batch, pooled_.host());
  RETURN_IF_ERROR(pooled_.CopyToDevice(batch.size * dim_));
  ASSIGN_OR_RETURN(device_labels_, labels_.Stage(batch.binary_labels.data(), batch.size));
  return stack_->Forward(batch.size, pooled_.device());
}

absl::StatusOr<StepResult> CtrModel::ForwardBackward(const Batch& batch) {
  has_gradients_ = false;
  ASSIGN_OR_RETURN(float* logits, Forward(batch));
  // The loss gradient replaces the logits in place; Backward consumes it from there.
  ASSIGN_OR_RETURN(const float loss, backend_->SigmoidCrossEntropy(
                                         batch.size, logits, device_labels_, logits, nullptr));
  RETURN_IF_ERROR(stack_->Backward(batch.size, pooled_.device(), logits, d_pooled_.device()));
  RETURN_IF_ERROR(d_pooled_.CopyToHost(batch.size * dim_));
  ScatterGradsOnHost(batch, d_pooled_.host());
  has_gradients_ = true;
  return StepResult{loss};
}

absl::Status CtrModel::PreparePush(common::PushBatch* push) {
  if (!has_gradients_) {
    return absl::FailedPreconditionError("CtrModel: PreparePush without a ForwardBackward");
  }
  if (!unique_keys_.empty()) {
    push->sparse.push_back(
        {embedding_table_, absl::MakeConstSpan(unique_keys_), absl::MakeConstSpan(row_grads_)});
  }
  stack_->AddPushes(push);
  return absl::OkStatus();
}

absl::Status CtrModel::Evaluate(const Batch& batch, EvalAccumulator* acc) {
  ASSIGN_OR_RETURN(float* logits, Forward(batch));
  ASSIGN_OR_RETURN(const float mean_loss,
                   backend_->SigmoidCrossEntropy(batch.size, logits, device_labels_, nullptr,
                                                 probabilities_.device()));
  RETURN_IF_ERROR(probabilities_.CopyToHost(batch.size));
  const float* probabilities = probabilities_.host();
  for (int64_t b = 0; b < batch.size; ++b) {
    const float label = batch.binary_labels[b];
    acc->scores.push_back(probabilities[b]);
    acc->labels.push_back(label);
    acc->correct += (probabilities[b] >= 0.5f) == (label >= 0.5f) ? 1 : 0;
  }
  acc->examples += batch.size;
  acc->loss_sum += static_cast<double>(mean_loss) * batch.size;
  return absl::OkStatus();
}

}  // namespace ps::worker
