#include "server/storage/internal/rocksdb_options.h"

#include <memory>

#include "rocksdb/listener.h"
#include "rocksdb/table.h"

namespace ps::server::storage::internal {
namespace {

// After a disk-full error RocksDB would poll for free space and resume by itself, in the
// background; while it does, writes fail with its error and DB::Resume() answers Busy.
// BeginCheckpoint() resumes instead, so recovery happens at a predictable point and a still
// full disk is reported to the caller as RESOURCE_EXHAUSTED rather than as a busy database.
class ResumeOnlyWhenAsked : public rocksdb::EventListener {
 public:
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason /*reason*/, rocksdb::Status /*bg_error*/,
                            bool* auto_recovery) override {
    *auto_recovery = false;
  }
};

}  // namespace

rocksdb::DBOptions MakeDbOptions(rocksdb::Env* env) {
  rocksdb::DBOptions options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  options.paranoid_checks = true;  // The default: refuse to open with missing or truncated files.
  options.env = env;
  // Open table files lazily (bounded cache) instead of all at Open: a damaged index block of one
  // checkpoint then fails reads of that checkpoint, not the whole store.
  options.max_open_files = 512;
  // One flush and one compaction in parallel: the shard shares its cores with training traffic.
  options.max_background_jobs = 2;
  // Spread page-cache writeback instead of stalling on one big fsync at the end of a flush.
  options.bytes_per_sync = 1 << 20;
  options.wal_bytes_per_sync = 1 << 20;
  options.keep_log_file_num = 4;  // Info LOG files.
  options.listeners.push_back(std::make_shared<ResumeOnlyWhenAsked>());
  return options;
}

namespace {

// CRC-32C block checksums (RocksDB 7.8 defaults to XXH3): the one kind CheckSstFile verifies.
rocksdb::BlockBasedTableOptions TableOptions() {
  rocksdb::BlockBasedTableOptions table;
  table.checksum = rocksdb::kCRC32c;
  return table;
}

}  // namespace

rocksdb::ColumnFamilyOptions MakeMetaCfOptions() {
  rocksdb::ColumnFamilyOptions options;
  options.write_buffer_size = 4 << 20;  // A few small keys.
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(TableOptions()));
  return options;
}

rocksdb::ColumnFamilyOptions MakeCheckpointCfOptions() {
  rocksdb::ColumnFamilyOptions options;
  // Written once, read whole, dropped whole: compaction would only rewrite the data. (With
  // compaction off RocksDB also skips its L0 write stalls.)
  options.disable_auto_compactions = true;
  // Parameters and optimizer slots are floats, which block compressors barely shrink;
  // compressing them costs CPU on both paths for nothing.
  options.compression = rocksdb::kNoCompression;
  // Memtables are the store's main memory cost while a checkpoint is written (at most
  // write_buffer_size * max_write_buffer_number): kept small so that a server's resident set
  // stays close to its tables' size during checkpoints.
  options.write_buffer_size = 16 << 20;
  options.max_write_buffer_number = 3;  // Keep accepting records while memtables flush.
  rocksdb::BlockBasedTableOptions table = TableOptions();
  table.block_size = 64 << 10;  // Reads are long scans; fewer index entries for small rows.
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return options;
}

rocksdb::ReadOptions ScanReadOptions() {
  rocksdb::ReadOptions options;
  options.verify_checksums = true;  // RocksDB's block checksums, in addition to ours.
  options.fill_cache = false;       // A full scan would only evict useful blocks.
  options.readahead_size = 2 << 20;
  return options;
}

}  // namespace ps::server::storage::internal
