// Internal to //server/storage:checkpoint_store: the RocksDB options of a CheckpointStore (why
// each is set is in the .cc), shared by its open, its writes and its scans.
#ifndef PS_SERVER_STORAGE_INTERNAL_ROCKSDB_OPTIONS_H_
#define PS_SERVER_STORAGE_INTERNAL_ROCKSDB_OPTIONS_H_

#include "rocksdb/env.h"
#include "rocksdb/options.h"

namespace ps::server::storage::internal {

// The database: created if missing, paranoid checks, lazy table opening, no automatic
// recovery after a background error (BeginCheckpoint resumes instead).
rocksdb::DBOptions MakeDbOptions(rocksdb::Env* env);
// The meta column family (format, next id, commit records).
rocksdb::ColumnFamilyOptions MakeMetaCfOptions();
// A checkpoint's column family: written once, read whole, dropped whole.
rocksdb::ColumnFamilyOptions MakeCheckpointCfOptions();
// Full scans of a checkpoint (checksums verified, block cache left alone).
rocksdb::ReadOptions ScanReadOptions();

}  // namespace ps::server::storage::internal

#endif  // PS_SERVER_STORAGE_INTERNAL_ROCKSDB_OPTIONS_H_
