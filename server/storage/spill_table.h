// SpillTable: where a sparse table keeps the rows that do not fit its memory budget
// (TableConfig.memory_budget_rows). The interface, without RocksDB: the table (server/table.h)
// depends on this, SpillStore (spill_store.h) implements it on RocksDB, and
// InMemorySpillTable (in_memory_spill_table.h) is the fake for tests.
//
// A spill table maps a uint64 key to an opaque value (the table's encoded row). It is scratch
// space, never recovered after a restart: the checkpoints are the durable copy. The sparse
// table that uses it writes a row here when it evicts a changed row, and reads it back when
// the row is used again (server/table.h says how its snapshots use Snapshot()).
#ifndef PS_SERVER_STORAGE_SPILL_TABLE_H_
#define PS_SERVER_STORAGE_SPILL_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps::server::storage {

// A read-only view of a SpillTable as it was when Snapshot() was called; Put and Delete made
// later do not show in it. Thread-compatible: callers synchronize. REQUIRES: the SpillTable
// outlives the snapshot.
class SpillSnapshot {
 public:
  virtual ~SpillSnapshot() = default;

  // Calls `visit` with every (key, value) of the view in increasing key order, checking each
  // value before handing it out. The value view is valid only during the call. Stops at the
  // first error: DATA_LOSS (a stored value is corrupt; the message names the key),
  // UNAVAILABLE (I/O), or the first non-OK status returned by `visit`, unchanged.
  [[nodiscard]] virtual absl::Status ForEach(
      const std::function<absl::Status(uint64_t key, absl::string_view value)>& visit) = 0;
};

// One table's spilled rows. Thread-safe.
//
// Error codes: DATA_LOSS (a stored value is corrupt: checksum or RocksDB block checksum),
// RESOURCE_EXHAUSTED (disk full), PERMISSION_DENIED, UNAVAILABLE (other I/O errors). Messages
// name the store's path, the table and, where there is one, the key.
class SpillTable {
 public:
  virtual ~SpillTable() = default;

  // The table's name, for messages.
  virtual const std::string& name() const = 0;

  // Reads `key`'s value into *value and returns true; returns false when `key` is absent.
  [[nodiscard]] virtual absl::StatusOr<bool> Get(uint64_t key, std::string* value) = 0;

  // Stores `value` under `key`, replacing any value it had.
  [[nodiscard]] virtual absl::Status Put(uint64_t key, absl::string_view value) = 0;

  // Removes `key` (absent keys are fine).
  [[nodiscard]] virtual absl::Status Delete(uint64_t key) = 0;

  // A view of the table as of now (see SpillSnapshot).
  virtual std::unique_ptr<SpillSnapshot> Snapshot() = 0;
};

}  // namespace ps::server::storage

#endif  // PS_SERVER_STORAGE_SPILL_TABLE_H_
