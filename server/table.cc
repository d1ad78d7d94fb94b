#include "server/table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/initializer.h"
#include "glog/logging.h"

namespace ps::server {
namespace {

// Record value layouts (little-endian, host order on the supported x86-64/arm64 hosts):
//   dense block: [int64 step][float data[block_size * (1 + slots)]]
//   sparse rows: repeated [uint64 key][int64 step][float row[dim * (1 + slots)]]
void AppendRaw(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}

template <typename T>
T LoadRaw(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A restored step (updates applied to a block or row) must be one that updates can continue
// from: the optimizers need step >= 1 after the increment, and 2^62 updates would take over a
// century at 10^9 a second, so anything larger is corrupt and stays far from overflowing ++step.
bool ValidStep(int64_t step) { return step >= 0 && step <= (int64_t{1} << 62); }

// One update of `n` parameters at `data` (slots follow at data + n * (i + 1)).
void ApplyTo(const kernels::OptimizerParams& opt, int num_slots, int64_t step, float* data,
             size_t n, absl::Span<const float> values, const UpdateOptions& options) {
  absl::Span<float> params(data, n);
  if (options.kind == UpdateKind::kDelta) {
    kernels::ApplyDelta(options.delta_scale, params, values);
    return;
  }
  float* slots[4];
  for (int i = 0; i < num_slots; ++i) slots[i] = data + n * (i + 1);
  kernels::ApplyOptimizer(opt, step, params, values,
                          absl::Span<float* const>(slots, num_slots));
}

}  // namespace

// ---- TablePart --------------------------------------------------------------------------

TablePart::TablePart(const common::TableInfo& info, const kernels::OptimizerParams& optimizer)
    : info_(info), optimizer_(optimizer), num_slots_(kernels::NumSlots(optimizer.kind)) {
  CHECK_LE(num_slots_, 4);
}

uint64_t TablePart::updates_applied() const {
  absl::MutexLock lock(&counter_mu_);
  return updates_applied_;
}

void TablePart::CountUpdate() {
  absl::MutexLock lock(&counter_mu_);
  ++updates_applied_;
}

// ---- DenseTablePart ---------------------------------------------------------------------

DenseTablePart::DenseTablePart(const common::TableInfo& info,
                               const kernels::OptimizerParams& optimizer,
                               const common::Partitioner& partitioner, uint32_t server_index)
    : TablePart(info, optimizer) {
  block_ids_ = partitioner.BlocksOnServer(info, server_index);
  blocks_.reserve(block_ids_.size());
  const common::Fans fans = common::ComputeFans(*info.config);
  for (uint32_t id : block_ids_) {
    auto [begin, end] = partitioner.BlockRange(info, id);
    const size_t n = end - begin;
    auto block = std::make_unique<Block>(n);
    {
      absl::MutexLock lock(&block->mu);
      block->data.resize(n * (1 + num_slots_));
      common::InitializeValues(info.config->initializer(), info.name, fans.in, fans.out, begin,
                               absl::Span<float>(block->data.data(), n));
      for (int s = 0; s < num_slots_; ++s) {
        std::fill_n(block->data.data() + n * (s + 1), n,
                    kernels::SlotInitialValue(optimizer_, s));
      }
    }
    bytes_ += n * (1 + num_slots_) * sizeof(float);
    position_[id] = blocks_.size();
    blocks_.push_back(std::move(block));
  }
}

DenseTablePart::Block* DenseTablePart::Find(uint32_t block) const {
  auto it = position_.find(block);
  return it == position_.end() ? nullptr : blocks_[it->second].get();
}

bool DenseTablePart::Owns(uint32_t block) const { return position_.contains(block); }

size_t DenseTablePart::BlockSize(uint32_t block) const {
  Block* b = Find(block);
  CHECK(b != nullptr) << "block " << block << " of " << name() << " not owned";
  return b->size;
}

void DenseTablePart::Read(uint32_t block, absl::Span<float> out) const {
  Block* b = Find(block);
  CHECK(b != nullptr && out.size() == b->size);
  absl::ReaderMutexLock lock(&b->mu);
  std::memcpy(out.data(), b->data.data(), b->size * sizeof(float));
}

void DenseTablePart::Apply(uint32_t block, absl::Span<const float> values,
                           const UpdateOptions& options) {
  Block* b = Find(block);
  CHECK(b != nullptr && values.size() == b->size);
  {
    absl::MutexLock lock(&b->mu);
    const uint64_t epoch = active_epoch_.load(std::memory_order_acquire);
    if (epoch != 0 && b->saved_epoch < epoch) {
      // First change since the snapshot began, and the writer has not saved this block yet:
      // save its old contents now (write-through; no copy of the table is kept).
      b->saved_epoch = epoch;
      absl::Status s = (*sink_)(BlockKey(block), EncodeBlock(b->step, b->data));
      if (!s.ok()) RecordSinkError(s);
    }
    const int64_t step = options.kind == UpdateKind::kGradient ? ++b->step : b->step;
    ApplyTo(optimizer_, num_slots_, step, b->data.data(), b->size, values, options);
  }
  CountUpdate();
}

absl::string_view DenseTablePart::EncodeBlock(int64_t step, absl::Span<const float> data) {
  // One buffer per thread, reused for every block it saves: snapshots of large tables would
  // otherwise allocate and free a block-sized string per block, which fragments the heap.
  // The view is valid until this thread encodes the next block.
  thread_local std::string out;
  out.clear();
  AppendRaw(&out, &step, sizeof(step));
  AppendRaw(&out, data.data(), data.size() * sizeof(float));
  return out;
}

std::string DenseTablePart::BlockKey(uint32_t id) {
  const char key[4] = {static_cast<char>(id >> 24), static_cast<char>(id >> 16),
                       static_cast<char>(id >> 8), static_cast<char>(id)};
  return std::string(key, 4);
}

void DenseTablePart::RecordSinkError(const absl::Status& status) {
  absl::MutexLock lock(&error_mu_);
  if (sink_error_.ok()) sink_error_ = status;
}

void DenseTablePart::BeginSnapshot(uint64_t epoch, const SnapshotSink* sink) {
  CHECK_GT(epoch, 0u);
  sink_ = sink;
  {
    absl::MutexLock lock(&error_mu_);
    sink_error_ = absl::OkStatus();
  }
  active_epoch_.store(epoch, std::memory_order_release);
}

absl::Status DenseTablePart::WriteSnapshot(size_t /*record_bytes*/) {
  const uint64_t epoch = active_epoch_.load(std::memory_order_acquire);
  CHECK_NE(epoch, 0u) << "WriteSnapshot without BeginSnapshot";
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block* b = blocks_[i].get();
    absl::string_view value;
    {
      absl::MutexLock lock(&b->mu);
      if (b->saved_epoch >= epoch) continue;  // saved by an update already
      value = EncodeBlock(b->step, b->data);
      b->saved_epoch = epoch;
    }
    // One record per block: blocks are a few hundred KB, the size records should have.
    absl::Status s = (*sink_)(BlockKey(block_ids_[i]), value);
    if (!s.ok()) RecordSinkError(s);
  }
  absl::MutexLock lock(&error_mu_);
  return sink_error_;
}

void DenseTablePart::EndSnapshot() {
  active_epoch_.store(0, std::memory_order_release);
  sink_ = nullptr;
}

absl::Status DenseTablePart::RestoreRecord(absl::string_view key, absl::string_view value) {
  if (key.size() != 4) {
    return absl::DataLossError(absl::StrCat("table '", name(), "': bad block record key"));
  }
  const uint32_t id = (uint32_t{static_cast<uint8_t>(key[0])} << 24) |
                      (uint32_t{static_cast<uint8_t>(key[1])} << 16) |
                      (uint32_t{static_cast<uint8_t>(key[2])} << 8) |
                      uint32_t{static_cast<uint8_t>(key[3])};
  Block* b = Find(id);
  if (b == nullptr) {
    return absl::DataLossError(absl::StrCat("table '", name(), "' block ", id,
                                            ": in the checkpoint but not owned by this server"));
  }
  const size_t want = sizeof(int64_t) + b->size * (1 + num_slots_) * sizeof(float);
  if (value.size() != want) {
    return absl::DataLossError(absl::StrCat("table '", name(), "' block ", id, ": record has ",
                                            value.size(), " bytes, expected ", want));
  }
  const int64_t step = LoadRaw<int64_t>(value.data());
  if (!ValidStep(step)) {
    return absl::DataLossError(
        absl::StrCat("table '", name(), "' block ", id, ": record has step ", step));
  }
  absl::MutexLock lock(&b->mu);
  b->step = step;
  std::memcpy(b->data.data(), value.data() + sizeof(int64_t), value.size() - sizeof(int64_t));
  return absl::OkStatus();
}

// ---- SparseTablePart --------------------------------------------------------------------

SparseTablePart::SparseTablePart(const common::TableInfo& info,
                                 const kernels::OptimizerParams& optimizer)
    : TablePart(info, optimizer),
      dim_(info.dim),
      row_floats_(info.dim * (1 + num_slots_)),
      stripes_(new Stripe[kNumStripes]) {
  slot_init_.resize(row_floats_ - dim_);
  for (int s = 0; s < num_slots_; ++s) {
    std::fill_n(slot_init_.data() + dim_ * s, dim_, kernels::SlotInitialValue(optimizer_, s));
  }
}

int SparseTablePart::StripeOf(uint64_t key) {
  // The top bits: the Partitioner uses Mix64(key) modulo small numbers, so the low bits are
  // correlated with the server; the high byte is not.
  return static_cast<int>(common::Mix64(key) >> 56);
}

float* SparseTablePart::RowPtr(Stripe& s, uint32_t slot) const {
  return s.chunks[slot / kRowsPerChunk].get() + size_t{slot % kRowsPerChunk} * row_floats_;
}

uint32_t SparseTablePart::AddRow(Stripe& s, uint64_t key) {
  const uint32_t slot = static_cast<uint32_t>(s.keys.size());
  if (slot % kRowsPerChunk == 0) {
    s.chunks.emplace_back(new float[kRowsPerChunk * row_floats_]);
  }
  s.keys.push_back(key);
  s.steps.push_back(0);
  // A row created while a snapshot runs is not part of it.
  s.saved_epoch.push_back(active_epoch_.load(std::memory_order_acquire));
  s.index.emplace(key, slot);
  return slot;
}

uint32_t SparseTablePart::FindOrCreate(Stripe& s, uint64_t key) {
  auto it = s.index.find(key);
  if (it != s.index.end()) return it->second;
  const uint32_t slot = AddRow(s, key);
  float* row = RowPtr(s, slot);
  common::InitializeSparseRow(info_.config->initializer(), info_.name, key,
                              absl::Span<float>(row, dim_));
  std::copy(slot_init_.begin(), slot_init_.end(), row + dim_);
  return slot;
}

void SparseTablePart::Read(absl::Span<const uint64_t> keys, absl::Span<float> out) {
  CHECK_EQ(out.size(), keys.size() * dim_);
  for (size_t i = 0; i < keys.size(); ++i) {
    Stripe& s = stripes_[StripeOf(keys[i])];
    absl::MutexLock lock(&s.mu);
    const uint32_t slot = FindOrCreate(s, keys[i]);
    std::memcpy(out.data() + i * dim_, RowPtr(s, slot), dim_ * sizeof(float));
  }
}

void SparseTablePart::Apply(absl::Span<const uint64_t> keys, absl::Span<const float> values,
                            const UpdateOptions& options) {
  CHECK_EQ(values.size(), keys.size() * dim_);
  for (size_t i = 0; i < keys.size(); ++i) {
    Stripe& s = stripes_[StripeOf(keys[i])];
    absl::MutexLock lock(&s.mu);
    const uint32_t slot = FindOrCreate(s, keys[i]);
    float* row = RowPtr(s, slot);
    const uint64_t epoch = active_epoch_.load(std::memory_order_acquire);
    if (epoch != 0 && s.saved_epoch[slot] < epoch) {
      s.pending.emplace(keys[i], std::make_pair(s.steps[slot],
                                                std::vector<float>(row, row + row_floats_)));
      s.saved_epoch[slot] = epoch;
    }
    const int64_t step =
        options.kind == UpdateKind::kGradient ? ++s.steps[slot] : s.steps[slot];
    ApplyTo(optimizer_, num_slots_, step, row, dim_, values.subspan(i * dim_, dim_), options);
  }
  CountUpdate();
}

uint64_t SparseTablePart::NumRows() const {
  uint64_t n = 0;
  for (int i = 0; i < kNumStripes; ++i) {
    absl::MutexLock lock(&stripes_[i].mu);
    n += stripes_[i].keys.size();
  }
  return n;
}

uint64_t SparseTablePart::NumBytes() const { return NumRows() * row_floats_ * sizeof(float); }

void SparseTablePart::BeginSnapshot(uint64_t epoch, const SnapshotSink* sink) {
  CHECK_GT(epoch, 0u);
  sink_ = sink;
  active_epoch_.store(epoch, std::memory_order_release);
}

absl::Status SparseTablePart::WriteSnapshot(size_t record_bytes) {
  const SnapshotSink& sink = *sink_;
  const uint64_t epoch = active_epoch_.load(std::memory_order_acquire);
  CHECK_NE(epoch, 0u) << "WriteSnapshot without BeginSnapshot";
  const size_t entry_bytes = 2 * sizeof(uint64_t) + row_floats_ * sizeof(float);
  for (int i = 0; i < kNumStripes; ++i) {
    Stripe& s = stripes_[i];
    std::vector<std::string> records(1);
    auto add = [&](uint64_t key, int64_t step, const float* row) {
      if (records.back().size() + entry_bytes > record_bytes && !records.back().empty()) {
        records.emplace_back();
      }
      std::string& r = records.back();
      AppendRaw(&r, &key, sizeof(key));
      AppendRaw(&r, &step, sizeof(step));
      AppendRaw(&r, row, row_floats_ * sizeof(float));
    };
    {
      // Serialize the stripe under its lock, write outside it so pulls are not held up by I/O.
      absl::MutexLock lock(&s.mu);
      for (uint32_t slot = 0; slot < s.keys.size(); ++slot) {
        if (s.saved_epoch[slot] < epoch) {
          add(s.keys[slot], s.steps[slot], RowPtr(s, slot));
          s.saved_epoch[slot] = epoch;
        }
      }
      for (const auto& [key, copy] : s.pending) add(key, copy.first, copy.second.data());
      s.pending.clear();
    }
    for (size_t r = 0; r < records.size(); ++r) {
      if (records[r].empty()) continue;
      char key[8] = {static_cast<char>(i >> 8), static_cast<char>(i),
                     static_cast<char>(r >> 40), static_cast<char>(r >> 32),
                     static_cast<char>(r >> 24), static_cast<char>(r >> 16),
                     static_cast<char>(r >> 8),  static_cast<char>(r)};
      absl::Status st = sink(absl::string_view(key, 8), records[r]);
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

void SparseTablePart::EndSnapshot() {
  active_epoch_.store(0, std::memory_order_release);
  sink_ = nullptr;
  for (int i = 0; i < kNumStripes; ++i) {
    absl::MutexLock lock(&stripes_[i].mu);
    stripes_[i].pending.clear();
  }
}

absl::Status SparseTablePart::RestoreRecord(absl::string_view key, absl::string_view value) {
  const size_t entry_bytes = 2 * sizeof(uint64_t) + row_floats_ * sizeof(float);
  if (key.size() != 8 || value.size() % entry_bytes != 0) {
    return absl::DataLossError(absl::StrCat("table '", name(), "': sparse record of ",
                                            value.size(), " bytes is not a multiple of ",
                                            entry_bytes));
  }
  // Check every row before changing any: a record that does not fit changes nothing.
  for (size_t off = 0; off < value.size(); off += entry_bytes) {
    const int64_t step = LoadRaw<int64_t>(value.data() + off + 8);
    if (!ValidStep(step)) {
      return absl::DataLossError(absl::StrCat("table '", name(), "' key ",
                                              LoadRaw<uint64_t>(value.data() + off),
                                              ": record has step ", step));
    }
  }
  for (size_t off = 0; off < value.size(); off += entry_bytes) {
    const uint64_t k = LoadRaw<uint64_t>(value.data() + off);
    const int64_t step = LoadRaw<int64_t>(value.data() + off + 8);
    Stripe& s = stripes_[StripeOf(k)];
    absl::MutexLock lock(&s.mu);
    auto it = s.index.find(k);
    const uint32_t slot = it != s.index.end() ? it->second : AddRow(s, k);
    s.steps[slot] = step;
    std::memcpy(RowPtr(s, slot), value.data() + off + 16, row_floats_ * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace ps::server
