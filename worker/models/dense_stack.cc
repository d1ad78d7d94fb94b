#include "worker/models/dense_stack.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/backend.h"

namespace ps::worker {
namespace {

// Each table starts on a 256-byte boundary of the flat arrays (the allocation itself is
// 256-byte aligned), which keeps BLAS on its aligned paths and CUDA loads coalesced.
constexpr int64_t kAlignFloats = 64;

int64_t RoundUp(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

absl::Status CheckOptions(const DenseStackOptions& options) {
  const size_t layers = options.widths.size() < 2 ? 0 : options.widths.size() - 1;
  if (layers == 0) {
    return absl::InvalidArgumentError("DenseStack: widths needs at least 2 entries");
  }
  for (size_t i = 0; i < options.widths.size(); ++i) {
    if (options.widths[i] < 1 || options.widths[i] > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("DenseStack: widths[", i, "] = ", options.widths[i], " is not >= 1"));
    }
  }
  if (options.weight_tables.size() != layers || options.bias_tables.size() != layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("DenseStack: need ", layers, " weight and bias table names, got ",
                     options.weight_tables.size(), " and ", options.bias_tables.size()));
  }
  for (size_t i = 0; i < layers; ++i) {
    if (options.weight_tables[i].empty() || options.bias_tables[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("DenseStack: empty table name for layer ", i));
    }
  }
  if (options.max_batch < 1 || options.max_batch > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DenseStack: max_batch = ", options.max_batch, " is not >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DenseStack>> DenseStack::Create(DenseStackOptions options,
                                                               kernels::Backend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("DenseStack: null backend");
  RETURN_IF_ERROR(CheckOptions(options));
  std::unique_ptr<DenseStack> stack(new DenseStack(std::move(options), backend));
  RETURN_IF_ERROR(stack->Init());
  return stack;
}

DenseStack::DenseStack(DenseStackOptions options, kernels::Backend* backend)
    : options_(std::move(options)), backend_(backend), params_(backend), grads_(backend),
      spare_params_(backend), spare_grads_(backend) {}

absl::Status DenseStack::Init() {
  const int64_t num_layers = static_cast<int64_t>(options_.widths.size()) - 1;
  int64_t widest_hidden = 0;
  layers_.resize(num_layers);
  for (int64_t i = 0; i < num_layers; ++i) {
    Layer& layer = layers_[i];
    layer.in = static_cast<int>(options_.widths[i]);
    layer.out = static_cast<int>(options_.widths[i + 1]);
    layer.weight_offset = num_params_;
    num_params_ += RoundUp(int64_t{layer.in} * layer.out);
    layer.bias_offset = num_params_;
    num_params_ += RoundUp(layer.out);
    ASSIGN_OR_RETURN(layer.output, backend_->AllocateFloats(options_.max_batch * layer.out));
    if (i + 1 < num_layers) widest_hidden = std::max<int64_t>(widest_hidden, layer.out);
  }
  RETURN_IF_ERROR(params_.Reserve(num_params_));
  RETURN_IF_ERROR(grads_.Reserve(num_params_));
  // Defined contents (and finite padding) before the first pull.
  std::fill_n(params_.host(), num_params_, 0.f);
  std::fill_n(grads_.host(), num_params_, 0.f);
  for (kernels::DeviceBuffer& buffer : hidden_grad_) {
    ASSIGN_OR_RETURN(buffer, backend_->AllocateFloats(options_.max_batch * widest_hidden));
  }
  return absl::OkStatus();
}

void DenseStack::AddPulls(common::PullBatch* pull) {
  for (int i = 0; i < num_layers(); ++i) {
    const Layer& layer = layers_[i];
    pull->dense.push_back(
        {options_.weight_tables[i],
         absl::MakeSpan(params_.host() + layer.weight_offset, int64_t{layer.in} * layer.out)});
    pull->dense.push_back(
        {options_.bias_tables[i],
         absl::MakeSpan(params_.host() + layer.bias_offset, static_cast<size_t>(layer.out))});
  }
  params_on_device_ = false;
}

void DenseStack::AddPushes(common::PushBatch* push) const {
  for (int i = 0; i < num_layers(); ++i) {
    const Layer& layer = layers_[i];
    push->dense.push_back(
        {options_.weight_tables[i],
         absl::MakeConstSpan(grads_.host() + layer.weight_offset, int64_t{layer.in} * layer.out)});
    push->dense.push_back(
        {options_.bias_tables[i],
         absl::MakeConstSpan(grads_.host() + layer.bias_offset, static_cast<size_t>(layer.out))});
  }
}

absl::Status DenseStack::CheckRows(int64_t rows) const {
  if (rows < 1 || rows > options_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("DenseStack: ", rows, " rows, want 1..", options_.max_batch));
  }
  return absl::OkStatus();
}

absl::Status DenseStack::AddSecondBufferSet() {
  if (has_spare_) return absl::OkStatus();
  RETURN_IF_ERROR(spare_params_.Reserve(num_params_));
  RETURN_IF_ERROR(spare_grads_.Reserve(num_params_));
  std::fill_n(spare_params_.host(), num_params_, 0.f);
  std::fill_n(spare_grads_.host(), num_params_, 0.f);
  has_spare_ = true;
  return absl::OkStatus();
}

void DenseStack::SwapBufferSets() {
  CHECK(has_spare_) << "DenseStack::SwapBufferSets without AddSecondBufferSet";
  // Moving a MirroredArray keeps its memory where it is, so spans into either set stay valid.
  std::swap(params_, spare_params_);
  std::swap(grads_, spare_grads_);
  params_on_device_ = false;
}

absl::StatusOr<float*> DenseStack::Forward(int64_t rows, const float* x) {
  RETURN_IF_ERROR(CheckRows(rows));
  if (!params_on_device_) {
    RETURN_IF_ERROR(params_.CopyToDevice(num_params_));
    params_on_device_ = true;
  }
  const int m = static_cast<int>(rows);
  const float* input = x;
  for (int i = 0; i < num_layers(); ++i) {
    const Layer& layer = layers_[i];
    float* z = layer.output.floats();
    RETURN_IF_ERROR(backend_->Gemm(false, false, m, layer.out, layer.in, 1.f, input, layer.in,
                                   params_.device() + layer.weight_offset, layer.out, 0.f, z,
                                   layer.out));
    RETURN_IF_ERROR(backend_->BiasAdd(rows, layer.out, params_.device() + layer.bias_offset, z));
    if (i + 1 < num_layers()) {
      RETURN_IF_ERROR(
          backend_->ActivationForward(options_.hidden_activation, rows * layer.out, z, z));
    }
    input = z;
  }
  return layers_.back().output.floats();
}

float* DenseStack::InputGradBuffer(int layer, float* dx) {
  return layer == 0 ? dx : hidden_grad_[layer % 2].floats();
}

absl::Status DenseStack::Backward(int64_t rows, const float* x, float* d_output, float* dx) {
  RETURN_IF_ERROR(CheckRows(rows));
  const int m = static_cast<int>(rows);
  // dz is the gradient w.r.t. layer i's pre-activation output. Layer i writes the gradient
  // w.r.t. its input into hidden_grad_[i % 2], which is never the buffer dz points at
  // (hidden_grad_[(i + 1) % 2] or d_output), as Gemm forbids aliasing.
  float* dz = d_output;
  for (int i = num_layers() - 1; i >= 0; --i) {
    const Layer& layer = layers_[i];
    const float* input = i == 0 ? x : layers_[i - 1].output.floats();
    float* dw = grads_.device() + layer.weight_offset;
    // dW = input^T * dz  ([in, rows] x [rows, out]).
    RETURN_IF_ERROR(backend_->Gemm(true, false, layer.in, layer.out, m, 1.f, input, layer.in, dz,
                                   layer.out, 0.f, dw, layer.out));
    RETURN_IF_ERROR(backend_->BiasGrad(rows, layer.out, dz, grads_.device() + layer.bias_offset));
    float* d_input = InputGradBuffer(i, dx);
    if (d_input == nullptr) break;  // Layer 0 and no dx wanted.
    // d_input = dz * W^T  ([rows, out] x [out, in]).
    RETURN_IF_ERROR(backend_->Gemm(false, true, m, layer.in, layer.out, 1.f, dz, layer.out,
                                   params_.device() + layer.weight_offset, layer.out, 0.f, d_input,
                                   layer.in));
    if (i > 0) {
      // Through the previous layer's activation, from its output (kept in Forward).
      RETURN_IF_ERROR(backend_->ActivationBackward(options_.hidden_activation, rows * layer.in,
                                                   input, d_input, d_input));
    }
    dz = d_input;
  }
  return grads_.CopyToHost(num_params_);
}

}  // namespace ps::worker
