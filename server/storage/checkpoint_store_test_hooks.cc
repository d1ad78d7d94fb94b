// CheckpointStore's test hooks: they damage or count the raw records of a store.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "server/storage/checkpoint_store.h"
#include "server/storage/crc32c.h"
#include "server/storage/internal/checkpoint_format.h"
#include "server/storage/rocksdb_status.h"

namespace ps::server::storage {
namespace {

using internal::CommitKey;
using internal::EncodeFixed32;
using internal::IdCrc;
using internal::kCrcBytes;
using internal::kSupersededKey;

rocksdb::Slice ToSlice(absl::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

}  // namespace

absl::Status CheckpointStore::PutRawRecordForTest(uint64_t id, absl::string_view key,
                                                  absl::string_view value,
                                                  std::optional<uint32_t> checksum) {
  std::shared_ptr<rocksdb::ColumnFamilyHandle> cf = FindCf(id);
  if (cf == nullptr) return absl::NotFoundError(absl::StrCat("no checkpoint ", id));
  std::string stored(kCrcBytes, '\0');
  EncodeFixed32(stored.data(),
                checksum.value_or(crc32c::Extend(crc32c::Extend(IdCrc(id), key), value)));
  stored.append(value.data(), value.size());
  return Error(
      FromRocksDbStatus(db_->Put(rocksdb::WriteOptions(), cf.get(), ToSlice(key), stored)));
}

absl::Status CheckpointStore::PutCommitRecordForTest(uint64_t id, absl::string_view raw) {
  return Error(FromRocksDbStatus(
      db_->Put(rocksdb::WriteOptions(), meta_cf_.get(), CommitKey(id), ToSlice(raw))));
}

absl::Status CheckpointStore::PutSupersededRecordForTest(absl::string_view raw) {
  return Error(FromRocksDbStatus(
      db_->Put(rocksdb::WriteOptions(), meta_cf_.get(), kSupersededKey, ToSlice(raw))));
}

absl::Status CheckpointStore::DeleteRecordForTest(uint64_t id, absl::string_view key) {
  std::shared_ptr<rocksdb::ColumnFamilyHandle> cf = FindCf(id);
  if (cf == nullptr) return absl::NotFoundError(absl::StrCat("no checkpoint ", id));
  return Error(FromRocksDbStatus(db_->Delete(rocksdb::WriteOptions(), cf.get(), ToSlice(key))));
}

absl::StatusOr<uint64_t> CheckpointStore::CountRecordsForTest() {
  std::vector<std::shared_ptr<rocksdb::ColumnFamilyHandle>> cfs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, cf] : cfs_) cfs.push_back(cf);
  }
  uint64_t count = 0;
  for (const auto& cf : cfs) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf.get()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) ++count;
    RETURN_IF_ERROR(Error(FromRocksDbStatus(it->status())));
  }
  return count;
}

}  // namespace ps::server::storage
