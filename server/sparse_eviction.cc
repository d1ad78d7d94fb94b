// SparseTablePart, tables with a memory budget: the eviction policy (sampled LFU with
// aging) and the moves of rows between memory and the spill table.
#include "server/table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/initializer.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/table_internal.h"

namespace ps::server {

using internal::AppendRaw;
using internal::LoadRaw;
using internal::ValidStep;
using internal::kAgingPeriod;
using internal::kDirty;
using internal::kOnDisk;
using internal::kVictimSamples;

// ---- Moves between memory and the spill table.

void SparseTablePart::Use(Stripe& s, uint32_t slot) {
  if (s.uses[slot] < UINT16_MAX) ++s.uses[slot];
  // The period grows with the rows when pins hold more than the share, so that halving them
  // all stays O(1) a use.
  const uint64_t rows = std::max<uint64_t>({s.budget, s.keys.size(), 8});
  if (++s.uses_since_aging >= kAgingPeriod * rows) {
    s.uses_since_aging = 0;
    for (uint16_t& u : s.uses) u >>= 1;
  }
}

int64_t SparseTablePart::PickVictim(Stripe& s) {
  // Only rows without a pin are candidates, so the work does not depend on how many rows are
  // pinned. Before 2026-12-06 all rows were sampled, with a scan of every row when the
  // samples were all pinned: a push of m new keys into a small budget made each of its rows
  // scan the others as it came in and again as it was unpinned, O(m^2) under the stripe's
  // lock (found in review).
  const size_t n = s.unpinned.size();
  if (n == 0) return -1;
  int64_t best = -1;
  auto consider = [&](uint32_t slot) {
    ++s.victim_slots_examined;
    if (best < 0 || s.uses[slot] < s.uses[best]) best = slot;
  };
  if (n <= kVictimSamples) {
    for (uint32_t slot : s.unpinned) consider(slot);
    return best;
  }
  for (int i = 0; i < kVictimSamples; ++i) {
    s.random ^= s.random << 13;
    s.random ^= s.random >> 7;
    s.random ^= s.random << 17;
    consider(s.unpinned[s.random % n]);
  }
  return best;
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
    // All pinned: over the share until Unpin (a push checked that it has room for that).
    if (victim < 0) return absl::OkStatus();
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

absl::StatusOr<uint32_t> SparseTablePart::FindOrFault(Stripe& s, uint64_t key, bool create) {
  if (const uint32_t slot = s.index.Find(key); slot != RowIndex::kAbsent) return slot;
  thread_local std::string value;
  ASSIGN_OR_RETURN(const bool found, spill_->Get(key, &value));
  if (!found && !create) return RowIndex::kAbsent;
  // Eviction writes other keys (this one is in neither place MakeRoom touches), through a
  // buffer of its own.
  RETURN_IF_ERROR(MakeRoom(s));
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

}  // namespace ps::server
