// SpillStore: the server's scratch RocksDB for the rows of sparse tables that do not fit their
// memory budget, one column family per table (see spill_table.h for what a table keeps here).
//
// Layout under `path` (by default <data dir>/spill, next to the checkpoint store's files and
// separate from them):
//   LOCK   held (fcntl) while the store is open, so two servers never share one;
//   db/    the RocksDB database.
//
// Nothing here survives a restart. Open() deletes db/ before creating it afresh, because the
// rows a crashed process left there are newer than the checkpoint the new process restores:
// they must not leak into the restored state (the restore spills the checkpoint's own rows
// again). For the same reason writes skip RocksDB's write-ahead log and are never synced, and
// the destructor deletes db/.
//
// Every value carries a CRC-32C over the key (8 bytes, big-endian) and the value, checked on
// every read; RocksDB's block checksums are checked as well.
#ifndef PS_SERVER_STORAGE_SPILL_STORE_H_
#define PS_SERVER_STORAGE_SPILL_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/storage/spill_table.h"

// Only server/storage/ includes RocksDB headers; users of this header see declarations only.
namespace rocksdb {
class Cache;
class ColumnFamilyHandle;
class DB;
class Env;
class FileLock;
}  // namespace rocksdb

namespace ps::server::storage {

struct SpillStoreOptions {
  // Directory of the store; created (with missing parents) if missing, and its db/ deleted.
  // REQUIRES: not empty.
  std::string path;

  // RocksDB block cache shared by all tables, bytes. Spilled rows are cold by construction, and
  // the page cache holds recently read files anyway: a small cache keeps the point of
  // spilling (bounded memory).
  size_t block_cache_bytes = size_t{32} << 20;

  // Memtable size per table, bytes; each table holds at most 3 (one filling, two flushing).
  size_t write_buffer_bytes = size_t{16} << 20;
};

// Thread-safe. The tables handed out live as long as the store.
class SpillStore {
 public:
  // Opens a fresh store for `tables` (names, in the order table(i) returns them).
  // Errors: INVALID_ARGUMENT (empty path, no tables, a repeated name), UNAVAILABLE (the store
  // is open in another process or in this one, the path is under a regular file, other I/O),
  // PERMISSION_DENIED, RESOURCE_EXHAUSTED. Messages name the path.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SpillStore>> Open(
      const SpillStoreOptions& options, const std::vector<std::string>& tables);

  // As Open(), with RocksDB running on `env` (fault injection). `env` is not owned and must
  // outlive the store.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SpillStore>> OpenWithEnvForTest(
      const SpillStoreOptions& options, const std::vector<std::string>& tables, rocksdb::Env* env);

  // Closes the database and deletes its files (best effort: an error is logged).
  ~SpillStore();

  SpillStore(const SpillStore&) = delete;
  SpillStore& operator=(const SpillStore&) = delete;

  // Table `i` of the names given to Open(). REQUIRES: i < num_tables().
  SpillTable* table(size_t i) const;
  size_t num_tables() const { return tables_.size(); }
  const std::string& path() const { return options_.path; }

  // Approximate bytes on disk and in memtables, over all tables.
  uint64_t ApproximateSizeBytes();

  // Flushes every table's memtable into files (tests: make reads go through the files).
  [[nodiscard]] absl::Status FlushForTest();

  // Writes `stored` as the raw stored bytes (checksum included) of table `i`'s `key`: tests
  // damage values with it.
  [[nodiscard]] absl::Status PutRawForTest(size_t i, uint64_t key, absl::string_view stored);

 private:
  class Table;
  SpillStore(const SpillStoreOptions& options, rocksdb::Env* env);
  static absl::StatusOr<std::unique_ptr<SpillStore>> OpenImpl(
      const SpillStoreOptions& options, const std::vector<std::string>& tables, rocksdb::Env* env);
  std::string db_path() const { return options_.path + "/db"; }

  // Constant after construction.
  const SpillStoreOptions options_;
  rocksdb::Env* const env_;  // Not owned.
  rocksdb::FileLock* lock_ = nullptr;
  std::shared_ptr<rocksdb::Cache> cache_;
  // Declared before the tables (which hold the column family handles): members are destroyed
  // in reverse order, and RocksDB requires the handles to go before the DB.
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<std::unique_ptr<Table>> tables_;
};

}  // namespace ps::server::storage

#endif  // PS_SERVER_STORAGE_SPILL_STORE_H_
