// The on-disk format (keys, values, checksums, commit record) is described in
// internal/checkpoint_format.h.
//
// Why a column family per checkpoint rather than one records family keyed by be64(id) + key:
// checkpoints are written once, read whole and deleted whole. In their own column family, with
// compaction off, a checkpoint's records are written to disk exactly once (the memtable flush;
// no WAL, see below) and deleting it is DropColumnFamily, which removes its files without reading
// them. In a shared family, RocksDB's DeleteFilesInRange skips L0 files, so reclaiming space needs
// a compaction that reads the deleted data and, if that data is corrupt, fails and stops all
// writes of the database; a corrupt old checkpoint must not stop new ones. Reads merge the
// checkpoint's L0 files (about size / write_buffer_size of them), which is fine for scans.
//
// Durability protocol (wal_for_records == false, the default):
//   1. BeginCheckpoint() writes N = id + 1 (synced) and creates the column family (a MANIFEST
//      write, which RocksDB syncs).
//   2. Records are written with the WAL off: they live in memtables and in L0 files of flushes. A
//      crash loses the memtable part, which belongs to an invisible checkpoint anyway.
//   3. Commit() flushes the column family and waits: the flush writes and fsyncs the SST files
//      and the MANIFEST, so every record is durable before step 4 starts.
//   4. The commit record is written to the WAL with sync: the one point at which the checkpoint
//      becomes visible.
// With wal_for_records == true step 3 is skipped: the records precede the synced commit record
// in the same log, and syncing the log syncs all of it.
//
// A column family without a commit record belongs to an incomplete checkpoint; Open() and
// BeginCheckpoint() (when no writer is open) drop it. Ids are never reused: Open() starts from the
// maximum of N, the newest commit record and the newest column family.
//
// Retention deletes the old commit records first (synced), then drops their column families, so
// a commit record never outlives its records. Readers hold a reference to the column family
// handle and read it together with the meta family through DB::NewIterators (one consistent
// view); RocksDB keeps a dropped family's files until its last handle is gone, so a read that
// races with retention sees the whole checkpoint or NOT_FOUND, never half of it.
#include "server/storage/checkpoint_store.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/iterator.h"
#include "rocksdb/metadata.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/write_batch.h"
#include "server/storage/crc32c.h"
#include "server/storage/internal/checkpoint_format.h"
#include "server/storage/internal/data_dir.h"
#include "server/storage/internal/rocksdb_options.h"
#include "server/storage/rocksdb_status.h"

namespace ps::server::storage {

struct CheckpointStore::ScanTotals {
  Expected found;
  std::string last_key;  // Printable; "(none)" before the first record.
};

namespace {

using internal::BigEndian64;
using internal::CfName;
using internal::CommitKey;
using internal::CommitRecord;
using internal::CreateDirs;
using internal::DecodeBigEndian64;
using internal::DecodeCommitRecord;
using internal::DecodeFixed32;
using internal::DecodeFixed64;
using internal::DecodeSuperseded;
using internal::EncodeCommitRecord;
using internal::EncodeFixed32;
using internal::EncodeSuperseded;
using internal::Fingerprint;
using internal::IdCrc;
using internal::IsCommitKey;
using internal::kCommitTag;
using internal::kCrcBytes;
using internal::kFormat;
using internal::kFormatKey;
using internal::kNextIdKey;
using internal::kSupersededKey;
using internal::MakeCheckpointCfOptions;
using internal::MakeDbOptions;
using internal::MakeMetaCfOptions;
using internal::MoveDamagedSstFilesAside;
using internal::ParseCfName;
using internal::PrintableKey;
using internal::PutFixed64;
using internal::RefuseStoreWithoutCurrent;
using internal::ScanReadOptions;
using internal::SetAsideFilesTheStoreDoesNotList;
using internal::SettleDamagedSstFiles;

absl::string_view ToView(const rocksdb::Slice& s) { return absl::string_view(s.data(), s.size()); }

// Free space below which column families are neither created nor dropped (see CheckFreeSpace).
constexpr uint64_t kMinFreeBytes = uint64_t{1} << 20;


}  // namespace

// CheckpointWriter is in checkpoint_writer.cc.

// ============================== CheckpointStore: open ==============================

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(
    const CheckpointStoreOptions& options) {
  return OpenImpl(options, rocksdb::Env::Default());
}

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::OpenWithEnvForTest(
    const CheckpointStoreOptions& options, rocksdb::Env* env) {
  return OpenImpl(options, env);
}

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::OpenImpl(
    const CheckpointStoreOptions& options, rocksdb::Env* env) {
  if (options.path.empty()) return absl::InvalidArgumentError("checkpoint store: empty path");
  const std::string context = absl::StrCat("checkpoint store ", options.path);
  if (options.keep < 1) return absl::InvalidArgumentError(context + ": keep must be >= 1");
  if (options.write_batch_bytes == 0) {
    return absl::InvalidArgumentError(context + ": write_batch_bytes must be > 0");
  }
  RETURN_IF_ERROR(FromRocksDbStatus(CreateDirs(env, options.path), context));

  const rocksdb::DBOptions db_options = MakeDbOptions(env);
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors = {
      {rocksdb::kDefaultColumnFamilyName, MakeMetaCfOptions()}};
  std::vector<uint64_t> ids;
  const bool existed = env->FileExists(options.path + "/CURRENT").ok();
  if (existed) {
    std::vector<std::string> names;
    RETURN_IF_ERROR(FromRocksDbStatus(
        rocksdb::DB::ListColumnFamilies(db_options, options.path, &names), context));
    for (const std::string& name : names) {
      if (name == rocksdb::kDefaultColumnFamilyName) continue;
      std::optional<uint64_t> id = ParseCfName(name);
      if (!id.has_value()) {
        return absl::FailedPreconditionError(absl::StrCat(
            context, ": holds a RocksDB database that is not a checkpoint store (column families ",
            absl::StrJoin(names, ", "), ")"));
      }
      ids.push_back(*id);
      descriptors.emplace_back(name, MakeCheckpointCfOptions());
    }
  }
  if (!existed) RETURN_IF_ERROR(RefuseStoreWithoutCurrent(env, options.path));
  std::vector<std::pair<std::string, absl::Status>> damaged;
  if (existed) {
    ASSIGN_OR_RETURN(damaged, MoveDamagedSstFilesAside(env, options.path), context);
  }
  if (existed) {
    RETURN_IF_ERROR_CTX(
        SetAsideFilesTheStoreDoesNotList(env, db_options, options.path, descriptors, context),
        context);
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw_db = nullptr;
  const rocksdb::Status opened =
      rocksdb::DB::Open(db_options, options.path, descriptors, &handles, &raw_db);
  RETURN_IF_ERROR(SettleDamagedSstFiles(env, damaged, opened.ok(), context));
  RETURN_IF_ERROR(FromRocksDbStatus(opened, context));

  std::unique_ptr<CheckpointStore> store(
      new CheckpointStore(options, std::unique_ptr<rocksdb::DB>(raw_db),
                          std::unique_ptr<rocksdb::ColumnFamilyHandle>(handles[0])));
  {
    absl::MutexLock lock(&store->mu_);
    for (size_t i = 0; i < ids.size(); ++i) store->cfs_[ids[i]] = store->Share(handles[i + 1]);
  }
  RETURN_IF_ERROR(store->CheckOrWriteFormat(!existed));
  RETURN_IF_ERROR(store->Recover());
  return store;
}

CheckpointStore::CheckpointStore(const CheckpointStoreOptions& options,
                                 std::unique_ptr<rocksdb::DB> db,
                                 std::unique_ptr<rocksdb::ColumnFamilyHandle> meta_cf)
    : options_(options), db_(std::move(db)), meta_cf_(std::move(meta_cf)) {}

CheckpointStore::~CheckpointStore() {
  {
    absl::MutexLock lock(&mu_);
    DCHECK(!writer_open_) << "CheckpointStore destroyed before its CheckpointWriter";
    cfs_.clear();
  }
  meta_cf_.reset();
  // Close() flushes memtables that hold WAL-less records and reports errors, which the
  // destructor of rocksdb::DB would swallow.
  rocksdb::Status s = db_->Close();
  if (!s.ok()) LOG(WARNING) << "checkpoint store " << options_.path << ": close: " << s.ToString();
}

std::shared_ptr<rocksdb::ColumnFamilyHandle> CheckpointStore::Share(
    rocksdb::ColumnFamilyHandle* handle) {
  rocksdb::DB* db = db_.get();
  return std::shared_ptr<rocksdb::ColumnFamilyHandle>(handle, [db](rocksdb::ColumnFamilyHandle* h) {
    db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  });
}

absl::Status CheckpointStore::Error(const absl::Status& status) const {
  if (absl::StartsWith(status.message(), "checkpoint store ")) return status;
  return common::Annotate(status, absl::StrCat("checkpoint store ", options_.path));
}

absl::Status CheckpointStore::CheckOrWriteFormat(bool created) {
  std::string format;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), meta_cf_.get(), kFormatKey, &format);
  if (s.ok()) {
    if (format == kFormat) return absl::OkStatus();
    return Error(absl::FailedPreconditionError(absl::StrCat(
        "holds format \"", absl::CHexEscape(format), "\"; this build reads \"", kFormat, "\"")));
  }
  if (!s.IsNotFound()) return Error(FromRocksDbStatus(s, "read format record"));
  if (!created) {
    // An existing database without a format record is someone else's, unless it is empty (a
    // crash between RocksDB creating the directory and us writing the record).
    bool empty = false;
    {
      absl::MutexLock lock(&mu_);
      empty = cfs_.empty();
    }
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), meta_cf_.get()));
    it->SeekToFirst();
    RETURN_IF_ERROR(Error(FromRocksDbStatus(it->status(), "scan for format record")));
    if (it->Valid() || !empty) {
      return Error(absl::FailedPreconditionError(
          "holds a RocksDB database that is not a checkpoint store (no format record)"));
    }
  }
  rocksdb::WriteOptions write_options;
  write_options.sync = true;
  return Error(FromRocksDbStatus(db_->Put(write_options, meta_cf_.get(), kFormatKey, kFormat),
                                 "write format record"));
}

absl::Status CheckpointStore::Recover() {
  uint64_t next_id = 1;
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), meta_cf_.get(), kNextIdKey, &value);
  if (s.ok()) {
    if (value.size() != 8) return Error(absl::DataLossError("next-id record is corrupt"));
    next_id = std::max(next_id, DecodeFixed64(value.data()));
  } else if (!s.IsNotFound()) {
    return Error(FromRocksDbStatus(s, "read next id"));
  }
  // Only keys: a damaged commit record must not keep the store from opening (List() and Read()
  // report it).
  ASSIGN_OR_RETURN(std::vector<uint64_t> committed, CommitIds());
  if (!committed.empty()) next_id = std::max(next_id, committed.back() + 1);
  absl::MutexLock lock(&mu_);
  if (!cfs_.empty()) next_id = std::max(next_id, cfs_.rbegin()->first + 1);
  next_id_ = next_id;
  // No retention here: which complete checkpoints verify is known only once the opener's
  // restore has read them (ApplyRetentionNow).
  return DeleteIncomplete();
}

// ============================== CheckpointStore: bookkeeping ==============================

absl::StatusOr<std::vector<uint64_t>> CheckpointStore::CommitIds() {
  std::vector<uint64_t> ids;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), meta_cf_.get()));
  for (it->Seek(std::string(1, kCommitTag)); it->Valid() && IsCommitKey(ToView(it->key()));
       it->Next()) {
    ids.push_back(DecodeBigEndian64(it->key().data() + 1));
  }
  RETURN_IF_ERROR(Error(FromRocksDbStatus(it->status(), "list commit records")));
  return ids;
}

std::shared_ptr<rocksdb::ColumnFamilyHandle> CheckpointStore::FindCf(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = cfs_.find(id);
  return it == cfs_.end() ? nullptr : it->second;
}

absl::Status CheckpointStore::DeleteIncomplete() {
  ASSIGN_OR_RETURN(std::vector<uint64_t> committed, CommitIds());
  std::vector<uint64_t> incomplete;
  for (const auto& [id, cf] : cfs_) {
    if (!std::binary_search(committed.begin(), committed.end(), id)) incomplete.push_back(id);
  }
  return DropCheckpoints(std::move(incomplete));
}

absl::Status CheckpointStore::CheckFreeSpace(absl::string_view what) {
  // Creating or dropping a column family appends to the MANIFEST outside RocksDB's background
  // error handling. If that append fails for lack of space, a later DB::Resume() hits an
  // assert() in RocksDB 7.8 (ResumeImpl: file_deletion_disabled), which Debian's build keeps,
  // and aborts the process. So those operations run only with some room left; the record
  // writes and flushes, which do go through the error handler, are not gated.
  uint64_t free_bytes = 0;
  rocksdb::Status s = db_->GetEnv()->GetFreeSpace(options_.path, &free_bytes);
  if (!s.ok() || free_bytes >= kMinFreeBytes) return absl::OkStatus();  // Unknown: let I/O tell.
  return Error(absl::ResourceExhaustedError(
      absl::StrCat(what, ": only ", free_bytes, " bytes free (No space left on device)")));
}

absl::Status CheckpointStore::DropCheckpoints(std::vector<uint64_t> ids) {
  if (ids.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckFreeSpace(absl::StrCat("drop checkpoints ", absl::StrJoin(ids, ", "))));
  for (uint64_t id : ids) {
    auto it = cfs_.find(id);
    if (it == cfs_.end() || in_doubt_.count(id) > 0) continue;
    // Durable in the MANIFEST. Files go once no reader holds the handle any more.
    RETURN_IF_ERROR(Error(FromRocksDbStatus(db_->DropColumnFamily(it->second.get()),
                                            absl::StrCat("drop checkpoint ", id))));
    cfs_.erase(it);
    VLOG(1) << "checkpoint store " << options_.path << ": dropped checkpoint " << id;
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::ApplyRetentionNow() {
  absl::MutexLock lock(&mu_);
  return ApplyRetention();
}

absl::Status CheckpointStore::ApplyRetention() {
  ASSIGN_OR_RETURN(std::vector<uint64_t> committed, CommitIds());
  absl::StatusOr<std::vector<uint64_t>> superseded = ReadSuperseded();
  if (!superseded.ok()) {
    if (!absl::IsDataLoss(superseded.status())) return superseded.status();
    // Which ones are current is unknown: deleting by id alone could delete them all.
    LOG(ERROR) << superseded.status()
               << ": keeping every checkpoint until a restore of an explicit id writes it anew";
    return absl::OkStatus();
  }
  // A checkpoint is kept while fewer than `keep` checkpoints newer than it are current (not
  // superseded): the newest `keep` current ones, so the newest complete current checkpoint
  // always survives, and superseded ones until as many current ones are newer. The count only
  // grows towards older ids, so what is kept is every id from `oldest_kept` up.
  uint64_t oldest_kept = 0;
  size_t current_newer = 0;
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    if (current_newer >= options_.keep) break;
    oldest_kept = *it;
    if (!std::binary_search(superseded->begin(), superseded->end(), *it)) ++current_newer;
  }
  if (committed.empty() || oldest_kept == committed.front()) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  for (uint64_t id : committed) {
    if (id >= oldest_kept) break;
    RETURN_IF_ERROR(Error(FromRocksDbStatus(batch.Delete(meta_cf_.get(), CommitKey(id)))));
  }
  std::vector<uint64_t> still_superseded;
  for (uint64_t id : *superseded) {
    if (id >= oldest_kept) still_superseded.push_back(id);
  }
  if (still_superseded.size() != superseded->size()) {
    RETURN_IF_ERROR(Error(FromRocksDbStatus(
        still_superseded.empty()
            ? batch.Delete(meta_cf_.get(), kSupersededKey)
            : batch.Put(meta_cf_.get(), kSupersededKey, EncodeSuperseded(still_superseded)))));
  }
  // Synced (whatever options_.sync says) before any records go: dropping a column family is
  // durable at once, and a commit record must never outlive its records.
  rocksdb::WriteOptions write_options;
  write_options.sync = true;
  RETURN_IF_ERROR(
      Error(FromRocksDbStatus(db_->Write(write_options, &batch), "delete old commit records")));
  std::vector<uint64_t> old;
  for (const auto& [id, cf] : cfs_) {
    if (id < oldest_kept) old.push_back(id);
  }
  LOG(INFO) << "checkpoint store " << options_.path << ": deleting checkpoints below "
            << oldest_kept;
  return DropCheckpoints(std::move(old));
}

absl::StatusOr<std::vector<uint64_t>> CheckpointStore::ReadSuperseded() {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), meta_cf_.get(), kSupersededKey, &value);
  if (s.IsNotFound()) return std::vector<uint64_t>{};
  RETURN_IF_ERROR(Error(FromRocksDbStatus(s, "read the superseded checkpoints")));
  absl::StatusOr<std::vector<uint64_t>> ids = DecodeSuperseded(value);
  if (!ids.ok()) return Error(ids.status());
  return ids;
}

absl::StatusOr<std::vector<uint64_t>> CheckpointStore::Superseded() { return ReadSuperseded(); }

absl::Status CheckpointStore::MakeCurrent(uint64_t id) {
  absl::MutexLock lock(&mu_);  // against retention's rewrite of the record
  ASSIGN_OR_RETURN(std::vector<uint64_t> committed, CommitIds());
  if (id != 0 && !std::binary_search(committed.begin(), committed.end(), id)) {
    return Error(absl::NotFoundError(absl::StrCat("no complete checkpoint ", id)));
  }
  absl::StatusOr<std::vector<uint64_t>> old = ReadSuperseded();
  const bool corrupt = !old.ok();
  if (corrupt) {
    if (!absl::IsDataLoss(old.status())) return old.status();
    LOG(WARNING) << old.status() << ": written anew";
    old = std::vector<uint64_t>{};
  }
  std::set<uint64_t> superseded(old->begin(), old->end());
  for (uint64_t c : committed) {
    if (c > id) superseded.insert(c);
  }
  superseded.erase(id);
  std::vector<uint64_t> ids;
  for (uint64_t c : superseded) {
    if (std::binary_search(committed.begin(), committed.end(), c)) ids.push_back(c);
  }
  if (ids == *old && !corrupt) return absl::OkStatus();
  rocksdb::WriteOptions write_options;
  write_options.sync = true;
  rocksdb::Status s =
      ids.empty() ? db_->Delete(write_options, meta_cf_.get(), kSupersededKey)
                  : db_->Put(write_options, meta_cf_.get(), kSupersededKey, EncodeSuperseded(ids));
  RETURN_IF_ERROR(Error(FromRocksDbStatus(s, "record the superseded checkpoints")));
  if (!ids.empty()) {
    LOG(INFO) << "checkpoint store " << options_.path << ": checkpoint " << id
              << " is current; superseded: " << absl::StrJoin(ids, ", ");
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::PutNextId(uint64_t next_id) {
  std::string value;
  PutFixed64(&value, next_id);
  rocksdb::WriteOptions write_options;
  write_options.sync = options_.sync;
  return Error(FromRocksDbStatus(db_->Put(write_options, meta_cf_.get(), kNextIdKey, value),
                                 "record next checkpoint id"));
}

// ============================== CheckpointStore: writing ==============================

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointStore::BeginCheckpoint() {
  absl::MutexLock lock(&mu_);
  if (writer_open_) {
    return Error(absl::FailedPreconditionError(
        "another checkpoint is being written; commit or abort it first"));
  }
  if (!write_failure_.ok()) {
    return Error(absl::FailedPreconditionError(absl::StrCat(
        "an earlier checkpoint failed writing (", write_failure_.message(),
        "); reopen the store so that the next one starts from the files on disk")));
  }
  RETURN_IF_ERROR(CheckFreeSpace("begin checkpoint"));
  // First, so that their files and any memtable a failed flush left behind are gone before
  // Resume() below would try to flush it again.
  RETURN_IF_ERROR(DeleteIncomplete());
  // A disk-full or I/O error in an earlier flush leaves RocksDB refusing writes until it
  // recovers. Resume() returns at once on a healthy database and retries the recovery
  // otherwise, so a checkpoint succeeds again as soon as the cause is gone. Busy means RocksDB
  // is already retrying a transient I/O error by itself; the writes below then either succeed
  // or fail with that error.
  rocksdb::Status resumed = db_->Resume();
  if (!resumed.ok() && !resumed.IsBusy()) {
    return WriteFailed(FromRocksDbStatus(resumed, "recover from an earlier write error"));
  }
  const uint64_t id = next_id_;
  // Before the column family exists, so that no crash can leave records under a reusable id.
  absl::Status next_id = PutNextId(id + 1);
  if (!next_id.ok()) return WriteFailed(next_id);
  next_id_ = id + 1;
  rocksdb::ColumnFamilyHandle* raw = nullptr;
  absl::Status created =
      FromRocksDbStatus(db_->CreateColumnFamily(MakeCheckpointCfOptions(), CfName(id), &raw),
                        absl::StrCat("create checkpoint ", id));
  if (!created.ok()) return WriteFailed(created);
  std::shared_ptr<rocksdb::ColumnFamilyHandle> cf = Share(raw);
  cfs_[id] = cf;
  writer_open_ = true;
  return std::unique_ptr<CheckpointWriter>(new CheckpointWriter(this, id, std::move(cf)));
}

absl::Status CheckpointStore::WriteRecords(rocksdb::WriteBatch* batch) {
  rocksdb::WriteOptions write_options;
  write_options.disableWAL = !options_.wal_for_records;
  return FromRocksDbStatus(db_->Write(write_options, batch), "write records");
}

absl::StatusOr<CheckpointInfo> CheckpointStore::CommitCheckpoint(uint64_t id,
                                                                 rocksdb::ColumnFamilyHandle* cf,
                                                                 const Expected& expected,
                                                                 absl::string_view metadata) {
  std::optional<uint64_t> in_files;  // Entries in the table files; with the WAL, not counted.
  if (!options_.wal_for_records) {
    rocksdb::FlushOptions flush;
    flush.wait = true;
    flush.allow_write_stall = true;  // Nothing else writes to this column family.
    RETURN_IF_ERROR(FromRocksDbStatus(db_->Flush(flush, cf), "flush records"));
    // A flush can return OK without having written the records (seen after a disk-full error:
    // they stayed in the memtable, the read-back below found them there, and the checkpoint
    // was empty after a restart). Only files on disk count.
    ASSIGN_OR_RETURN(in_files, CountRecordsOnDisk(cf));
  }
  if (options_.verify_before_commit) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ScanReadOptions(), cf));
    ASSIGN_OR_RETURN(ScanTotals totals, ScanRecords(id, it.get(), expected.num_records, nullptr),
                     "read back before commit");
    // Every record just written read back with a good checksum, so fewer records than Puts
    // means a key was repeated (the later Put replaced the earlier one).
    if (totals.found.num_records < expected.num_records) {
      return absl::InvalidArgumentError(
          absl::StrCat(expected.num_records, " Puts but ", totals.found.num_records,
                       " distinct keys: each key may be Put once per checkpoint"));
    }
    RETURN_IF_ERROR_CTX(CheckTotals(id, totals, expected), "read back before commit");
  }
  if (in_files.has_value() && *in_files != expected.num_records) {
    return absl::DataLossError(absl::StrCat(*in_files, " records in table files after the flush, ",
                                            expected.num_records, " written"));
  }
  CommitRecord record;
  record.info.id = id;
  record.info.metadata = std::string(metadata);
  record.info.num_records = expected.num_records;
  record.info.bytes = expected.bytes;
  record.info.unix_micros = absl::ToUnixMicros(absl::Now());
  record.hash = expected.hash;
  rocksdb::WriteOptions write_options;
  write_options.sync = options_.sync;
  rocksdb::Status written =
      db_->Put(write_options, meta_cf_.get(), CommitKey(id), EncodeCommitRecord(record));
  if (!written.ok()) {
    // E.g. the log append succeeded but its fsync failed: the record is not visible now, yet
    // recovery at the next Open() may replay it, and then it must find its records.
    absl::MutexLock lock(&mu_);
    in_doubt_.insert(id);
    return FromRocksDbStatus(written, "write commit record");
  }

  // The checkpoint is complete; failing to delete old ones must not make the caller believe it
  // is not. The next commit (or the opener's ApplyRetentionNow) retries, since retention deletes
  // everything beyond `keep`.
  absl::MutexLock lock(&mu_);
  absl::Status retention = ApplyRetention();
  if (!retention.ok()) {
    LOG(WARNING) << "checkpoint " << id
                 << " committed, but deleting old checkpoints failed: " << retention;
  }
  return record.info;
}

absl::StatusOr<uint64_t> CheckpointStore::CountRecordsOnDisk(rocksdb::ColumnFamilyHandle* cf) {
  for (const char* property :
       {"rocksdb.num-entries-active-mem-table", "rocksdb.num-entries-imm-mem-tables"}) {
    uint64_t in_memory = 0;
    if (!db_->GetIntProperty(cf, property, &in_memory)) {
      return absl::InternalError(absl::StrCat("no property ", property));
    }
    if (in_memory != 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the flush reported success but ", in_memory,
          " records are still only in memory (", property, "); the disk may be full"));
    }
  }
  rocksdb::ColumnFamilyMetaData meta;
  db_->GetColumnFamilyMetaData(cf, &meta);
  uint64_t in_files = 0;
  for (const rocksdb::LevelMetaData& level : meta.levels) {
    for (const rocksdb::SstFileMetaData& file : level.files) {
      const std::string path = file.db_path + "/" + file.name;
      uint64_t size = 0;
      rocksdb::Status s = db_->GetEnv()->GetFileSize(path, &size);
      if (!s.ok() || size != file.size) {
        return absl::DataLossError(absl::StrCat("table file ", path,
                                                " is missing or has the wrong size (",
                                                s.ok() ? absl::StrCat(size) : s.ToString(),
                                                ", expected ", file.size, ")"));
      }
      in_files += file.num_entries;
    }
  }
  return in_files;
}

void CheckpointStore::MarkWriteFailed(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (write_failure_.ok()) write_failure_ = status;
}

absl::Status CheckpointStore::WriteFailed(const absl::Status& status) {
  if (write_failure_.ok()) write_failure_ = status;
  return Error(status);
}

bool CheckpointStore::NeedsReopen() {
  absl::MutexLock lock(&mu_);
  return !write_failure_.ok();
}

void CheckpointStore::ReleaseWriter(uint64_t id, bool delete_records) {
  absl::MutexLock lock(&mu_);
  writer_open_ = false;
  if (!delete_records) return;
  absl::Status status = DropCheckpoints({id});
  if (!status.ok()) {
    // Dropped on purpose: the writer is going away and has no one to report to. The column
    // family has no commit record, so the next BeginCheckpoint() or Open() drops it.
    LOG(WARNING) << "abort checkpoint " << id << ": " << status;
  }
}

// ============================== CheckpointStore: reading ==============================

absl::StatusOr<CheckpointStore::ScanTotals> CheckpointStore::ScanRecords(
    uint64_t id, rocksdb::Iterator* records, uint64_t max_records,
    const std::function<absl::Status(absl::string_view, absl::string_view)>* visit) {
  const uint32_t id_crc = IdCrc(id);
  Expected found;
  std::string last_key;
  for (records->SeekToFirst(); records->Valid(); records->Next()) {
    const absl::string_view key = ToView(records->key());
    const absl::string_view stored_value = ToView(records->value());
    if (stored_value.size() < kCrcBytes) {
      return absl::DataLossError(absl::StrCat("checkpoint ", id, ", key ", PrintableKey(key),
                                              ": stored value too short for its checksum"));
    }
    const absl::string_view value = stored_value.substr(kCrcBytes);
    const uint32_t key_crc = crc32c::Extend(id_crc, key);
    const uint32_t crc = crc32c::Extend(key_crc, value);
    const uint32_t stored_crc = DecodeFixed32(stored_value.data());
    if (crc != stored_crc) {
      return absl::DataLossError(
          absl::StrFormat("checkpoint %d, key %s: checksum mismatch (stored %08x, computed %08x)",
                          id, PrintableKey(key), stored_crc, crc));
    }
    if (++found.num_records > max_records) {
      return absl::DataLossError(absl::StrCat("checkpoint ", id, ", key ", PrintableKey(key),
                                              ": extra record (the commit record counts ",
                                              max_records, ")"));
    }
    found.bytes += key.size() + value.size();
    found.hash += Fingerprint(key_crc, crc);
    if (visit != nullptr) RETURN_IF_ERROR((*visit)(key, value));
    last_key.assign(key.data(), key.size());
  }
  ScanTotals totals;
  totals.found = found;
  totals.last_key = found.num_records == 0 ? std::string("(none)") : PrintableKey(last_key);
  if (!records->status().ok()) {
    // Typically a RocksDB block checksum mismatch (DATA_LOSS); the key that sits in the bad
    // block is unknown, the last good one is not.
    return FromRocksDbStatus(records->status(),
                             absl::StrCat("checkpoint ", id, ", after key ", totals.last_key));
  }
  return totals;
}

absl::Status CheckpointStore::CheckTotals(uint64_t id, const ScanTotals& totals,
                                          const Expected& expected) {
  const Expected& found = totals.found;
  if (found.num_records != expected.num_records) {
    return absl::DataLossError(absl::StrCat("checkpoint ", id, ": ", found.num_records,
                                            " records found, ", expected.num_records,
                                            " committed; last key read ", totals.last_key));
  }
  if (found.bytes != expected.bytes || found.hash != expected.hash) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", id, ": records differ from the committed ones (", found.bytes,
        " bytes found, ", expected.bytes, " committed",
        found.hash != expected.hash ? ", hash differs" : "", "); last key read ", totals.last_key));
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::ReadImpl(
    uint64_t id, const std::function<absl::Status(absl::string_view, absl::string_view)>* visit) {
  const std::string context = absl::StrCat("read checkpoint ", id);
  // Holding `cf` keeps the checkpoint's files even if retention drops it meanwhile.
  std::shared_ptr<rocksdb::ColumnFamilyHandle> cf = FindCf(id);
  if (cf == nullptr) {
    // Retention deletes the commit record before the records, so a commit record seen after
    // the records are gone means they were lost, not deleted.
    std::string unused;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), meta_cf_.get(), CommitKey(id), &unused);
    if (s.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", id,
                                              ": committed, but its records (column family ",
                                              CfName(id), ") are missing"));
    }
    if (!s.IsNotFound()) return FromRocksDbStatus(s, context);
    return absl::NotFoundError(absl::StrCat("no complete checkpoint ", id));
  }
  std::vector<rocksdb::Iterator*> raw;
  RETURN_IF_ERROR(FromRocksDbStatus(
      db_->NewIterators(ScanReadOptions(), {meta_cf_.get(), cf.get()}, &raw), context));
  std::unique_ptr<rocksdb::Iterator> meta(raw[0]), records(raw[1]);

  const std::string commit_key = CommitKey(id);
  meta->Seek(commit_key);
  if (!meta->Valid() || ToView(meta->key()) != commit_key) {
    RETURN_IF_ERROR(FromRocksDbStatus(meta->status(), context));
    return absl::NotFoundError(absl::StrCat("no complete checkpoint ", id));
  }
  ASSIGN_OR_RETURN(CommitRecord commit, DecodeCommitRecord(id, ToView(meta->value())));
  Expected expected;
  expected.num_records = commit.info.num_records;
  expected.bytes = commit.info.bytes;
  expected.hash = commit.hash;
  ASSIGN_OR_RETURN(ScanTotals totals, ScanRecords(id, records.get(), expected.num_records, visit));
  return CheckTotals(id, totals, expected);
}

absl::Status CheckpointStore::Read(
    uint64_t id,
    const std::function<absl::Status(absl::string_view key, absl::string_view value)>& visit) {
  bool visitor_failed = false;
  const std::function<absl::Status(absl::string_view, absl::string_view)> wrapped =
      [&](absl::string_view key, absl::string_view value) {
        absl::Status status = visit(key, value);
        visitor_failed = !status.ok();
        return status;
      };
  absl::Status status = ReadImpl(id, &wrapped);
  if (status.ok() || visitor_failed) return status;  // The visitor's errors pass unchanged.
  return Error(status);
}

absl::Status CheckpointStore::Verify(uint64_t id) { return Error(ReadImpl(id, nullptr)); }

absl::StatusOr<std::optional<CheckpointInfo>> CheckpointStore::Latest() {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), meta_cf_.get()));
  it->SeekForPrev(CommitKey(std::numeric_limits<uint64_t>::max()));
  if (!it->Valid() || !IsCommitKey(ToView(it->key()))) {
    RETURN_IF_ERROR(Error(FromRocksDbStatus(it->status(), "find latest checkpoint")));
    return std::optional<CheckpointInfo>();
  }
  const uint64_t id = DecodeBigEndian64(it->key().data() + 1);
  absl::StatusOr<CommitRecord> record = DecodeCommitRecord(id, ToView(it->value()));
  if (!record.ok()) return Error(record.status());
  return std::optional<CheckpointInfo>(std::move(record->info));
}

absl::StatusOr<std::vector<CheckpointInfo>> CheckpointStore::List(
    std::vector<absl::Status>* unreadable) {
  std::vector<CheckpointInfo> result;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), meta_cf_.get()));
  for (it->Seek(std::string(1, kCommitTag)); it->Valid() && IsCommitKey(ToView(it->key()));
       it->Next()) {
    const uint64_t id = DecodeBigEndian64(it->key().data() + 1);
    absl::StatusOr<CommitRecord> record = DecodeCommitRecord(id, ToView(it->value()));
    if (!record.ok() && unreadable != nullptr) {
      unreadable->push_back(Error(record.status()));
      continue;
    }
    if (!record.ok()) return Error(record.status());
    result.push_back(std::move(record->info));
  }
  RETURN_IF_ERROR(Error(FromRocksDbStatus(it->status(), "list checkpoints")));
  return result;
}

uint64_t CheckpointStore::ApproximateSizeBytes() {
  std::vector<std::shared_ptr<rocksdb::ColumnFamilyHandle>> cfs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, cf] : cfs_) cfs.push_back(cf);
  }
  uint64_t total = 0;
  auto add = [&](rocksdb::ColumnFamilyHandle* cf) {
    for (const char* property : {"rocksdb.live-sst-files-size", "rocksdb.size-all-mem-tables"}) {
      uint64_t value = 0;
      if (db_->GetIntProperty(cf, property, &value)) total += value;
    }
  };
  add(meta_cf_.get());
  for (const auto& cf : cfs) add(cf.get());
  return total;
}

}  // namespace ps::server::storage
