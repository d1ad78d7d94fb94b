// A check of an SST file's table structure before RocksDB opens it.
//
// RocksDB 7.8 parses a table's properties block before it verifies that block's checksum, and
// Debian's librocksdb keeps its assertions: one damaged byte there aborts the process inside
// DB::Open (DataBlockHashIndex::Initialize) instead of returning Corruption. So the store
// checks every SST file of its directory first: the footer, and the checksum of every block
// the footer and the metaindex block point to (metaindex, properties and the other meta
// blocks, index). Data blocks are left to RocksDB, which verifies them before parsing.
//
// Only files written with CRC-32C block checksums (the store's setting) can be checked; for
// any other checksum type the check reports kUnchecked and RocksDB's own checks apply.
#ifndef PS_SERVER_STORAGE_SST_CHECK_H_
#define PS_SERVER_STORAGE_SST_CHECK_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps::server::storage {

enum class SstCheck {
  kGood,       // footer and all table-structure blocks have good checksums
  kUnchecked,  // a format this check does not cover (checksum type, footer version)
};

// DATA_LOSS naming the file and the block for damage (bad magic, handles outside the file,
// checksum mismatch, malformed metaindex); UNAVAILABLE when the file cannot be read.
absl::StatusOr<SstCheck> CheckSstFile(const std::string& path);

// The same on a file's bytes, for tests and fuzzers. `name` is used in messages.
absl::StatusOr<SstCheck> CheckSstBytes(absl::string_view name, absl::string_view bytes);

}  // namespace ps::server::storage

#endif  // PS_SERVER_STORAGE_SST_CHECK_H_
