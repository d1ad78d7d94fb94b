// DenseTablePart: blocks, their updates, their snapshot records and restore.
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/initializer.h"
#include "common/status_macros.h"
#include "common/stream_copy.h"
#include "glog/logging.h"
#include "server/table.h"
#include "server/table_internal.h"

namespace ps::server {

using internal::AppendRaw;
using internal::ApplyTo;
using internal::LoadRaw;
using internal::ValidStep;

// ---- DenseTablePart ---------------------------------------------------------------------

DenseTablePart::DenseTablePart(const common::TableInfo& info,
                               const kernels::OptimizerParams& optimizer,
                               const common::Partitioner& partitioner, uint32_t server_index,
                               const std::function<bool()>& cancelled)
    : TablePart(info, optimizer) {
  block_ids_ = partitioner.BlocksOnServer(info, server_index);
  blocks_.reserve(block_ids_.size());
  const common::Fans fans = common::ComputeFans(*info.config);
  for (uint32_t id : block_ids_) {
    // A block is a few MB at most: a stop asked for while a large table is being allocated
    // and initialized is seen within one block's time.
    if (cancelled && cancelled()) {
      block_ids_.resize(blocks_.size());
      break;
    }
    auto [begin, end] = partitioner.BlockRange(info, id);
    const size_t n = end - begin;
    auto block = std::make_unique<Block>(n);
    const size_t floats = n + block->stride * num_slots_;
    {
      absl::MutexLock lock(&block->mu);
      block->data.resize(floats);
      common::InitializeValues(info.config->initializer(), info.name, fans.in, fans.out, begin,
                               absl::Span<float>(block->data.data(), n));
      for (int s = 0; s < num_slots_; ++s) {
        std::fill_n(block->data.data() + block->stride * (s + 1), n,
                    kernels::SlotInitialValue(optimizer_, s));
      }
    }
    bytes_ += floats * sizeof(float);
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

size_t DenseTablePart::BlockSlotStride(uint32_t block) const {
  Block* b = Find(block);
  CHECK(b != nullptr) << "block " << block << " of " << name() << " not owned";
  return b->stride;
}

void DenseTablePart::Read(uint32_t block, absl::Span<float> out, bool stream) const {
  Block* b = Find(block);
  CHECK(b != nullptr && out.size() == b->size);
  absl::ReaderMutexLock lock(&b->mu);
  if (stream) {
    common::StreamCopy(out.data(), b->data.data(), b->size * sizeof(float));
  } else {
    std::memcpy(out.data(), b->data.data(), b->size * sizeof(float));
  }
}

// The lock is taken here and released in ReaderUnlockBlock, across the calls between: beyond
// what the thread-safety analysis can follow.
void DenseTablePart::ReaderLockBlock(uint32_t block) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Block* b = Find(block);
  CHECK(b != nullptr);
  b->mu.ReaderLock();
}

void DenseTablePart::ReaderUnlockBlock(uint32_t block) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Find(block)->mu.ReaderUnlock();
}

// Under the lock another thread holds for this call (ReaderLockBlock).
void DenseTablePart::ReadLocked(uint32_t block, size_t begin, absl::Span<float> out,
                                bool stream) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Block* b = Find(block);
  CHECK(b != nullptr && begin <= b->size && out.size() <= b->size - begin);
  if (stream) {
    common::StreamCopy(out.data(), b->data.data() + begin, out.size() * sizeof(float));
  } else {
    std::memcpy(out.data(), b->data.data() + begin, out.size() * sizeof(float));
  }
}

void DenseTablePart::Apply(uint32_t block, absl::Span<const float> values,
                           const UpdateOptions& options) {
  Block* b = Find(block);
  CHECK(b != nullptr && values.size() == b->size);
  {
    absl::MutexLock lock(&b->mu);
    const int64_t step = BeginUpdate(block, b, options);
    ApplyTo(optimizer_, num_slots_, step, b->data.data(), b->size, values, options, b->stride);
  }
  CountUpdate();
}

int64_t DenseTablePart::BeginUpdate(uint32_t id, Block* b, const UpdateOptions& options) {
  const uint64_t epoch = active_epoch_.load(std::memory_order_acquire);
  if (epoch != 0 && b->saved_epoch < epoch) {
    // First change since the snapshot began, and the writer has not saved this block yet:
    // save its old contents now (write-through; no copy of the table is kept).
    b->saved_epoch = epoch;
    absl::Status s = (*sink_)(BlockKey(id), EncodeBlock(*b));
    if (!s.ok()) RecordSinkError(s);
  }
  return options.kind == UpdateKind::kGradient ? ++b->step : b->step;
}

void DenseTablePart::Apply(uint32_t block, absl::Span<const BlockPiece> pieces,
                           const UpdateOptions& options) {
  Block* b = Find(block);
  CHECK(b != nullptr);
  DCHECK(optimizer_.clip_norm == 0 || options.kind == UpdateKind::kDelta);
  size_t next = 0;
  for (const BlockPiece& p : pieces) {
    CHECK_EQ(p.offset, next) << "pieces of block " << block << " do not follow each other";
    next += static_cast<size_t>(p.values.n);
  }
  CHECK_EQ(next, b->size);
  {
    absl::MutexLock lock(&b->mu);
    const int64_t step = BeginUpdate(block, b, options);
    for (const BlockPiece& p : pieces) {
      internal::ApplyPieceTo(optimizer_, num_slots_, step, b->data.data(), b->stride, p, options);
    }
  }
  CountUpdate();
}

bool DenseTablePart::SupportsOnePass() const {
  return optimizer_.kind == kernels::OptimizerKind::kSgd && optimizer_.clip_norm == 0;
}

// The lock is taken here and released in UnlockBlock, across the calls between: beyond what
// the thread-safety analysis can follow.
void DenseTablePart::LockBlock(uint32_t block) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Block* b = Find(block);
  CHECK(b != nullptr);
  b->mu.Lock();
}

void DenseTablePart::UnlockBlock(uint32_t block) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Find(block)->mu.Unlock();
}

size_t DenseTablePart::ApplyCountingNonFinite(uint32_t block, absl::Span<const BlockPiece> pieces,
                                              float* undo, int64_t* old_step) {
  Block* b = Find(block);
  CHECK(b != nullptr && SupportsOnePass());
  b->mu.AssertHeld();
  size_t next = 0;
  for (const BlockPiece& p : pieces) {
    CHECK_EQ(p.offset, next) << "pieces of block " << block << " do not follow each other";
    next += static_cast<size_t>(p.values.n);
  }
  CHECK_EQ(next, b->size);
  *old_step = b->step;
  const int64_t step = BeginUpdate(block, b, UpdateOptions{});
  size_t nonfinite = 0;
  for (const BlockPiece& p : pieces) {
    nonfinite += kernels::SgdCountingNonFinite(
        optimizer_, step,
        absl::MakeSpan(b->data.data() + p.offset, static_cast<size_t>(p.values.n)), p.values,
        undo + p.offset);
  }
  return nonfinite;
}

bool DenseTablePart::AppliesInRanges(const UpdateOptions& options) const {
  return optimizer_.clip_norm == 0 || options.kind == UpdateKind::kDelta;
}

int64_t DenseTablePart::BeginLockedUpdate(uint32_t block, const UpdateOptions& options) {
  Block* b = Find(block);
  CHECK(b != nullptr);
  b->mu.AssertHeld();
  return BeginUpdate(block, b, options);
}

// Called by helpers while the thread that holds the block's lock waits for them (see the
// header): beyond what the thread-safety analysis can follow.
void DenseTablePart::ApplyPiecesLocked(
    uint32_t block, int64_t step, absl::Span<const BlockPiece> pieces,
    const UpdateOptions& options) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Block* b = Find(block);
  CHECK(b != nullptr);
  DCHECK(AppliesInRanges(options));
  for (const BlockPiece& p : pieces) {
    CHECK_LE(p.offset + static_cast<size_t>(p.values.n), b->size)
        << "piece of block " << block << " beyond its end";
    internal::ApplyPieceTo(optimizer_, num_slots_, step, b->data.data(), b->stride, p, options);
  }
}

void DenseTablePart::UndoUpdate(uint32_t block, const float* undo, int64_t old_step) {
  Block* b = Find(block);
  CHECK(b != nullptr);
  b->mu.AssertHeld();
  std::memcpy(b->data.data(), undo, b->size * sizeof(float));
  b->step = old_step;
}

absl::string_view DenseTablePart::EncodeBlock(const Block& b) const {
  // One buffer per thread, reused for every block it saves: snapshots of large tables would
  // otherwise allocate and free a block-sized string per block, which fragments the heap.
  // The view is valid until this thread encodes the next block.
  thread_local std::string out;
  out.clear();
  AppendRaw(&out, &b.step, sizeof(b.step));
  for (int s = 0; s <= num_slots_; ++s) {  // the parameters, then each slot
    AppendRaw(&out, b.data.data() + b.stride * s, b.size * sizeof(float));
  }
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
      value = EncodeBlock(*b);
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
  const char* from = value.data() + sizeof(int64_t);
  for (int s = 0; s <= num_slots_; ++s) {  // the parameters, then each slot
    std::memcpy(b->data.data() + b->stride * s, from + b->size * sizeof(float) * s,
                b->size * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace ps::server
