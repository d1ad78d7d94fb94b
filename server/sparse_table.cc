// SparseTablePart: the striped row store (arena chunks, hash maps), row creation under the
// memory budget, reads and updates.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/hash.h"
#include "common/initializer.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/flush_denormals.h"
#include "server/table.h"
#include "server/table_internal.h"

namespace ps::server {

using internal::ApplyTo;
using internal::kDirty;

namespace {

// Rows per arena chunk: as many as fit in 1 MiB, from 1 to 1024 (a chunk is allocated whole
// for the first row that lands in it: 1024 rows of dim 2^20 with Adam's slots were 12 GiB,
// charged to the memory budget that had been asked for one row, found in review
// 2026-12-05); with a row budget, also at most about a stripe's share of it, so that small
// budgets do not allocate far more memory than they allow. The share is raised to 16 rows,
// or fewer that take 4 KiB, so that a chunk is not one allocation per small row; before
// 2026-12-06 it was raised to 16 rows of any size, and a budget of 256 rows of 64 KiB held
// 32 of them per stripe (found in review).
uint32_t RowsPerChunk(size_t row_bytes, bool spills, uint64_t budget_rows) {
  constexpr uint64_t kChunkBytes = 1 << 20;
  constexpr uint64_t kMinChunkBytes = 4 << 10;
  const uint64_t row = std::max<size_t>(row_bytes, 1);
  uint64_t rows = std::clamp<uint64_t>(kChunkBytes / row, 1, 1024);
  if (spills) {
    const uint64_t share = budget_rows / SparseTablePart::kNumStripes + 1;
    const uint64_t floor = std::clamp<uint64_t>(kMinChunkBytes / row, 1, 16);
    rows = std::min(rows, std::clamp<uint64_t>(share, floor, 1024));
  }
  return static_cast<uint32_t>(rows);
}

// Bytes per row slot of a spilling table's per-row vectors: keys, steps, saved_epoch, uses,
// pins, flags, unpinned and unpinned_at.
constexpr size_t kSpillingSlotBytes = 3 * 8 + 2 + 4 + 1 + 2 * 4;

// One seed per process for StripeOf, as RowIndex has for positions: a client cannot choose
// keys that land in one stripe.
uint64_t ProcessStripeSeed() {
  static const uint64_t seed = [] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd();
  }();
  return seed;
}

// Below a quarter of its capacity, a vector is cut to its size: after a spike the memory
// comes back, and the size must halve again after it doubles before the next cut, so each
// reallocation is paid for by as many removals or additions as it copies.
template <typename T>
void ShrinkVector(std::vector<T>& v) {
  if (v.size() < v.capacity() / 4) v.shrink_to_fit();
}

// The least power of two that is at least n (n > 0), in floating point: no overflow.
double Pow2AtLeast(double n) {
  double p = 1;
  while (p < n) p *= 2;
  return p;
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
      rows_per_chunk_(RowsPerChunk(row_floats_ * sizeof(float), spill_ != nullptr, budget_rows_)),
      stripe_seed_(ProcessStripeSeed()),
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

int SparseTablePart::StripeOf(uint64_t key) const {
  // The top bits: the Partitioner uses Mix64(key) modulo small numbers, so the low bits are
  // correlated with the server; the high byte is not. Unseeded, keys that share Mix64's top
  // byte (easy to find) all landed in one stripe (before 2026-12-06, found in review).
  return static_cast<int>(common::Mix64(key ^ stripe_seed_) >> 56);
}

void SparseTablePart::GroupByStripe(absl::Span<const uint64_t> keys, StripeGroups* groups) const {
  static_assert(kNumStripes <= 256, "stripe numbers are kept in a byte");
  CHECK_LT(keys.size(), size_t{1} << 32);
  std::vector<uint8_t> stripe(keys.size());
  uint32_t next[kNumStripes] = {};
  for (size_t i = 0; i < keys.size(); ++i) {
    stripe[i] = static_cast<uint8_t>(StripeOf(keys[i]));
    ++next[stripe[i]];
  }
  groups->first[0] = 0;
  for (int s = 0; s < kNumStripes; ++s) {
    groups->first[s + 1] = groups->first[s] + next[s];
    next[s] = groups->first[s];
  }
  groups->order.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    groups->order[next[stripe[i]]++] = static_cast<uint32_t>(i);
  }
}

absl::Status SparseTablePart::FindSlots(Stripe& s, absl::Span<const uint64_t> keys,
                                        const uint32_t* order, size_t n, SlotUse use,
                                        uint32_t* slots) {
  // Keys this far ahead have their index entries prefetched: enough to cover a miss's latency
  // with the lookups in between, few enough that the lines are still cached when used.
  constexpr size_t kAhead = 16;
  const size_t row_bytes = row_floats_ * sizeof(float);
  for (size_t j = 0; j < std::min(n, kAhead); ++j) s.index.Prefetch(keys[order[j]]);
  for (size_t j = 0; j < n; ++j) {
    if (j + kAhead < n) s.index.Prefetch(keys[order[j + kAhead]]);
    const uint64_t key = keys[order[j]];
    if (const uint32_t slot = s.index.Find(key); slot != RowIndex::kAbsent) {
      slots[j] = slot;
    } else if (use == SlotUse::kRead) {
      // A key never pushed reads as its initial values without becoming a row (see
      // ReadSpilling): before 2026-12-05 a client pulling new keys filled the server's memory
      // budget, and then every push of a new key was refused.
      slots[j] = RowIndex::kAbsent;
      continue;
    } else {
      CHECK(!spills()) << "table '" << name() << "': Apply to key " << key << " without Pin";
      slots[j] = FindOrCreate(s, key);
    }
    // The row itself (a read needs its parameters only), and an update's step: used after the
    // lookups of this stripe are done.
    const char* row = reinterpret_cast<const char*>(RowPtr(s, slots[j]));
    const size_t bytes = use == SlotUse::kRead ? dim_ * sizeof(float) : row_bytes;
    for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b);
    __builtin_prefetch(row + bytes - 1);
    if (use == SlotUse::kUpdate) __builtin_prefetch(&s.steps[slots[j]]);
  }
  return absl::OkStatus();
}

float* SparseTablePart::RowPtr(Stripe& s, uint32_t slot) const {
  return s.chunks[slot / rows_per_chunk_].get() + size_t{slot % rows_per_chunk_} * row_floats_;
}

uint32_t SparseTablePart::AddRow(Stripe& s, uint64_t key) {
  // Slots are uint32_t, and RowIndex::kAbsent is none.
  CHECK_LT(s.keys.size(), size_t{RowIndex::kAbsent}) << "table '" << name() << "': stripe full";
  const uint32_t slot = static_cast<uint32_t>(s.keys.size());
  if (slot / rows_per_chunk_ >= s.chunks.size()) {
    s.chunks.emplace_back(new (kChunkAlignment) float[size_t{rows_per_chunk_} * row_floats_]);
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
    s.unpinned_at.push_back(RowIndex::kAbsent);
    MarkUnpinned(s, slot);
  }
  s.index.Insert(key, slot);
  Recount(s);
  return slot;
}

int64_t SparseTablePart::StripeBytes(const Stripe& s) const {
  const size_t index = s.index.capacity() * RowIndex::bytes_per_entry();
  const size_t per_row =
      s.keys.capacity() * sizeof(uint64_t) + s.steps.capacity() * sizeof(int64_t) +
      s.saved_epoch.capacity() * sizeof(uint64_t) + s.uses.capacity() * sizeof(uint16_t) +
      s.pins.capacity() * sizeof(uint32_t) + s.flags.capacity() +
      s.unpinned.capacity() * sizeof(uint32_t) + s.unpinned_at.capacity() * sizeof(uint32_t);
  const size_t chunks = s.chunks.capacity() * sizeof(s.chunks[0]) +
                        s.chunks.size() * size_t{rows_per_chunk_} * row_floats_ * sizeof(float);
  // Rows copied aside for a checkpoint (pending) are not counted: the memory budget's room
  // decides whether a push of new rows is refused, for good, and a checkpoint in progress must
  // not make a push fail that would pass without it (found in review, 2026-12-06).
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
  // A spilling table's rows have uses, pins, flags and unpinned entries too.
  const uint64_t spilling = spills() ? kSpillingSlotBytes - 3 * sizeof(uint64_t) : 0;
  return row_floats_ * sizeof(float) + kBookkeepingBytesPerRow + spilling;
}

uint64_t SparseTablePart::ChunkBytes() const {
  return uint64_t{rows_per_chunk_} * row_floats_ * sizeof(float);
}

uint64_t SparseTablePart::NewRowsCost(const Stripe& s, uint64_t n) const {
  const uint64_t rows = s.keys.size() + n;
  const uint64_t chunks = (rows + rows_per_chunk_ - 1) / rows_per_chunk_;
  const uint64_t new_chunks = chunks > s.chunks.size() ? chunks - s.chunks.size() : 0;
  return n * RowCost() + new_chunks * ChunkBytes();
}

uint64_t SparseTablePart::PinnedBeyondBudgetCost(const Stripe& s, uint64_t n,
                                                 uint64_t* rows) const {
  // The stripe may hold the rows it holds, or up to its share (one row for a share of 0, as
  // MakeRoom allows) without a check: Shard::CheckMemoryAtStart found room for the shares.
  // Beyond that it evicts rows that are not pinned; the rows pinned already and the `n` keys
  // to pin (none of them pinned now) it cannot.
  const uint64_t size = s.keys.size();
  const uint64_t allowed = std::max<uint64_t>({size, s.budget, 1});
  const uint64_t after = size - s.unpinned.size() + n;
  *rows = after > allowed ? after - allowed : 0;
  if (*rows == 0) return 0;
  auto chunks = [this](uint64_t r) { return (r + rows_per_chunk_ - 1) / rows_per_chunk_; };
  const uint64_t have = std::max<uint64_t>(s.chunks.size(), chunks(allowed));
  const uint64_t new_chunks = chunks(after) > have ? chunks(after) - have : 0;
  return *rows * RowCost() + new_chunks * ChunkBytes();
}

std::string SparseTablePart::NewRowsText(uint64_t rows) const {
  if (!spills()) return absl::StrCat(rows, " new rows");
  return absl::StrCat(rows, " rows pinned beyond memory_budget_rows ", budget_rows_);
}

absl::Status SparseTablePart::CheckRoomForNewRows(absl::Span<const uint64_t> keys) const {
  if (memory_ == nullptr) return absl::OkStatus();
  // Room for every key as a new row is room for those NewRowsBytes counts (CheckRoom is
  // monotone): then the rows need not be looked up at all.
  if (memory_->CheckRoom(MaxNewRowsBytes(keys.size()), "").ok()) return absl::OkStatus();
  uint64_t rows = 0;
  const uint64_t cost = NewRowsBytes({keys}, &rows);
  if (rows == 0) return absl::OkStatus();
  return memory_->CheckRoom(cost, absl::StrCat("table '", name(), "': ", NewRowsText(rows)));
}

uint64_t SparseTablePart::MaxNewRowsBytes(uint64_t num_keys) const {
  if (memory_ == nullptr) return 0;
  // New rows (spilling: rows beyond the budget, at most one per key) take at most a new
  // chunk per stripe they land in, plus one per rows_per_chunk of them.
  const uint64_t max_new_chunks =
      std::min<uint64_t>(num_keys, kNumStripes) + num_keys / rows_per_chunk_;
  return num_keys * RowCost() + max_new_chunks * ChunkBytes();
}

uint64_t SparseTablePart::NewRowsBytes(absl::Span<const absl::Span<const uint64_t>> parts,
                                       uint64_t* missing) const {
  *missing = 0;
  if (memory_ == nullptr) return 0;
  // Each key once: a key named twice (in one part or in two) makes one row.
  std::vector<uint64_t> keys;
  size_t n = 0;
  for (absl::Span<const uint64_t> part : parts) n += part.size();
  keys.reserve(n);
  for (absl::Span<const uint64_t> part : parts) keys.insert(keys.end(), part.begin(), part.end());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  StripeGroups groups;
  GroupByStripe(keys, &groups);
  constexpr uint32_t kAhead = 16;  // as FindSlots
  uint64_t cost = 0;
  for (int i = 0; i < kNumStripes; ++i) {
    const uint32_t b = groups.first[i], e = groups.first[i + 1];
    if (b == e) continue;
    const Stripe& s = stripes_[i];
    absl::MutexLock lock(&s.mu);
    for (uint32_t j = b; j < std::min(e, b + kAhead); ++j) s.index.Prefetch(keys[groups.order[j]]);
    uint64_t in_stripe = 0;
    for (uint32_t j = b; j < e; ++j) {
      if (j + kAhead < e) s.index.Prefetch(keys[groups.order[j + kAhead]]);
      const uint32_t slot = s.index.Find(keys[groups.order[j]]);
      // Spilling: a key takes a pinned row in memory, a row already or not, unless another
      // push in flight pins it already (counted among the pinned rows: found in review,
      // 2026-12-06, hot keys pushed by several workers at once were counted twice).
      if (slot == RowIndex::kAbsent || (spills() && s.pins[slot] == 0)) ++in_stripe;
    }
    if (spills()) {
      uint64_t rows = 0;
      cost += PinnedBeyondBudgetCost(s, in_stripe, &rows);
      *missing += rows;
      continue;
    }
    *missing += in_stripe;
    cost += in_stripe == 0 ? 0 : NewRowsCost(s, in_stripe);
  }
  return cost;
}

double SparseTablePart::BytesAtRowBudget(size_t row_bytes, uint64_t budget_rows) {
  const double per_chunk = RowsPerChunk(row_bytes, /*spills=*/true, budget_rows);
  const double chunk_bytes = per_chunk * static_cast<double>(row_bytes);
  // What StripeBytes counts for a stripe at its share.
  auto stripe = [&](uint64_t share) {
    // A stripe whose share is 0 holds a row while it is used (MakeRoom).
    const uint64_t rows = std::max<uint64_t>(share, 1);
    // Whole chunks, and the spare one RemoveSlot keeps when rows go.
    const double chunks = std::ceil(static_cast<double>(rows) / per_chunk) + 1;
    return chunks * chunk_bytes + Pow2AtLeast(chunks) * sizeof(Chunk) +
           static_cast<double>(RowIndex::CapacityFor(rows) * RowIndex::bytes_per_entry()) +
           Pow2AtLeast(static_cast<double>(rows)) * kSpillingSlotBytes;
  };
  const uint64_t q = budget_rows / kNumStripes, r = budget_rows % kNumStripes;
  return static_cast<double>(kNumStripes - r) * stripe(q) + static_cast<double>(r) * stripe(q + 1);
}

void SparseTablePart::InitParams(uint64_t key, float* params) const {
  if (reinterpret_cast<uintptr_t>(params) % alignof(float) == 0) {
    common::InitializeSparseRow(info_.config->initializer(), info_.name, key,
                                absl::Span<float>(params, dim_));
    return;
  }
  // A pull's answer frame may put its rows at any byte offset (found by fuzz/rpc/frame_fuzzer
  // under UBSan): computed aside, then copied.
  absl::InlinedVector<float, 64> row(dim_);
  common::InitializeSparseRow(info_.config->initializer(), info_.name, key, absl::MakeSpan(row));
  std::memcpy(params, row.data(), dim_ * sizeof(float));
}

void SparseTablePart::InitRow(uint64_t key, float* row) const {
  InitParams(key, row);
  std::copy(slot_init_.begin(), slot_init_.end(), row + dim_);
}

uint32_t SparseTablePart::FindOrCreate(Stripe& s, uint64_t key) {
  if (const uint32_t found = s.index.Find(key); found != RowIndex::kAbsent) return found;
  const uint32_t slot = AddRow(s, key);
  InitRow(key, RowPtr(s, slot));
  return slot;
}

void SparseTablePart::RemoveSlot(Stripe& s, uint32_t slot) {
  DCHECK_EQ(s.pins[slot], 0u);
  const uint32_t last = static_cast<uint32_t>(s.keys.size() - 1);
  s.index.Erase(s.keys[slot]);
  MarkPinned(s, slot);  // out of s.unpinned: it goes
  if (slot != last) {
    std::memcpy(RowPtr(s, slot), RowPtr(s, last), row_floats_ * sizeof(float));
    s.keys[slot] = s.keys[last];
    s.steps[slot] = s.steps[last];
    s.saved_epoch[slot] = s.saved_epoch[last];
    s.uses[slot] = s.uses[last];
    s.pins[slot] = s.pins[last];
    s.flags[slot] = s.flags[last];
    s.unpinned_at[slot] = s.unpinned_at[last];
    if (s.unpinned_at[slot] != RowIndex::kAbsent) s.unpinned[s.unpinned_at[slot]] = slot;
    s.index.Update(s.keys[slot], slot);
  }
  s.keys.pop_back();
  s.steps.pop_back();
  s.saved_epoch.pop_back();
  s.uses.pop_back();
  s.pins.pop_back();
  s.flags.pop_back();
  s.unpinned_at.pop_back();
  // Give back chunks no longer needed, keeping one spare against churn at a boundary.
  const size_t needed = (s.keys.size() + rows_per_chunk_ - 1) / rows_per_chunk_;
  while (s.chunks.size() > needed + 1) s.chunks.pop_back();
  ShrinkIfSparse(s);
  Recount(s);
}

void SparseTablePart::ShrinkIfSparse(Stripe& s) {
  // A push pins all of its keys at once, beyond the stripe's share if it must: the vectors
  // and the index (which shrinks as keys are erased) grew to hold them. Before 2026-12-06 they
  // kept that size, charged to the memory budget, for good (found in review).
  ShrinkVector(s.keys);
  ShrinkVector(s.steps);
  ShrinkVector(s.saved_epoch);
  ShrinkVector(s.uses);
  ShrinkVector(s.pins);
  ShrinkVector(s.flags);
  ShrinkVector(s.unpinned);
  ShrinkVector(s.unpinned_at);
  ShrinkVector(s.chunks);
}

void SparseTablePart::MarkPinned(Stripe& s, uint32_t slot) {
  const uint32_t at = s.unpinned_at[slot];
  const uint32_t moved = s.unpinned.back();
  s.unpinned[at] = moved;
  s.unpinned_at[moved] = at;
  s.unpinned.pop_back();
  s.unpinned_at[slot] = RowIndex::kAbsent;
}

void SparseTablePart::MarkUnpinned(Stripe& s, uint32_t slot) {
  s.unpinned_at[slot] = static_cast<uint32_t>(s.unpinned.size());
  s.unpinned.push_back(slot);
}

// ---- Reads and updates.

absl::Status SparseTablePart::Read(absl::Span<const uint64_t> keys, absl::Span<float> out) {
  CHECK_EQ(out.size(), keys.size() * dim_);
  return spills() ? ReadSpilling(keys, out) : ReadResident(keys, out);
}

absl::Status SparseTablePart::ReadResident(absl::Span<const uint64_t> keys,
                                           absl::Span<float> out) {
  StripeGroups groups;
  GroupByStripe(keys, &groups);
  std::vector<uint32_t> slots(keys.size());
  return ForStripes(keys.size(), [&](int first, int last) -> absl::Status {
    for (int i = first; i < last; ++i) {
      const uint32_t b = groups.first[i], n = groups.first[i + 1] - b;
      if (n == 0) continue;
      Stripe& s = stripes_[i];
      absl::MutexLock lock(&s.mu);
      RETURN_IF_ERROR(FindSlots(s, keys, &groups.order[b], n, SlotUse::kRead, &slots[b]));
      for (uint32_t j = b; j < b + n; ++j) {
        float* dst = out.data() + size_t{groups.order[j]} * dim_;
        if (slots[j] == RowIndex::kAbsent) {
          InitParams(keys[groups.order[j]], dst);
        } else {
          std::memcpy(dst, RowPtr(s, slots[j]), dim_ * sizeof(float));
        }
      }
    }
    return absl::OkStatus();
  });
}

absl::Status SparseTablePart::ForStripes(size_t num_keys,
                                         absl::FunctionRef<absl::Status(int, int)> work) {
  const int parts =
      helpers_ == nullptr || num_keys < kParallelKeys ? 1 : helpers_->num_threads() + 1;
  if (parts == 1) return work(0, kNumStripes);
  std::vector<absl::Status> status(parts);
  absl::BlockingCounter done(parts - 1);
  for (int p = 1; p < parts; ++p) {
    helpers_->Schedule([&work, &status, &done, p, parts] {
      status[p] = work(p * kNumStripes / parts, (p + 1) * kNumStripes / parts);
      done.DecrementCount();
    });
  }
  status[0] = work(0, kNumStripes / parts);
  done.Wait();
  for (absl::Status& st : status) RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

// Rows may move between memory and the spill table: one key at a time, as the eviction and
// fault-in paths expect.
absl::Status SparseTablePart::ReadSpilling(absl::Span<const uint64_t> keys,
                                           absl::Span<float> out) {
  for (size_t i = 0; i < keys.size(); ++i) {
    Stripe& s = stripes_[StripeOf(keys[i])];
    float* dst = out.data() + i * dim_;
    {
      absl::MutexLock lock(&s.mu);
      if (const uint32_t slot = s.index.Find(keys[i]); slot != RowIndex::kAbsent) {
        std::memcpy(dst, RowPtr(s, slot), dim_ * sizeof(float));
        Use(s, slot);
        continue;
      }
    }
    // Not in memory: the row has to move, which needs move_mu_ (taken before the stripe).
    absl::ReaderMutexLock move(&move_mu_);
    absl::MutexLock lock(&s.mu);
    // A key never pushed reads as its initial values without becoming a row: rows made by
    // reads were spilled and checkpointed, so a client that only pulled new keys could fill
    // the disk (before 2026-12-05). Its first push creates it with the same values.
    ASSIGN_OR_RETURN(const uint32_t slot, FindOrFault(s, keys[i], /*create=*/false));
    if (slot == RowIndex::kAbsent) {
      InitParams(keys[i], dst);
      continue;
    }
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
        if (s.pins[*slot]++ == 0) MarkPinned(s, *slot);
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
    const uint32_t slot = s.index.Find(key);
    CHECK(slot != RowIndex::kAbsent && s.pins[slot] > 0)
        << "table '" << name() << "': Unpin of key " << key << " that is not pinned";
    if (--s.pins[slot] == 0) MarkUnpinned(s, slot);
    Trim(s);
  }
}

void SparseTablePart::Apply(absl::Span<const uint64_t> keys, absl::Span<const float> values,
                            const UpdateOptions& options) {
  CHECK_EQ(values.size(), keys.size() * dim_);
  StripeGroups groups;
  GroupByStripe(keys, &groups);
  std::vector<uint32_t> slots(keys.size());
  const absl::Status applied = ForStripes(keys.size(), [&](int first, int last) {
    for (int i = first; i < last; ++i) ApplyStripe(i, keys, values, options, groups, &slots);
    return absl::OkStatus();
  });
  CHECK(applied.ok()) << applied;
  CountUpdate();
}

void SparseTablePart::ApplyStripe(int stripe, absl::Span<const uint64_t> keys,
                                  absl::Span<const float> values, const UpdateOptions& options,
                                  const StripeGroups& groups, std::vector<uint32_t>* slots) {
  const uint32_t b = groups.first[stripe], n = groups.first[stripe + 1] - b;
  if (n == 0) return;
  Stripe& s = stripes_[stripe];
  absl::MutexLock lock(&s.mu);
  // An update's lookups cannot fail: a missing row is created, or (spilling) a CHECK.
  const absl::Status found =
      FindSlots(s, keys, &groups.order[b], n, SlotUse::kUpdate, slots->data() + b);
  CHECK(found.ok()) << found;
  // Once for the stripe's rows, not per row by each ApplyTo.
  const kernels::ScopedFlushDenormals flush;
  for (uint32_t j = b; j < b + n; ++j) {
    const uint32_t slot = (*slots)[j];
    const uint64_t key = keys[groups.order[j]];
    if (spills()) s.flags[slot] |= kDirty;
    float* row = RowPtr(s, slot);
    const uint64_t epoch = active_epoch_.load(std::memory_order_acquire);
    if (epoch != 0 && s.saved_epoch[slot] < epoch) {
      s.pending.emplace(key, std::make_pair(s.steps[slot],
                                            std::vector<float>(row, row + row_floats_)));
      s.saved_epoch[slot] = epoch;
    }
    const int64_t step =
        options.kind == UpdateKind::kGradient ? ++s.steps[slot] : s.steps[slot];
    ApplyTo(optimizer_, num_slots_, step, row, dim_,
            values.subspan(size_t{groups.order[j]} * dim_, dim_), options);
  }
}

void SparseTablePart::DropPending(Stripe& s) {
  // Swapped out, not cleared: clear() keeps a small table's array.
  decltype(s.pending)().swap(s.pending);
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
    st.victim_slots_examined += stripes_[i].victim_slots_examined;
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

}  // namespace ps::server
