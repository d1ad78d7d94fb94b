#include "worker/models/dense_stack.h"

#include <unistd.h>

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
    : options_(std::move(options)),
      backend_(backend),
      params_(backend),
      grads_(backend),
      spare_params_(backend),
      spare_grads_(backend) {}

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
    layer.grad_weight_offset = layer.weight_offset;
    layer.grad_bias_offset = layer.bias_offset;
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

absl::Status DenseStack::EndParameterCopy() {
  if (!params_copy_pending_) return absl::OkStatus();
  return EndedParameterCopy(backend_->Synchronize());
}

absl::Status DenseStack::EndedParameterCopy(absl::Status waited) {
  // Only OK says that the device waited: CUDA's calls fail before waiting where they cannot
  // make the device current or issue their copy, and an INVALID_ARGUMENT may come from before
  // the wait (an invalid device) or after it (a bad index the kernels met). After an error the
  // copy counts as pending still, which costs the next EndParameterCopy one Synchronize more.
  if (waited.ok()) params_copy_pending_ = false;
  return waited;
}

void DenseStack::EndParameterCopyOrDefer() {
  if (absl::Status s = EndParameterCopy(); !s.ok() && deferred_error_.ok()) {
    deferred_error_ = std::move(s);
  }
}

void DenseStack::AddPulls(common::PullBatch* pull) {
  if (tables_on_device()) return;
  // The pull writes the host side a copy may still be reading (a Forward without a Backward).
  EndParameterCopyOrDefer();
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
  if (tables_on_device()) return;
  for (int i = 0; i < num_layers(); ++i) {
    const Layer& layer = layers_[i];
    // The host side: lent memory, or grads_ (the same as its device side where shared).
    const float* host = lent_ != nullptr ? lent_->values().data() : grads_.host();
    push->dense.push_back(
        {options_.weight_tables[i],
         absl::MakeConstSpan(host + layer.grad_weight_offset, int64_t{layer.in} * layer.out)});
    push->dense.push_back(
        {options_.bias_tables[i],
         absl::MakeConstSpan(host + layer.grad_bias_offset, static_cast<size_t>(layer.out))});
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
  if (tables_on_device()) {
    return absl::FailedPreconditionError(
        "DenseStack: no second buffer set with the tables on the device");
  }
  if (lent_ != nullptr) {
    return absl::FailedPreconditionError(
        "DenseStack: no second buffer set after the gradients were lent");
  }
  RETURN_IF_ERROR(spare_params_.Reserve(num_params_));
  RETURN_IF_ERROR(spare_grads_.Reserve(num_params_));
  std::fill_n(spare_params_.host(), num_params_, 0.f);
  std::fill_n(spare_grads_.host(), num_params_, 0.f);
  has_spare_ = true;
  return absl::OkStatus();
}

void DenseStack::SwapBufferSets() {
  CHECK(has_spare_) << "DenseStack::SwapBufferSets without AddSecondBufferSet";
  // The set put aside may be written by a store from now on.
  EndParameterCopyOrDefer();
  // Moving a MirroredArray keeps its memory where it is, so spans into either set stay valid.
  std::swap(params_, spare_params_);
  std::swap(grads_, spare_grads_);
  std::swap(lent_, spare_lent_);
  params_on_device_ = false;
}

DenseStack::~DenseStack() {
  EndParameterCopy().IgnoreError();  // the copy reads memory freed with the stack
  for (void* range : registered_) backend_->UnregisterHost(range);
}

bool DenseStack::LendGradients(common::ParameterStore* store) {
  if (lent_ != nullptr) return true;
  if (store == nullptr || tables_on_device()) return false;
  std::vector<std::string> tables;
  for (int i = 0; i < num_layers(); ++i) {
    tables.push_back(options_.weight_tables[i]);
    tables.push_back(options_.bias_tables[i]);
  }
  std::unique_ptr<common::LentBuffer> lent = store->LendPushBuffer(tables);
  if (lent == nullptr || lent->num_tables() != tables.size()) return false;
  std::unique_ptr<common::LentBuffer> spare;
  if (has_spare_) {
    spare = store->LendPushBuffer(tables);
    if (spare == nullptr || spare->num_tables() != tables.size()) return false;
  }
  // Every table's size checked before any layer's offsets change (a store that lent something
  // else changes nothing).
  for (const common::LentBuffer* buffer : {lent.get(), spare.get()}) {
    if (buffer == nullptr) continue;
    for (int i = 0; i < num_layers(); ++i) {
      const Layer& layer = layers_[i];
      if (buffer->table(2 * i).size() != static_cast<size_t>(int64_t{layer.in} * layer.out) ||
          buffer->table(2 * i + 1).size() != static_cast<size_t>(layer.out) ||
          buffer->table(2 * i).data() - buffer->values().data() !=
              lent->table(2 * i).data() - lent->values().data()) {
        return false;
      }
    }
  }
  if (!SharesHostMemory(*backend_)) {
    // The device copies the gradients into the lent memory: registered, so that the copy runs
    // at the bus's speed (unregistered memory goes through the driver's staging buffer, the
    // copy the lend is there to save). Registered ranges may not share a page: the two sets'
    // buffers are one range where their pages meet, two otherwise (a range over the segment
    // between them would make its untouched pages resident).
    std::vector<std::pair<char*, char*>> ranges;
    for (const common::LentBuffer* buffer : {lent.get(), spare.get()}) {
      if (buffer == nullptr) continue;
      char* begin = reinterpret_cast<char*>(buffer->values().data());
      ranges.emplace_back(begin, begin + buffer->values().size() * sizeof(float));
    }
    std::sort(ranges.begin(), ranges.end());
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    auto page_of = [page](const char* p) { return reinterpret_cast<uintptr_t>(p) / page; };
    if (ranges.size() == 2 && page_of(ranges[1].first) <= page_of(ranges[0].second - 1)) {
      ranges = {{ranges[0].first, std::max(ranges[0].second, ranges[1].second)}};
    }
    for (const auto& [begin, end] : ranges) {
      if (absl::Status s = backend_->RegisterHost(begin, static_cast<size_t>(end - begin));
          !s.ok()) {
        LOG(WARNING) << "gradients not lent: the lent memory could not be registered with the "
                     << "device: " << s;
        for (void* done : registered_) backend_->UnregisterHost(done);
        registered_.clear();
        return false;
      }
      registered_.push_back(begin);
    }
  }
  const float* base = lent->values().data();
  for (int i = 0; i < num_layers(); ++i) {
    layers_[i].grad_weight_offset = lent->table(2 * i).data() - base;
    layers_[i].grad_bias_offset = lent->table(2 * i + 1).data() - base;
  }
  lent_ = std::move(lent);
  spare_lent_ = std::move(spare);
  return true;
}

absl::StatusOr<float*> DenseStack::Forward(int64_t rows, const float* x) {
  RETURN_IF_ERROR(CheckRows(rows));
  if (!deferred_error_.ok()) return std::exchange(deferred_error_, absl::OkStatus());
  if (!params_on_device_) {
    RETURN_IF_ERROR(params_.CopyToDeviceAsync(num_params_));
    params_on_device_ = true;
    params_copy_pending_ = !SharesHostMemory(*backend_);
  }
  absl::StatusOr<float*> out = ForwardLayers(rows, x);
  if (!out.ok()) EndParameterCopy().IgnoreError();  // the error returned is the layers'
  return out;
}

absl::StatusOr<float*> DenseStack::ForwardLayers(int64_t rows, const float* x) {
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

void DenseStack::StopLending() {
  for (Layer& layer : layers_) {
    layer.grad_weight_offset = layer.weight_offset;
    layer.grad_bias_offset = layer.bias_offset;
  }
  // Their ranges are unregistered now, not with the stack: the device copies nothing more into
  // them (Backward's copy there has waited), and a range left registered would make the driver
  // refuse the buffers of a new lend that share one of its pages (an arena carves them next).
  for (void* range : registered_) backend_->UnregisterHost(range);
  registered_.clear();
  revoked_.push_back(std::move(lent_));
  if (spare_lent_ != nullptr) revoked_.push_back(std::move(spare_lent_));
}

absl::Status DenseStack::Backward(int64_t rows, const float* x, float* d_output, float* dx) {
  RETURN_IF_ERROR(CheckRows(rows));
  if (lent_ != nullptr &&
      (lent_->revoked() || (spare_lent_ != nullptr && spare_lent_->revoked()))) {
    StopLending();
  }
  const int m = static_cast<int>(rows);
  // dz is the gradient w.r.t. layer i's pre-activation output. Layer i writes the gradient
  // w.r.t. its input into hidden_grad_[i % 2], which is never the buffer dz points at
  // (hidden_grad_[(i + 1) % 2] or d_output), as Gemm forbids aliasing.
  float* dz = d_output;
  for (int i = num_layers() - 1; i >= 0; --i) {
    const Layer& layer = layers_[i];
    const float* input = i == 0 ? x : layers_[i - 1].output.floats();
    float* dw = grads() + layer.grad_weight_offset;
    // dW = input^T * dz  ([in, rows] x [rows, out]).
    RETURN_IF_ERROR(backend_->Gemm(true, false, layer.in, layer.out, m, 1.f, input, layer.in, dz,
                                   layer.out, 0.f, dw, layer.out));
    RETURN_IF_ERROR(backend_->BiasGrad(rows, layer.out, dz, grads() + layer.grad_bias_offset));
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
  if (tables_on_device()) return ApplyOnDevice();
  if (SharesHostMemory(*backend_)) {
    return lent_ == nullptr ? grads_.CopyToHost(num_params_)  // a no-op: the same memory
                            : absl::OkStatus();               // written where the host reads them
  }
  // The copy waits for the device, which ends the parameters' copy of Forward too. Laid out as
  // the lent memory (grad_*_offset), one copy puts every table in its place there.
  return EndedParameterCopy(lent_ == nullptr
                                ? grads_.CopyToHost(num_params_)
                                : backend_->CopyToHost(lent_->values().data(), grads_.device(),
                                                       lent_->values().size() * sizeof(float)));
}

absl::Span<const float> DenseStack::weight(int i) const {
  const Layer& layer = layers_.at(i);
  return absl::MakeConstSpan(params_.host() + layer.weight_offset, int64_t{layer.in} * layer.out);
}

absl::Span<const float> DenseStack::bias(int i) const {
  const Layer& layer = layers_.at(i);
  return absl::MakeConstSpan(params_.host() + layer.bias_offset, static_cast<size_t>(layer.out));
}

absl::Status DenseStack::CopyParametersToHost() {
  if (!params_on_device_) return absl::OkStatus();  // the host side is the newer one
  return params_.CopyToHost(num_params_);
}

absl::Status DenseStack::KeepOnDevice(const DeviceTableOptions& options,
                                      common::ParameterStore* store) {
  if (tables_on_device()) {
    return absl::FailedPreconditionError("DenseStack: the tables are on the device already");
  }
  if (has_spare_) {
    return absl::FailedPreconditionError(
        "DenseStack: the tables cannot move to the device with a second buffer set");
  }
  if (lent_ != nullptr) {
    return absl::FailedPreconditionError(
        "DenseStack: the tables cannot move to the device once the gradients are lent");
  }
  if (options.block_floats < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("DenseStack: block_floats = ", options.block_floats, " is not >= 1"));
  }
  std::vector<DeviceTable> tables;
  for (int i = 0; i < num_layers(); ++i) {
    const Layer& layer = layers_[i];
    tables.push_back(
        {options_.weight_tables[i], layer.weight_offset, int64_t{layer.in} * layer.out});
    tables.push_back({options_.bias_tables[i], layer.bias_offset, layer.out});
  }
  for (DeviceTable& table : tables) {
    const auto it = options.optimizers.find(table.name);
    if (it == options.optimizers.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("DenseStack: no optimizer for table '", table.name, "'"));
    }
    table.optimizer = it->second;
    RETURN_IF_ERROR_CTX(kernels::ValidateOptimizerParams(table.optimizer),
                        absl::StrCat("DenseStack: table '", table.name, "'"));
    const int slots = kernels::NumSlots(table.optimizer.kind);
    ASSIGN_OR_RETURN(table.slots, backend_->AllocateFloats(table.n * slots));
    for (int s = 0; s < slots; ++s) {
      RETURN_IF_ERROR(backend_->Fill(table.slots.floats() + s * table.n, table.n,
                                     kernels::SlotInitialValue(table.optimizer, s)));
    }
  }
  common::PullBatch pull;
  AddPulls(&pull);
  RETURN_IF_ERROR(store->Pull(pull, common::PullOptions{}));
  RETURN_IF_ERROR(params_.CopyToDevice(num_params_));
  params_on_device_ = true;
  block_floats_ = options.block_floats;
  reject_nonfinite_ = options.reject_nonfinite;
  device_tables_ = std::move(tables);
  return absl::OkStatus();
}

absl::Status DenseStack::ApplyOnDevice() {
  const float* grads = grads_.device();
  if (reject_nonfinite_) {
    ASSIGN_OR_RETURN(const int64_t bad, backend_->CountNonFinite(num_params_, grads));
    if (bad > 0) {
      // Which tables, for the message: only on this path, where the step fails anyway.
      std::string where;
      for (const DeviceTable& table : device_tables_) {
        ASSIGN_OR_RETURN(const int64_t in_table,
                         backend_->CountNonFinite(table.n, grads + table.offset));
        if (in_table > 0) {
          absl::StrAppend(&where, where.empty() ? "" : ", ", "'", table.name, "' ", in_table);
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat(bad, " non-finite gradient values (tables on the device: ", where,
                       "); no table was updated"));
    }
  }
  for (DeviceTable& table : device_tables_) {
    ++table.step;
    const int slots = kernels::NumSlots(table.optimizer.kind);
    // Without clip_norm every rule is elementwise, so one call over the table is the same as
    // one per block; clip_norm's norm is a block's, as on a server.
    const int64_t piece = table.optimizer.clip_norm > 0 ? block_floats_ : table.n;
    for (int64_t begin = 0; begin < table.n; begin += piece) {
      const int64_t n = std::min(piece, table.n - begin);
      float* slot_pointers[2] = {nullptr, nullptr};
      for (int s = 0; s < slots; ++s) slot_pointers[s] = table.slots.floats() + s * table.n + begin;
      RETURN_IF_ERROR(backend_->ApplyOptimizer(
          table.optimizer, table.step, n, params_.device() + table.offset + begin,
          grads + table.offset + begin, absl::MakeConstSpan(slot_pointers, slots)));
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::worker
