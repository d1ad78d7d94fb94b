// Durable checkpoints of one parameter-server shard, stored in RocksDB.
//
// The shard's in-memory tables are the working copy; this store only writes and reads whole
// checkpoints. A checkpoint is a set of (key, value) records plus a metadata blob, identified by
// an id that increases strictly, also across restarts:
//
//   ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWriter> writer, store->BeginCheckpoint());
//   for (...) RETURN_IF_ERROR(writer->Put(key, value));       // any key order
//   ASSIGN_OR_RETURN(CheckpointInfo info, writer->Commit(metadata));
//
//   ASSIGN_OR_RETURN(std::optional<CheckpointInfo> latest, store->Latest());
//   RETURN_IF_ERROR(store->Verify(latest->id));               // refuse a corrupt one up front
//   RETURN_IF_ERROR(store->Read(latest->id, load_record));
//
// Guarantees:
// - A checkpoint exists only once its commit record is written (last, and fsynced when
//   `sync`). A crash (SIGKILL, power loss) at any earlier moment leaves no visible checkpoint;
//   its partial records are deleted by the next Open() or BeginCheckpoint().
// - Every value carries a CRC-32C over the checkpoint id (8 bytes, big-endian), the key and the
//   value, so a flipped bit in a key or a value is found per record. The commit record holds
//   the record count, the byte count and an order-independent hash over all (key, checksum)
//   pairs, so a lost or extra record is found too. RocksDB's block checksums are verified on
//   every read as well.
// - Retention deletes only checkpoints older than the `keep` newest complete ones, and only
//   after a new checkpoint has completed or when the opener asks (ApplyRetentionNow, after
//   its restore has verified the checkpoint it took); the newest complete checkpoint is never
//   touched. Open() deletes no complete checkpoint: it cannot know which ones verify.
// - Checkpoints are isolated on disk (one RocksDB column family each, see the .cc), so damaged
//   data of one checkpoint does not stop reading, deleting or writing the others. (A truncated
//   or missing file is the exception: RocksDB then refuses to open the store, DATA_LOSS. So is
//   damage to an SST file's table structure, its footer, index or meta blocks, which Open()
//   checks in every file before RocksDB parses them: see sst_check.h. A damaged table file
//   that is not part of the store, such as one a killed process was writing, is moved into
//   the subdirectory set-aside/.)
// - Nothing that may hold checkpoints is deleted on open: a directory that holds RocksDB files
//   but no CURRENT file is refused (DATA_LOSS) instead of being opened as a new store.
// - A checkpoint is visible only after its records were read back from the table files on
//   disk (none left in memory) and matched count, bytes and hash. After a failed checkpoint
//   the store must be reopened before the next (see BeginCheckpoint).
//
// Error codes used throughout (rocksdb_status.h has the full RocksDB mapping):
//   DATA_LOSS           stored bytes are corrupt (message names the checkpoint id and the key)
//   RESOURCE_EXHAUSTED  disk full; a later checkpoint succeeds once space is freed
//   PERMISSION_DENIED   the directory or a file in it may not be written
//   UNAVAILABLE         other I/O errors (device error, path under a regular file, the store
//                       is open in another process)
//   FAILED_PRECONDITION the directory holds a RocksDB that is not a checkpoint store (or one of
//                       another format version), or a call came in the wrong state
// Messages name the store's path.
#ifndef PS_SERVER_STORAGE_CHECKPOINT_STORE_H_
#define PS_SERVER_STORAGE_CHECKPOINT_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

// Only server/storage/ includes RocksDB headers; users of this header see declarations only.
namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Env;
class Iterator;
class WriteBatch;
}  // namespace rocksdb

namespace ps::server::storage {

struct CheckpointStoreOptions {
  // RocksDB directory of this shard's store; created (with missing parents) if missing.
  // REQUIRES: not empty; used by one process at a time (RocksDB's LOCK file enforces it).
  std::string path;

  // Number of complete checkpoints kept. Older ones are deleted after a new one completes, so
  // the disk must hold keep + 1 checkpoints while one is being written. REQUIRES: >= 1.
  uint32_t keep = 2;

  // fsync the commit record and the next-id record. With false, a power loss (not a process
  // crash) may lose the newest commits; the store stays consistent either way.
  bool sync = true;

  // Records are buffered into a WriteBatch of about this many bytes before it is written to
  // RocksDB. Bigger batches amortize the write path; memory use is about twice this.
  size_t write_batch_bytes = 4 << 20;

  // Commit() reads the checkpoint back (checksums, count, hash) before writing the commit
  // record, so that a checkpoint that would fail Verify() never becomes visible and a key Put
  // twice is reported to the writer instead of looking like corruption later. It reads data
  // that was just written, mostly from the page cache; the cost is measured by
  // checkpoint_bench.
  bool verify_before_commit = true;

  // Write the bulk records through RocksDB's write-ahead log. Default false: records skip the
  // WAL and Commit() flushes them into fsynced SST files before writing the (WAL-logged, synced)
  // commit record. That writes each byte once instead of twice and is as durable, because a
  // crash before the commit record loses only records of an invisible checkpoint.
  // checkpoint_bench measures both.
  bool wal_for_records = false;
};

// Describes one complete checkpoint; read from its commit record.
struct CheckpointInfo {
  uint64_t id = 0;
  std::string metadata;      // The blob given to Commit().
  uint64_t num_records = 0;  // Records Put.
  uint64_t bytes = 0;        // Sum of key and value sizes over all records.
  int64_t unix_micros = 0;   // Wall time of the commit.
};

class CheckpointStore;

// Streams the records of one checkpoint into the store. Obtained from
// CheckpointStore::BeginCheckpoint(). Thread-compatible: callers synchronize.
// State machine: OPEN -> COMMITTED (Commit() succeeded) or OPEN -> ABORTED (Abort(), the
// destructor, or any failed Put()/Commit()). An aborted checkpoint's records are deleted.
// REQUIRES: the store outlives the writer while it is OPEN.
class CheckpointWriter {
 public:
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Aborts the checkpoint unless it was committed.
  ~CheckpointWriter();

  // The id of the checkpoint being written.
  uint64_t id() const { return id_; }

  // Adds one record. Records are buffered and written in batches, so an I/O error may surface
  // on a later Put() or on Commit(). REQUIRES: each key is Put at most once per checkpoint.
  // Errors: INVALID_ARGUMENT (value over 1 GiB or key over 64 KiB), FAILED_PRECONDITION (not
  // OPEN), RESOURCE_EXHAUSTED / PERMISSION_DENIED / UNAVAILABLE from a batch write; any error
  // aborts the checkpoint.
  [[nodiscard]] absl::Status Put(absl::string_view key, absl::string_view value);

  // Makes the checkpoint durable and visible: flushes the records, verifies them (see
  // CheckpointStoreOptions::verify_before_commit), then writes the commit record holding
  // `metadata`, the record count, byte count and hash. Afterwards deletes checkpoints beyond
  // `keep` (a failure there is logged and retried after the next commit; it does not fail
  // this call, because the checkpoint is already complete).
  // Errors (the checkpoint is aborted on each): FAILED_PRECONDITION (not OPEN),
  // INVALID_ARGUMENT (metadata over 64 MiB; a key was Put twice), DATA_LOSS (read-back failed),
  // RESOURCE_EXHAUSTED / PERMISSION_DENIED / UNAVAILABLE (I/O). If writing the commit record
  // itself fails, the checkpoint is invisible now but RocksDB may still recover the record from
  // its log when the store is next opened; its records are kept until then, and Open() finds
  // it either complete and valid or incomplete and deletes it.
  [[nodiscard]] absl::StatusOr<CheckpointInfo> Commit(absl::string_view metadata);

  // Discards the checkpoint: deletes its records (best effort; anything left is deleted by the
  // next BeginCheckpoint() or Open()). No-op unless OPEN.
  void Abort();

  // Leaves the records in place and lets the store begin another checkpoint, as if the process
  // had died mid-checkpoint. The writer is ABORTED afterwards.
  void AbandonForTest();

 private:
  friend class CheckpointStore;
  enum class State { kOpen, kCommitted, kAborted };

  CheckpointWriter(CheckpointStore* store, uint64_t id,
                   std::shared_ptr<rocksdb::ColumnFamilyHandle> cf);
  absl::Status WriteBatchToDb();
  absl::Status Fail(absl::Status status);  // Aborts and returns `status` annotated.

  CheckpointStore* const store_;  // Not owned.
  const uint64_t id_;
  // The checkpoint's records; released when the writer leaves OPEN, so that a finished writer
  // may outlive the store.
  std::shared_ptr<rocksdb::ColumnFamilyHandle> cf_;
  const uint32_t id_crc_;  // CRC-32C of the big-endian id, the start of every record's CRC.
  State state_ = State::kOpen;
  std::unique_ptr<rocksdb::WriteBatch> batch_;
  uint64_t num_records_ = 0;
  uint64_t bytes_ = 0;
  uint64_t hash_ = 0;
};

// A shard's checkpoint store. Thread-safe. Only one checkpoint may be written at a time; reads
// run concurrently with writing and with retention (each read sees one consistent version).
class CheckpointStore {
 public:
  // Opens or creates the store at options.path. Deletes records of incomplete checkpoints and
  // checkpoints beyond `keep`.
  // Errors: INVALID_ARGUMENT (bad options), FAILED_PRECONDITION (the directory holds a RocksDB
  // that is not a checkpoint store, or one of another format version), DATA_LOSS (RocksDB
  // found corrupt or truncated files; or the directory holds RocksDB files but no CURRENT
  // file, named with what is there; nothing is changed then), PERMISSION_DENIED / RESOURCE_EXHAUSTED / UNAVAILABLE
  // (cannot create or lock the directory, e.g. its parent is a regular file, or another
  // process has it open).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CheckpointStore>> Open(
      const CheckpointStoreOptions& options);

  // As Open(), with RocksDB running on `env` (fault injection). `env` is not owned and must
  // outlive the store.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CheckpointStore>> OpenWithEnvForTest(
      const CheckpointStoreOptions& options, rocksdb::Env* env);

  // REQUIRES: every CheckpointWriter of this store was destroyed.
  ~CheckpointStore();

  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  // Starts a checkpoint with an id greater than every id handed out before by this directory,
  // after deleting records of incomplete checkpoints.
  // After a checkpoint failed writing (an I/O error, a full disk, a failed read-back) this store
  // refuses to begin another: RocksDB may still hold that checkpoint's memtables or an error
  // state (after a full disk, flushes were seen to report success without writing anything),
  // so the caller destroys the store and opens it again, which starts from the files on disk
  // only (NeedsReopen() tells).
  // Errors: FAILED_PRECONDITION (another writer is still OPEN, or an earlier checkpoint failed
  // writing: reopen), RESOURCE_EXHAUSTED (less than
  // 1 MiB free, or RocksDB still cannot write after an earlier disk-full error),
  // PERMISSION_DENIED / UNAVAILABLE (the id could not be recorded durably).
  [[nodiscard]] absl::StatusOr<std::unique_ptr<CheckpointWriter>> BeginCheckpoint();

  // True once a checkpoint failed writing: BeginCheckpoint() refuses until the store is
  // destroyed and opened again.
  bool NeedsReopen();

  // The complete checkpoint with the greatest id; nullopt when there is none.
  // Errors: DATA_LOSS (its commit record is corrupt), UNAVAILABLE (I/O).
  [[nodiscard]] absl::StatusOr<std::optional<CheckpointInfo>> Latest();

  // All complete checkpoints, by increasing id.
  // Errors: DATA_LOSS (a commit record is corrupt; the message names its id), UNAVAILABLE (I/O).
  // With `unreadable`, a corrupt commit record is left out and its DATA_LOSS appended there
  // instead (the checkpoints whose records read are still listed).
  [[nodiscard]] absl::StatusOr<std::vector<CheckpointInfo>> List(
      std::vector<absl::Status>* unreadable = nullptr);

  // Complete checkpoints a restore passed over (see MakeCurrent), by increasing id. Restoring
  // the newest checkpoint means the newest one not listed here.
  // Errors: DATA_LOSS (the record of them is corrupt; MakeCurrent writes it anew),
  // UNAVAILABLE (I/O).
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> Superseded();

  // Makes complete checkpoint `id` (0: none, a fresh start) the one that the newest is until a
  // newer one is committed: every complete checkpoint newer than `id` is marked superseded,
  // and `id` no longer is. Written synced, before it returns. Retention keeps a superseded
  // checkpoint until `keep` newer ones that are not superseded exist, so a mistaken restore
  // can be undone by restoring the newer id. Older checkpoints superseded before stay so,
  // even those `id` descends from (the store keeps no lineage; un-superseding them could
  // bring back another timeline's): a restore of the newest then falls back past a damaged
  // `id` only to checkpoints never superseded.
  // Errors: NOT_FOUND (no complete checkpoint `id`), PERMISSION_DENIED / RESOURCE_EXHAUSTED /
  // UNAVAILABLE (I/O).
  [[nodiscard]] absl::Status MakeCurrent(uint64_t id);

  // Deletes the checkpoints `keep` no longer keeps (see MakeCurrent for superseded ones). For
  // the opener, once a restore has verified and taken its checkpoint (or a fresh start made
  // none current): Open() applies no retention, since until then it cannot tell a damaged
  // newest checkpoint from a good one, and counted as one of `keep` it would have the last
  // good one deleted (found in review, 2026-12-06).
  // Errors: DATA_LOSS (the record of superseded checkpoints is corrupt: nothing is deleted),
  // PERMISSION_DENIED / RESOURCE_EXHAUSTED / UNAVAILABLE (I/O).
  [[nodiscard]] absl::Status ApplyRetentionNow();

  // Calls `visit` with every record of checkpoint `id`, in increasing key order (bytewise),
  // checking each record's checksum before handing it out, and the record count, byte count
  // and hash against the commit record at the end. The views are valid only during the call.
  // After an error nothing more is handed to `visit`, but records handed out before it (e.g.
  // when a record is missing, which is found only at the end) must be discarded by the caller.
  // Errors: NOT_FOUND (no complete checkpoint `id`), DATA_LOSS naming the checkpoint id and the
  // key (checksum mismatch, missing or extra record, corrupt RocksDB block; or all records
  // missing), UNAVAILABLE (I/O), or the first non-OK status returned by `visit`, unchanged.
  [[nodiscard]] absl::Status Read(
      uint64_t id,
      const std::function<absl::Status(absl::string_view key, absl::string_view value)>& visit);

  // Read() without handing out records: use it before loading so that a corrupt checkpoint is
  // refused before any state is touched. Errors: as Read().
  [[nodiscard]] absl::Status Verify(uint64_t id);

  // Approximate bytes the store occupies (SST files and memtables of all column families).
  uint64_t ApproximateSizeBytes();

  // Test hooks that damage or inspect raw records of checkpoint `id` (complete or not).
  // Writes (key, value) with `checksum` as its stored checksum, or with the right checksum when
  // nullopt; overwrites an existing record.
  [[nodiscard]] absl::Status PutRawRecordForTest(uint64_t id, absl::string_view key,
                                                 absl::string_view value,
                                                 std::optional<uint32_t> checksum);
  [[nodiscard]] absl::Status DeleteRecordForTest(uint64_t id, absl::string_view key);
  // Replaces checkpoint `id`'s commit record with `raw` bytes.
  [[nodiscard]] absl::Status PutCommitRecordForTest(uint64_t id, absl::string_view raw);
  // Replaces the record of superseded checkpoints with `raw` bytes.
  [[nodiscard]] absl::Status PutSupersededRecordForTest(absl::string_view raw);
  // Makes the store behave as after a failed checkpoint write (NeedsReopen()).
  void MarkWriteFailedForTest(const absl::Status& status) { MarkWriteFailed(status); }
  // Number of records stored for any checkpoint id, complete or not.
  [[nodiscard]] absl::StatusOr<uint64_t> CountRecordsForTest();

 private:
  friend class CheckpointWriter;
  // What a checkpoint's records add up to.
  struct Expected {
    uint64_t num_records = 0;
    uint64_t bytes = 0;
    uint64_t hash = 0;
  };
  struct ScanTotals;  // What a scan found.
  using CfMap = std::map<uint64_t, std::shared_ptr<rocksdb::ColumnFamilyHandle>>;

  CheckpointStore(const CheckpointStoreOptions& options, std::unique_ptr<rocksdb::DB> db,
                  std::unique_ptr<rocksdb::ColumnFamilyHandle> meta_cf);

  static absl::StatusOr<std::unique_ptr<CheckpointStore>> OpenImpl(
      const CheckpointStoreOptions& options, rocksdb::Env* env);
  std::shared_ptr<rocksdb::ColumnFamilyHandle> Share(rocksdb::ColumnFamilyHandle* handle);
  absl::Status CheckOrWriteFormat(bool created);
  absl::Status Recover();
  absl::StatusOr<std::vector<uint64_t>> CommitIds();
  std::shared_ptr<rocksdb::ColumnFamilyHandle> FindCf(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DeleteIncomplete() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DropCheckpoints(std::vector<uint64_t> ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyRetention() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PutNextId(uint64_t next_id);
  absl::StatusOr<std::vector<uint64_t>> ReadSuperseded();
  absl::Status CheckFreeSpace(absl::string_view what);

  // Called by CheckpointWriter.
  absl::Status WriteRecords(rocksdb::WriteBatch* batch);
  absl::StatusOr<CheckpointInfo> CommitCheckpoint(uint64_t id, rocksdb::ColumnFamilyHandle* cf,
                                                  const Expected& expected,
                                                  absl::string_view metadata);
  // After the flush of a checkpoint: the entries its table files on disk hold (from their
  // metadata, each file's presence and size checked). RESOURCE_EXHAUSTED if records are still
  // in a memtable, DATA_LOSS if a file is missing or short.
  absl::StatusOr<uint64_t> CountRecordsOnDisk(rocksdb::ColumnFamilyHandle* cf);
  void ReleaseWriter(uint64_t id, bool delete_records);
  void MarkWriteFailed(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Records `status` as the write failure and returns it annotated.
  absl::Status WriteFailed(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static absl::StatusOr<ScanTotals> ScanRecords(
      uint64_t id, rocksdb::Iterator* records, uint64_t max_records,
      const std::function<absl::Status(absl::string_view, absl::string_view)>* visit);
  static absl::Status CheckTotals(uint64_t id, const ScanTotals& found, const Expected& expected);
  absl::Status ReadImpl(
      uint64_t id, const std::function<absl::Status(absl::string_view, absl::string_view)>* visit);
  absl::Status Error(const absl::Status& status) const;  // Prefixes the store's path.

  // Constant after construction.
  const CheckpointStoreOptions options_;
  // Declared before the handles: members are destroyed in reverse order, and RocksDB requires
  // the column family handles to go before the DB.
  std::unique_ptr<rocksdb::DB> db_;
  // Format, next id, commit records, superseded checkpoints.
  std::unique_ptr<rocksdb::ColumnFamilyHandle> meta_cf_;

  absl::Mutex mu_;
  // Held across the small metadata operations of BeginCheckpoint(), retention and cleanup
  // (creating and dropping column families, next-id and commit-record deletes), never while
  // records are written, flushed or scanned.
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool writer_open_ ABSL_GUARDED_BY(mu_) = false;
  // One column family per checkpoint that has records on disk, complete or not. Readers and the
  // writer hold a reference, so a dropped column family stays readable until they finish.
  CfMap cfs_ ABSL_GUARDED_BY(mu_);
  // Checkpoints whose commit-record write failed: RocksDB may still replay that record from its
  // log at the next Open(), so their records are kept until then.
  std::set<uint64_t> in_doubt_ ABSL_GUARDED_BY(mu_);
  // The first error that failed a checkpoint's writing; OK while none did.
  absl::Status write_failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server::storage

#endif  // PS_SERVER_STORAGE_CHECKPOINT_STORE_H_
