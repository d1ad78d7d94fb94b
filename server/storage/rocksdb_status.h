// The one conversion from rocksdb::Status to absl::Status (see STYLE.md §3). Only
// server/storage/ includes RocksDB, so this header is private to that package.
//
// Mapping (rocksdb code [subcode] -> absl code):
//   OK                                    -> OK
//   NotFound                              -> NOT_FOUND
//   Corruption                            -> DATA_LOSS (bytes on disk are wrong; no retry helps)
//   InvalidArgument                       -> INVALID_ARGUMENT
//   NotSupported                          -> UNIMPLEMENTED (e.g. a compression type not built in)
//   IOError [NoSpace]                     -> RESOURCE_EXHAUSTED (disk full; works once space is
//                                            freed)
//   IOError [PathNotFound]                -> NOT_FOUND
//   IOError "Permission denied" (EACCES), "Operation not permitted" (EPERM),
//           "Read-only file system" (EROFS)
//                                         -> PERMISSION_DENIED (the operator must fix the path)
//   IOError, anything else                -> UNAVAILABLE
//   Aborted [MemoryLimit]                 -> RESOURCE_EXHAUSTED
//   Aborted                               -> ABORTED
//   Incomplete, Busy, TryAgain, ShutdownInProgress
//                                         -> UNAVAILABLE (transient; retry later)
//   TimedOut, Expired                     -> DEADLINE_EXCEEDED
//   CompactionTooLarge                    -> RESOURCE_EXHAUSTED
//   MergeInProgress, ColumnFamilyDropped, unknown codes
//                                         -> INTERNAL (we use no merges and never write to a
//                                            dropped column family; a bug if seen)
// Why UNAVAILABLE and not INTERNAL for other I/O errors: they are environmental (device error,
// NFS, a LOCK held by another process, a path component that is not a directory), not a bug in
// this program, and the same call may succeed once the environment is fixed. INTERNAL stays
// reserved for our own bugs (STYLE.md §3).
// RocksDB's posix Env turns ENOSPC into the NoSpace subcode and ENOENT into PathNotFound; other
// errno values reach us only as strerror() text in the message, hence the text match.
#ifndef PS_SERVER_STORAGE_ROCKSDB_STATUS_H_
#define PS_SERVER_STORAGE_ROCKSDB_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rocksdb/status.h"

namespace ps::server::storage {

// Returns the absl::StatusCode that `status` maps to (table above). kOk for an OK status.
absl::StatusCode RocksDbStatusCode(const rocksdb::Status& status);

// Returns `status` converted to an absl::Status with the code from RocksDbStatusCode() and the
// message "context: <rocksdb message>" (just the RocksDB message when `context` is empty).
// RocksDB's messages name the file involved, so callers add only what RocksDB does not know (the
// store path, the checkpoint id, the operation).
absl::Status FromRocksDbStatus(const rocksdb::Status& status, absl::string_view context = "");

}  // namespace ps::server::storage

#endif  // PS_SERVER_STORAGE_ROCKSDB_STATUS_H_
