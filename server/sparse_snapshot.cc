// SparseTablePart: consistent snapshots (rows in memory, copied aside, and spilled) and
// restore. Record layouts are in table_internal.h.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/initializer.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/table.h"
#include "server/table_internal.h"

namespace ps::server {

using internal::AppendRaw;
using internal::LoadRaw;
using internal::ValidStep;
using internal::kDirty;
using internal::kOnDisk;
using internal::SparseRecordKey;

// ---- Snapshots and restore.

void SparseTablePart::BeginSnapshot(uint64_t epoch, const SnapshotSink* sink) {
  CHECK_GT(epoch, 0u);
  // No row moves while the cut is taken: memory and the spill table are cut at one instant.
  absl::WriterMutexLock move(&move_mu_);
  sink_ = sink;
  snapshot_rows_ = 0;
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
      ++snapshot_rows_;
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
      DropPending(s);
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
        ++snapshot_rows_;
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
    DropPending(stripes_[i]);
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
    // Within server.max_memory_bytes as new rows of pulls and pushes are: a checkpoint of
    // more rows than the budget holds (a table that spilled, restored without spilling) is
    // refused, not loaded until the kernel kills the server.
    if (memory_ != nullptr) {
      std::vector<uint64_t> keys;
      keys.reserve(value.size() / entry_bytes);
      for (size_t off = 0; off < value.size(); off += entry_bytes) {
        keys.push_back(LoadRaw<uint64_t>(value.data() + off));
      }
      if (absl::Status room = CheckRoomForNewRows(keys); !room.ok()) {
        return absl::Status(
            room.code(),
            absl::StrCat("restoring a checkpoint: ", room.message(),
                         " (give the table memory_budget_rows to spill rows to disk, or "
                         "raise server.max_memory_bytes)"));
      }
    }
    for (size_t off = 0; off < value.size(); off += entry_bytes) {
      const uint64_t k = LoadRaw<uint64_t>(value.data() + off);
      Stripe& s = stripes_[StripeOf(k)];
      absl::MutexLock lock(&s.mu);
      const uint32_t found = s.index.Find(k);
      const uint32_t slot = found != RowIndex::kAbsent ? found : AddRow(s, k);
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
