#include "server/table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/initializer.h"
#include "common/status_macros.h"
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
//
// Snapshot record keys of a sparse table (8 bytes; RestoreRecord reads only the values):
//   [0][stripe][record number, 6 bytes]   rows in memory at the cut and rows copied aside
//   [1][0][record number, 6 bytes]        rows that were in the spill table at the cut
// A row in the spill table is a record entry without its key: [int64 step][float row].

namespace {

// Flags of a row in memory (spilling tables): a copy of it is in the spill table (kOnDisk), and
// it changed since it was last written there or created (kDirty).
constexpr uint8_t kOnDisk = 1;
constexpr uint8_t kDirty = 2;

// Rows sampled to pick an eviction victim, and the LFU aging period in multiples of a stripe's
// budget (uses are halved that often): tools/eviction_sim measured these on Zipf keys.
constexpr int kVictimSamples = 16;
constexpr uint64_t kAgingPeriod = 20;

std::string SparseRecordKey(uint8_t kind, uint8_t group, uint64_t r) {
  const char key[8] = {static_cast<char>(kind),   static_cast<char>(group),
                       static_cast<char>(r >> 40), static_cast<char>(r >> 32),
                       static_cast<char>(r >> 24), static_cast<char>(r >> 16),
                       static_cast<char>(r >> 8),  static_cast<char>(r)};
  return std::string(key, 8);
}

// Rows per arena chunk: 1024 without a budget; with one, about a stripe's share of the budget,
// so that small budgets do not allocate far more memory than they allow.
uint32_t RowsPerChunk(bool spills, uint64_t budget_rows) {
  if (!spills) return 1024;
  const uint64_t share = budget_rows / SparseTablePart::kNumStripes + 1;
  return static_cast<uint32_t>(std::clamp<uint64_t>(share, 16, 1024));
}

}  // namespace

SparseTablePart::SparseTablePart(const common::TableInfo& info,
                                 const kernels::OptimizerParams& optimizer,
                                 storage::SpillTable* spill, uint64_t budget_rows)
    : TablePart(info, optimizer),
      dim_(info.dim),
      row_floats_(info.dim * (1 + num_slots_)),
      spill_(budget_rows > 0 ? spill : nullptr),
      budget_rows_(spill != nullptr ? budget_rows : 0),
      rows_per_chunk_(RowsPerChunk(spill_ != nullptr, budget_rows_)),
      stripes_(new Stripe[kNumStripes]) {
  slot_init_.resize(row_floats_ - dim_);
  for (int s = 0; s < num_slots_; ++s) {
    std::fill_n(slot_init_.data() + dim_ * s, dim_, kernels::SlotInitialValue(optimizer_, s));
  }
  if (spills()) {
    for (int i = 0; i < kNumStripes; ++i) {
      Stripe& s = stripes_[i];
      s.budget = budget_rows_ / kNumStripes +
                 (static_cast<uint64_t>(i) < budget_rows_ % kNumStripes ? 1 : 0);
      absl::MutexLock lock(&s.mu);
      s.random = common::Mix64(static_cast<uint64_t>(i) + 1) | 1;
    }
  }
}

int SparseTablePart::StripeOf(uint64_t key) {
  // The top bits: the Partitioner uses Mix64(key) modulo small numbers, so the low bits are
  // correlated with the server; the high byte is not.
  return static_cast<int>(common::Mix64(key) >> 56);
}

float* SparseTablePart::RowPtr(Stripe& s, uint32_t slot) const {
  return s.chunks[slot / rows_per_chunk_].get() + size_t{slot % rows_per_chunk_} * row_floats_;
}

uint32_t SparseTablePart::AddRow(Stripe& s, uint64_t key) {
  const uint32_t slot = static_cast<uint32_t>(s.keys.size());
  if (slot / rows_per_chunk_ >= s.chunks.size()) {
    s.chunks.emplace_back(new float[size_t{rows_per_chunk_} * row_floats_]);
  }
  s.keys.push_back(key);
  s.steps.push_back(0);
  // A row created while a snapshot runs is not part of it; a row faulted in while one runs
  // was saved already (see the class comment).
  s.saved_epoch.push_back(active_epoch_.load(std::memory_order_acquire));
  if (spills()) {
    s.uses.push_back(0);
    s.pins.push_back(0);
    s.flags.push_back(kDirty);  // a new row; FindOrFault clears it for a row read back
  }
  s.index.emplace(key, slot);
  Recount(s);
  return slot;
}

int64_t SparseTablePart::StripeBytes(const Stripe& s) const {
  // flat_hash_map: one slot (key, value pair) and one control byte per capacity entry.
  using Entry = std::pair<const uint64_t, uint32_t>;
  const size_t index = s.index.capacity() * (sizeof(Entry) + 1);
  const size_t per_row = s.keys.capacity() * sizeof(uint64_t) +
                         s.steps.capacity() * sizeof(int64_t) +
                         s.saved_epoch.capacity() * sizeof(uint64_t) +
                         s.uses.capacity() * sizeof(uint16_t) +
                         s.pins.capacity() * sizeof(uint32_t) + s.flags.capacity();
  const size_t chunks = s.chunks.capacity() * sizeof(s.chunks[0]) +
                        s.chunks.size() * size_t{rows_per_chunk_} * row_floats_ * sizeof(float);
  return static_cast<int64_t>(index + per_row + chunks);
}

void SparseTablePart::Recount(Stripe& s) {
  const int64_t now = StripeBytes(s);
  const int64_t delta = now - s.bytes;
  if (delta == 0) return;
  s.bytes = now;
  bytes_.fetch_add(delta, std::memory_order_relaxed);
  if (memory_ != nullptr) memory_->Add(delta);
}

uint64_t SparseTablePart::RowCost() const {
  // Index entry at a typical load, keys/steps/saved_epoch entries, the row itself.
  constexpr uint64_t kPerRow = 2 * (sizeof(uint64_t) + sizeof(uint32_t) + 1) + 3 * 8;
  return row_floats_ * sizeof(float) + kPerRow;
}

absl::Status SparseTablePart::CheckRoomForNewRows(absl::Span<const uint64_t> keys) const {
  if (memory_ == nullptr || spills()) return absl::OkStatus();
  uint64_t missing = 0;
  for (uint64_t k : keys) {
    const Stripe& s = stripes_[StripeOf(k)];
    absl::MutexLock lock(&s.mu);
    if (!s.index.contains(k)) ++missing;
  }
  if (missing == 0) return absl::OkStatus();
  return memory_->CheckRoom(missing * RowCost(),
                            absl::StrCat("table '", name(), "': ", missing, " new rows"));
}

void SparseTablePart::InitRow(uint64_t key, float* row) const {
  common::InitializeSparseRow(info_.config->initializer(), info_.name, key,
                              absl::Span<float>(row, dim_));
  std::copy(slot_init_.begin(), slot_init_.end(), row + dim_);
}

uint32_t SparseTablePart::FindOrCreate(Stripe& s, uint64_t key) {
  auto it = s.index.find(key);
  if (it != s.index.end()) return it->second;
  const uint32_t slot = AddRow(s, key);
  InitRow(key, RowPtr(s, slot));
  return slot;
}

void SparseTablePart::RemoveSlot(Stripe& s, uint32_t slot) {
  const uint32_t last = static_cast<uint32_t>(s.keys.size() - 1);
  s.index.erase(s.keys[slot]);
  if (slot != last) {
    std::memcpy(RowPtr(s, slot), RowPtr(s, last), row_floats_ * sizeof(float));
    s.keys[slot] = s.keys[last];
    s.steps[slot] = s.steps[last];
    s.saved_epoch[slot] = s.saved_epoch[last];
    s.uses[slot] = s.uses[last];
    s.pins[slot] = s.pins[last];
    s.flags[slot] = s.flags[last];
    s.index[s.keys[slot]] = slot;
  }
  s.keys.pop_back();
  s.steps.pop_back();
  s.saved_epoch.pop_back();
  s.uses.pop_back();
  s.pins.pop_back();
  s.flags.pop_back();
  // Give back chunks no longer needed, keeping one spare against churn at a boundary.
  const size_t needed = (s.keys.size() + rows_per_chunk_ - 1) / rows_per_chunk_;
  while (s.chunks.size() > needed + 1) s.chunks.pop_back();
  Recount(s);
}

// ---- Moves between memory and the spill table.

void SparseTablePart::Use(Stripe& s, uint32_t slot) {
  if (s.uses[slot] < UINT16_MAX) ++s.uses[slot];
  if (++s.uses_since_aging >= kAgingPeriod * std::max<uint64_t>(s.budget, 8)) {
    s.uses_since_aging = 0;
    for (uint16_t& u : s.uses) u >>= 1;
  }
}

int64_t SparseTablePart::PickVictim(Stripe& s) {
  const size_t n = s.keys.size();
  int64_t best = -1;
  auto consider = [&](size_t j) {
    if (s.pins[j] == 0 && (best < 0 || s.uses[j] < s.uses[best])) best = static_cast<int64_t>(j);
  };
  if (n <= kVictimSamples) {
    for (size_t j = 0; j < n; ++j) consider(j);
    return best;
  }
  for (int i = 0; i < kVictimSamples; ++i) {
    s.random ^= s.random << 13;
    s.random ^= s.random >> 7;
    s.random ^= s.random << 17;
    consider(s.random % n);
  }
  if (best >= 0) return best;
  // Every sample was pinned (a large push in flight): look at all rows.
  for (size_t j = 0; j < n; ++j) {
    if (s.pins[j] == 0) return static_cast<int64_t>(j);
  }
  return -1;
}

absl::Status SparseTablePart::Evict(Stripe& s, uint32_t slot) {
  const uint64_t key = s.keys[slot];
  const float* row = RowPtr(s, slot);
  const uint64_t epoch = active_epoch_.load(std::memory_order_acquire);
  if (epoch != 0 && s.saved_epoch[slot] < epoch) {
    // The snapshot in progress has not saved this row, and it will not find it in memory nor
    // in its view of the spill table: keep the value for the writer, as an update would.
    s.pending.emplace(key,
                      std::make_pair(s.steps[slot], std::vector<float>(row, row + row_floats_)));
    s.saved_epoch[slot] = epoch;
  }
  const uint8_t flags = s.flags[slot];
  if ((flags & kDirty) != 0 || (flags & kOnDisk) == 0) {
    thread_local std::string value;
    value.clear();
    AppendRaw(&value, &s.steps[slot], sizeof(int64_t));
    AppendRaw(&value, row, row_floats_ * sizeof(float));
    if (absl::Status st = spill_->Put(key, value); !st.ok()) {
      ++s.eviction_errors;
      return st;
    }
    ++s.writes;
    if ((flags & kOnDisk) == 0) ++s.on_disk;
  }
  // Otherwise the spill table's copy is this row as it is: nothing to write.
  if ((flags & kOnDisk) != 0) --s.resident_on_disk;
  RemoveSlot(s, slot);
  ++s.evictions;
  return absl::OkStatus();
}

absl::Status SparseTablePart::MakeRoom(Stripe& s) {
  // Room for one more row. A stripe whose share is 0 (budgets under kNumStripes rows) takes
  // the row over its share; Trim evicts it after use.
  while (s.keys.size() >= std::max<uint64_t>(s.budget, 1)) {
    const int64_t victim = PickVictim(s);
    if (victim < 0) return absl::OkStatus();  // all pinned: over the share until Unpin
    RETURN_IF_ERROR(Evict(s, static_cast<uint32_t>(victim)));
  }
  return absl::OkStatus();
}

void SparseTablePart::Trim(Stripe& s) {
  while (s.keys.size() > s.budget) {
    const int64_t victim = PickVictim(s);
    if (victim < 0) return;
    if (absl::Status st = Evict(s, static_cast<uint32_t>(victim)); !st.ok()) {
      LOG_EVERY_N(ERROR, 1000) << "table '" << name() << "': cannot spill a row (it stays in "
                               << "memory, over the budget; " << google::COUNTER
                               << " such errors so far in this process): " << st;
      return;
    }
  }
}

absl::StatusOr<uint32_t> SparseTablePart::FindOrFault(Stripe& s, uint64_t key) {
  if (auto it = s.index.find(key); it != s.index.end()) return it->second;
  RETURN_IF_ERROR(MakeRoom(s));
  thread_local std::string value;
  ASSIGN_OR_RETURN(const bool found, spill_->Get(key, &value));
  if (!found) {
    const uint32_t slot = AddRow(s, key);
    InitRow(key, RowPtr(s, slot));
    return slot;
  }
  const size_t want = sizeof(int64_t) + row_floats_ * sizeof(float);
  if (value.size() != want) {
    return absl::DataLossError(absl::StrCat("table '", name(), "' key ", key, ": spilled row of ",
                                            value.size(), " bytes, expected ", want));
  }
  const int64_t step = LoadRaw<int64_t>(value.data());
  if (!ValidStep(step)) {
    return absl::DataLossError(
        absl::StrCat("table '", name(), "' key ", key, ": spilled row has step ", step));
  }
  // The spill table keeps its copy: if the row is dropped again unchanged, nothing is written.
  const uint32_t slot = AddRow(s, key);
  s.steps[slot] = step;
  std::memcpy(RowPtr(s, slot), value.data() + sizeof(int64_t), row_floats_ * sizeof(float));
  s.flags[slot] = kOnDisk;
  ++s.resident_on_disk;
  ++s.faults;
  return slot;
}

// ---- Reads and updates.

absl::Status SparseTablePart::Read(absl::Span<const uint64_t> keys, absl::Span<float> out) {
  CHECK_EQ(out.size(), keys.size() * dim_);
  for (size_t i = 0; i < keys.size(); ++i) {
    Stripe& s = stripes_[StripeOf(keys[i])];
    float* dst = out.data() + i * dim_;
    if (!spills()) {
      absl::MutexLock lock(&s.mu);
      if (memory_ != nullptr && !s.index.contains(keys[i])) {
        RETURN_IF_ERROR(memory_->CheckRoom(
            RowCost(), absl::StrCat("table '", name(), "': a new row for key ", keys[i])));
      }
      std::memcpy(dst, RowPtr(s, FindOrCreate(s, keys[i])), dim_ * sizeof(float));
      continue;
    }
    {
      absl::MutexLock lock(&s.mu);
      if (auto it = s.index.find(keys[i]); it != s.index.end()) {
        std::memcpy(dst, RowPtr(s, it->second), dim_ * sizeof(float));
        Use(s, it->second);
        continue;
      }
    }
    // Not in memory: the row has to move, which needs move_mu_ (taken before the stripe).
    absl::ReaderMutexLock move(&move_mu_);
    absl::MutexLock lock(&s.mu);
    ASSIGN_OR_RETURN(const uint32_t slot, FindOrFault(s, keys[i]));
    std::memcpy(dst, RowPtr(s, slot), dim_ * sizeof(float));
    Use(s, slot);
    Trim(s);
  }
  return absl::OkStatus();
}

absl::Status SparseTablePart::Pin(absl::Span<const uint64_t> keys) {
  if (!spills()) return absl::OkStatus();
  absl::ReaderMutexLock move(&move_mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    Stripe& s = stripes_[StripeOf(keys[i])];
    absl::Status status;
    {
      absl::MutexLock lock(&s.mu);
      absl::StatusOr<uint32_t> slot = FindOrFault(s, keys[i]);
      if (slot.ok()) {
        ++s.pins[*slot];
        Use(s, *slot);
        continue;
      }
      status = slot.status();
    }
    UnpinHeld(keys.first(i));
    return status;
  }
  return absl::OkStatus();
}

void SparseTablePart::Unpin(absl::Span<const uint64_t> keys) {
  if (!spills()) return;
  absl::ReaderMutexLock move(&move_mu_);
  UnpinHeld(keys);
}

void SparseTablePart::UnpinHeld(absl::Span<const uint64_t> keys) {
  for (uint64_t key : keys) {
    Stripe& s = stripes_[StripeOf(key)];
    absl::MutexLock lock(&s.mu);
    auto it = s.index.find(key);
    CHECK(it != s.index.end() && s.pins[it->second] > 0)
        << "table '" << name() << "': Unpin of key " << key << " that is not pinned";
    --s.pins[it->second];
    Trim(s);
  }
}

void SparseTablePart::Apply(absl::Span<const uint64_t> keys, absl::Span<const float> values,
                            const UpdateOptions& options) {
  CHECK_EQ(values.size(), keys.size() * dim_);
  for (size_t i = 0; i < keys.size(); ++i) {
    Stripe& s = stripes_[StripeOf(keys[i])];
    absl::MutexLock lock(&s.mu);
    uint32_t slot;
    if (spills()) {
      auto it = s.index.find(keys[i]);
      CHECK(it != s.index.end()) << "table '" << name() << "': Apply to key " << keys[i]
                                 << " without Pin";
      slot = it->second;
      s.flags[slot] |= kDirty;
    } else {
      slot = FindOrCreate(s, keys[i]);
    }
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

SpillStats SparseTablePart::spill_stats() const {
  SpillStats st;
  for (int i = 0; i < kNumStripes; ++i) {
    absl::MutexLock lock(&stripes_[i].mu);
    st.resident_rows += stripes_[i].keys.size();
    st.spilled_rows += stripes_[i].on_disk - stripes_[i].resident_on_disk;
    st.faults += stripes_[i].faults;
    st.evictions += stripes_[i].evictions;
    st.writes += stripes_[i].writes;
    st.eviction_errors += stripes_[i].eviction_errors;
  }
  return st;
}

uint64_t SparseTablePart::NumRows() const {
  const SpillStats st = spill_stats();
  return st.resident_rows + st.spilled_rows;
}

uint64_t SparseTablePart::NumBytes() const {
  return static_cast<uint64_t>(std::max<int64_t>(0, bytes_.load(std::memory_order_relaxed)));
}

// ---- Snapshots and restore.

void SparseTablePart::BeginSnapshot(uint64_t epoch, const SnapshotSink* sink) {
  CHECK_GT(epoch, 0u);
  // No row moves while the cut is taken: memory and the spill table are cut at one instant.
  absl::WriterMutexLock move(&move_mu_);
  sink_ = sink;
  if (spills()) {
    spill_snapshot_ = spill_->Snapshot();
    in_memory_at_cut_.clear();
    for (int i = 0; i < kNumStripes; ++i) {
      Stripe& s = stripes_[i];
      absl::MutexLock lock(&s.mu);
      for (uint32_t slot = 0; slot < s.keys.size(); ++slot) {
        if ((s.flags[slot] & kOnDisk) != 0) in_memory_at_cut_.insert(s.keys[slot]);
      }
    }
  }
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
      absl::Status st = sink(SparseRecordKey(0, static_cast<uint8_t>(i), r), records[r]);
      if (!st.ok()) return st;
    }
  }
  if (spills()) RETURN_IF_ERROR(WriteSpilled(record_bytes));
  return absl::OkStatus();
}

absl::Status SparseTablePart::WriteSpilled(size_t record_bytes) {
  const size_t value_bytes = sizeof(int64_t) + row_floats_ * sizeof(float);
  const size_t entry_bytes = sizeof(uint64_t) + value_bytes;
  std::string record;
  uint64_t r = 0;
  auto flush = [&]() -> absl::Status {
    if (record.empty()) return absl::OkStatus();
    absl::Status st = (*sink_)(SparseRecordKey(1, 0, r++), record);
    record.clear();
    return st;
  };
  RETURN_IF_ERROR(spill_snapshot_->ForEach(
      [&](uint64_t key, absl::string_view value) -> absl::Status {
        // In memory at the cut: saved from there (this copy may be stale).
        if (in_memory_at_cut_.contains(key)) return absl::OkStatus();
        if (value.size() != value_bytes) {
          return absl::DataLossError(absl::StrCat("table '", name(), "' key ", key,
                                                  ": spilled row of ", value.size(),
                                                  " bytes, expected ", value_bytes));
        }
        if (!record.empty() && record.size() + entry_bytes > record_bytes) {
          RETURN_IF_ERROR(flush());
        }
        AppendRaw(&record, &key, sizeof(key));
        record.append(value.data(), value.size());
        return absl::OkStatus();
      }));
  return flush();
}

void SparseTablePart::EndSnapshot() {
  // Exclusive, so that no eviction copies a row aside for this snapshot after it is over.
  absl::WriterMutexLock move(&move_mu_);
  active_epoch_.store(0, std::memory_order_release);
  sink_ = nullptr;
  spill_snapshot_.reset();
  in_memory_at_cut_.clear();
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
    const uint64_t key = LoadRaw<uint64_t>(value.data() + off);
    if (owns_key_ && !owns_key_(key)) {
      return absl::DataLossError(absl::StrCat("table '", name(), "' key ", key,
                                              ": the record holds a key of another server"));
    }
    const int64_t step = LoadRaw<int64_t>(value.data() + off + 8);
    if (!ValidStep(step)) {
      return absl::DataLossError(absl::StrCat("table '", name(), "' key ",
                                              LoadRaw<uint64_t>(value.data() + off),
                                              ": record has step ", step));
    }
  }
  if (!spills()) {
    for (size_t off = 0; off < value.size(); off += entry_bytes) {
      const uint64_t k = LoadRaw<uint64_t>(value.data() + off);
      Stripe& s = stripes_[StripeOf(k)];
      absl::MutexLock lock(&s.mu);
      auto it = s.index.find(k);
      const uint32_t slot = it != s.index.end() ? it->second : AddRow(s, k);
      s.steps[slot] = LoadRaw<int64_t>(value.data() + off + 8);
      std::memcpy(RowPtr(s, slot), value.data() + off + 16, row_floats_ * sizeof(float));
    }
    return absl::OkStatus();
  }
  // Spilling: rows beyond the budget go to the spill table as they are restored (a spill
  // error may leave the record half restored; the restore fails as a whole then).
  absl::ReaderMutexLock move(&move_mu_);
  for (size_t off = 0; off < value.size(); off += entry_bytes) {
    const uint64_t k = LoadRaw<uint64_t>(value.data() + off);
    Stripe& s = stripes_[StripeOf(k)];
    absl::MutexLock lock(&s.mu);
    ASSIGN_OR_RETURN(const uint32_t slot, FindOrFault(s, k));
    s.steps[slot] = LoadRaw<int64_t>(value.data() + off + 8);
    std::memcpy(RowPtr(s, slot), value.data() + off + 16, row_floats_ * sizeof(float));
    s.flags[slot] |= kDirty;
    Trim(s);
  }
  return absl::OkStatus();
}

}  // namespace ps::server
