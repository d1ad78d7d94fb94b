// CheckpointWriter (declared in checkpoint_store.h): batches a checkpoint's records, each with
// its CRC-32C, and hands them to its CheckpointStore; the format is in
// internal/checkpoint_format.h, the durability protocol in checkpoint_store.cc.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rocksdb/slice.h"
#include "rocksdb/write_batch.h"
#include "server/storage/checkpoint_store.h"
#include "server/storage/crc32c.h"
#include "server/storage/internal/checkpoint_format.h"
#include "server/storage/rocksdb_status.h"

namespace ps::server::storage {
namespace {

using internal::EncodeFixed32;
using internal::Fingerprint;
using internal::IdCrc;
using internal::kCrcBytes;
using internal::PrintableKey;

rocksdb::Slice ToSlice(absl::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

constexpr size_t kMaxKeyBytes = size_t{64} << 10;
constexpr size_t kMaxValueBytes = size_t{1} << 30;
constexpr size_t kMaxMetadataBytes = size_t{64} << 20;

}  // namespace

CheckpointWriter::CheckpointWriter(CheckpointStore* store, uint64_t id,
                                   std::shared_ptr<rocksdb::ColumnFamilyHandle> cf)
    : store_(store),
      id_(id),
      cf_(std::move(cf)),
      id_crc_(IdCrc(id)),
      batch_(std::make_unique<rocksdb::WriteBatch>()) {}

CheckpointWriter::~CheckpointWriter() { Abort(); }

absl::Status CheckpointWriter::Put(absl::string_view key, absl::string_view value) {
  if (state_ != State::kOpen) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", id_, ": Put after Commit or Abort"));
  }
  if (key.size() > kMaxKeyBytes || value.size() > kMaxValueBytes) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "key ", PrintableKey(key), " (", key.size(), " bytes) or its value (", value.size(),
        " bytes) is too large; limits are ", kMaxKeyBytes, " and ", kMaxValueBytes)));
  }
  const uint32_t key_crc = crc32c::Extend(id_crc_, key);
  const uint32_t crc = crc32c::Extend(key_crc, value);
  char crc_bytes[kCrcBytes];
  EncodeFixed32(crc_bytes, crc);

  // SliceParts: the value is copied into the batch once, without first building crc + value.
  const rocksdb::Slice key_slice = ToSlice(key);
  const rocksdb::Slice value_parts[2] = {rocksdb::Slice(crc_bytes, kCrcBytes), ToSlice(value)};
  rocksdb::Status s = batch_->Put(cf_.get(), rocksdb::SliceParts(&key_slice, 1),
                                  rocksdb::SliceParts(value_parts, 2));
  if (!s.ok()) return Fail(FromRocksDbStatus(s, "add record to batch"));
  ++num_records_;
  bytes_ += key.size() + value.size();
  hash_ += Fingerprint(key_crc, crc);
  if (batch_->GetDataSize() >= store_->options_.write_batch_bytes) {
    RETURN_IF_ERROR(WriteBatchToDb());
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::WriteBatchToDb() {
  if (batch_->Count() == 0) return absl::OkStatus();
  absl::Status status = store_->WriteRecords(batch_.get());
  batch_->Clear();
  if (!status.ok()) return Fail(status);
  return absl::OkStatus();
}

absl::StatusOr<CheckpointInfo> CheckpointWriter::Commit(absl::string_view metadata) {
  if (state_ != State::kOpen) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", id_, ": Commit after Commit or Abort"));
  }
  if (metadata.size() > kMaxMetadataBytes) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "metadata of ", metadata.size(), " bytes exceeds the limit of ", kMaxMetadataBytes)));
  }
  RETURN_IF_ERROR(WriteBatchToDb());
  CheckpointStore::Expected expected;
  expected.num_records = num_records_;
  expected.bytes = bytes_;
  expected.hash = hash_;
  absl::StatusOr<CheckpointInfo> info =
      store_->CommitCheckpoint(id_, cf_.get(), expected, metadata);
  if (!info.ok()) return Fail(info.status());
  state_ = State::kCommitted;
  cf_.reset();
  store_->ReleaseWriter(id_, /*delete_records=*/false);
  return info;
}

void CheckpointWriter::Abort() {
  if (state_ != State::kOpen) return;
  state_ = State::kAborted;
  batch_->Clear();
  cf_.reset();
  store_->ReleaseWriter(id_, /*delete_records=*/true);
}

void CheckpointWriter::AbandonForTest() {
  if (state_ != State::kOpen) return;
  if (!WriteBatchToDb().ok()) return;  // Fail() aborted the writer already.
  state_ = State::kAborted;
  cf_.reset();
  store_->ReleaseWriter(id_, /*delete_records=*/false);
}

absl::Status CheckpointWriter::Fail(absl::Status status) {
  // A refused argument changed nothing on disk; anything else may have left RocksDB holding
  // memtables or an error state that a later checkpoint must not build on.
  if (!absl::IsInvalidArgument(status) && !absl::IsFailedPrecondition(status)) {
    store_->MarkWriteFailed(status);
  }
  Abort();
  return store_->Error(common::Annotate(status, absl::StrCat("checkpoint ", id_)));
}

}  // namespace ps::server::storage
