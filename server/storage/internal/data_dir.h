// Internal to //server/storage:checkpoint_store: what CheckpointStore::Open does to the files
// of its directory before and around RocksDB's open. The rule: nothing in a data dir is
// deleted unless the store itself made it obsolete; files the store cannot use or does not
// know are moved into <dir>/set-aside/ (kSetAsideDir) with a warning, for an operator to
// decide about, and a directory that lost its CURRENT file is refused, not recreated.
#ifndef PS_SERVER_STORAGE_INTERNAL_DATA_DIR_H_
#define PS_SERVER_STORAGE_INTERNAL_DATA_DIR_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/options.h"

namespace ps::server::storage::internal {

// Where files the store does not use are moved instead of being deleted.
inline constexpr absl::string_view kSetAsideDir = "set-aside";

// Checks the table structure of every SST file in `path` before RocksDB parses any (see
// sst_check.h) and renames the damaged ones (suffix ".damaged") so that RocksDB does not open
// them. Returns each file renamed with its DATA_LOSS. First renames back files left so by an
// open that did not finish.
absl::StatusOr<std::vector<std::pair<std::string, absl::Status>>> MoveDamagedSstFilesAside(
    rocksdb::Env* env, const std::string& path);

// After RocksDB's open (`opened`): damaged files the store could do without go into
// kSetAsideDir; if the open failed, they are renamed back and DATA_LOSS names their damage.
absl::Status SettleDamagedSstFiles(rocksdb::Env* env,
                                   const std::vector<std::pair<std::string, absl::Status>>& damaged,
                                   bool opened, absl::string_view context);

// Opens the store in `path` read-only (which deletes nothing), lists its live files and moves
// every other *.sst, *.blob and MANIFEST-* file into kSetAsideDir, since RocksDB's read-write
// open would delete them. Moves nothing when the read-only open fails. Errors: those of
// listing or renaming files (the store is then not opened).
absl::Status SetAsideFilesTheStoreDoesNotList(
    rocksdb::Env* env, const rocksdb::DBOptions& db_options, const std::string& path,
    const std::vector<rocksdb::ColumnFamilyDescriptor>& descriptors, absl::string_view context);

// For a directory without CURRENT: OK when it holds no RocksDB data file (a new store), else
// DATA_LOSS naming what is missing and what is there. Touches nothing.
absl::Status RefuseStoreWithoutCurrent(rocksdb::Env* env, const std::string& path);

// Creates `path` and its missing parents through `env`.
rocksdb::Status CreateDirs(rocksdb::Env* env, const std::string& path);

}  // namespace ps::server::storage::internal

#endif  // PS_SERVER_STORAGE_INTERNAL_DATA_DIR_H_
