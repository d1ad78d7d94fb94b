#include "server/storage/rocksdb_status.h"

#include "gtest/gtest.h"
#include "rocksdb/status.h"

namespace ps::server::storage {
namespace {

TEST(FromRocksDbStatus, OkIsOk) { EXPECT_TRUE(FromRocksDbStatus(rocksdb::Status::OK()).ok()); }

TEST(FromRocksDbStatus, MapsEachCode) {
  struct Case {
    rocksdb::Status in;
    absl::StatusCode want;
  };
  const Case cases[] = {
      {rocksdb::Status::NotFound("k"), absl::StatusCode::kNotFound},
      {rocksdb::Status::Corruption("block checksum mismatch"), absl::StatusCode::kDataLoss},
      {rocksdb::Status::NotSupported("zstd"), absl::StatusCode::kUnimplemented},
      {rocksdb::Status::InvalidArgument("x"), absl::StatusCode::kInvalidArgument},
      {rocksdb::Status::NoSpace("While appending to file: /d/000012.sst",
                                "No space left on device"),
       absl::StatusCode::kResourceExhausted},
      {rocksdb::Status::PathNotFound("/d/CURRENT"), absl::StatusCode::kNotFound},
      {rocksdb::Status::IOError("While mkdir if missing: /f/db", "Permission denied"),
       absl::StatusCode::kPermissionDenied},
      {rocksdb::Status::IOError("While open a file for appending: /d/LOG", "Read-only file system"),
       absl::StatusCode::kPermissionDenied},
      {rocksdb::Status::IOError("While mkdir if missing: /f/db", "Not a directory"),
       absl::StatusCode::kUnavailable},
      {rocksdb::Status::IOError("lock hold by current process"), absl::StatusCode::kUnavailable},
      {rocksdb::Status::Aborted("x"), absl::StatusCode::kAborted},
      {rocksdb::Status::MemoryLimit("x"), absl::StatusCode::kResourceExhausted},
      {rocksdb::Status::Incomplete("x"), absl::StatusCode::kUnavailable},
      {rocksdb::Status::ShutdownInProgress("x"), absl::StatusCode::kUnavailable},
      {rocksdb::Status::Busy("x"), absl::StatusCode::kUnavailable},
      {rocksdb::Status::TryAgain("x"), absl::StatusCode::kUnavailable},
      {rocksdb::Status::TimedOut("x"), absl::StatusCode::kDeadlineExceeded},
      {rocksdb::Status::Expired("x"), absl::StatusCode::kDeadlineExceeded},
      {rocksdb::Status::CompactionTooLarge("x"), absl::StatusCode::kResourceExhausted},
      {rocksdb::Status::MergeInProgress("x"), absl::StatusCode::kInternal},
      {rocksdb::Status::ColumnFamilyDropped("x"), absl::StatusCode::kInternal},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FromRocksDbStatus(c.in).code(), c.want) << c.in.ToString();
  }
}

TEST(FromRocksDbStatus, KeepsMessageAndPrependsContext) {
  absl::Status status =
      FromRocksDbStatus(rocksdb::Status::Corruption("bad block in /d/000007.sst"), "read ckpt 3");
  EXPECT_EQ(status.message(), "read ckpt 3: Corruption: bad block in /d/000007.sst");
  EXPECT_EQ(FromRocksDbStatus(rocksdb::Status::NotFound("k")).message(), "NotFound: k");
}

}  // namespace
}  // namespace ps::server::storage
