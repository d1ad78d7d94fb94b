#include "server/storage/rocksdb_status.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ps::server::storage {
namespace {

// strerror() texts (glibc) for errno values that mean "not allowed here", which RocksDB's posix
// Env reports as a plain IOError with the text in the message.
bool IsPermissionError(absl::string_view message) {
  return absl::StrContains(message, "Permission denied") ||        // EACCES
         absl::StrContains(message, "Operation not permitted") ||  // EPERM
         absl::StrContains(message, "Read-only file system");      // EROFS
}

absl::StatusCode IoErrorCode(const rocksdb::Status& status) {
  if (status.IsNoSpace()) return absl::StatusCode::kResourceExhausted;
  if (status.IsPathNotFound()) return absl::StatusCode::kNotFound;
  if (IsPermissionError(status.ToString())) return absl::StatusCode::kPermissionDenied;
  return absl::StatusCode::kUnavailable;
}

}  // namespace

absl::StatusCode RocksDbStatusCode(const rocksdb::Status& status) {
  switch (status.code()) {
    case rocksdb::Status::kOk:
      return absl::StatusCode::kOk;
    case rocksdb::Status::kNotFound:
      return absl::StatusCode::kNotFound;
    case rocksdb::Status::kCorruption:
      return absl::StatusCode::kDataLoss;
    case rocksdb::Status::kNotSupported:
      return absl::StatusCode::kUnimplemented;
    case rocksdb::Status::kInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case rocksdb::Status::kIOError:
      return IoErrorCode(status);
    case rocksdb::Status::kAborted:
      return status.IsMemoryLimit() ? absl::StatusCode::kResourceExhausted
                                    : absl::StatusCode::kAborted;
    case rocksdb::Status::kIncomplete:
    case rocksdb::Status::kShutdownInProgress:
    case rocksdb::Status::kBusy:
    case rocksdb::Status::kTryAgain:
      return absl::StatusCode::kUnavailable;
    case rocksdb::Status::kTimedOut:
    case rocksdb::Status::kExpired:
      return absl::StatusCode::kDeadlineExceeded;
    case rocksdb::Status::kCompactionTooLarge:
      return absl::StatusCode::kResourceExhausted;
    default:  // kMergeInProgress, kColumnFamilyDropped: we use neither merges nor DropColumnFamily.
      return absl::StatusCode::kInternal;
  }
}

absl::Status FromRocksDbStatus(const rocksdb::Status& status, absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  std::string message = status.ToString();
  if (!context.empty()) message = absl::StrCat(context, ": ", message);
  return absl::Status(RocksDbStatusCode(status), message);
}

}  // namespace ps::server::storage
