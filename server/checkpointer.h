// Checkpointer: writes consistent snapshots of a Shard into its CheckpointStore (on a timer,
// after every N updates, on demand, at shutdown) and restores the newest one at start.
// A checkpoint that fails its checks is refused with DATA_LOSS, never loaded.
#ifndef PS_SERVER_CHECKPOINTER_H_
#define PS_SERVER_CHECKPOINTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/ps.pb.h"
#include "server/shard.h"
#include "server/storage/checkpoint_store.h"

namespace ps::server {

struct CheckpointerOptions {
  // The server's data directory (the RocksDB lives here). REQUIRES: not empty.
  std::string data_dir;
  // Complete checkpoints kept (>= 1).
  uint32_t keep = 2;
  // Time between periodic checkpoints; zero = no timer.
  absl::Duration interval = absl::Seconds(60);
  // Also checkpoint once this many updates were applied since the last one; 0 = off.
  uint64_t every_updates = 0;
  // Size of one snapshot record (sparse rows are grouped up to this).
  size_t record_bytes = 1 << 20;
};

// What RestoreLatest found.
struct RestoreReport {
  uint64_t checkpoint_id = 0;  // 0 = nothing restored (empty data dir)
  uint64_t updates_applied = 0;
  uint64_t bytes = 0;
  int64_t unix_micros = 0;
  // Newer checkpoints passed over because they failed verification (DATA_LOSS each, naming
  // the checkpoint), newest first. Only Restore() of the newest skips any.
  std::vector<absl::Status> skipped;
  // Newer checkpoints passed over because a restore of an older one superseded them
  // (storage::CheckpointStore::MakeCurrent), newest first. Only Restore() of the newest.
  std::vector<uint64_t> superseded;
};

// Thread-safe. STARTED by Start(), STOPPED by Stop() (or the destructor).
class Checkpointer {
 public:
  // `shard` is not owned and must outlive the checkpointer. Errors: those of
  // storage::CheckpointStore::Open.
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Create(Shard* shard,
                                                              const CheckpointerOptions& options);
  ~Checkpointer();

  // Restores checkpoint `id` (nullopt = the newest good one) into the shard, which must be
  // fresh. Nothing is restored from an empty store. With nullopt, a checkpoint that fails
  // verification is passed over (RestoreReport::skipped) for the next older one; each is
  // verified before the shard is touched. So is one superseded (RestoreReport::superseded):
  // restoring an explicit `id` makes it current, superseding every newer checkpoint, so that
  // a restart continues from what this server goes on to do, not from the timeline the
  // operator turned back from.
  // Errors: DATA_LOSS (checkpoint `id` is corrupt, or every checkpoint is, naming each; or
  // the record of superseded checkpoints is, for nullopt), FAILED_PRECONDITION (the
  // checkpoint does not fit this server's config), NOT_FOUND (no checkpoint `id`).
  absl::StatusOr<RestoreReport> Restore(std::optional<uint64_t> id = std::nullopt);

  // For a start from initial values (no restore): supersedes every checkpoint, so that a
  // restart of this server does not continue from the run it chose not to.
  absl::Status StartFresh();

  // Writes a checkpoint now (one at a time; callers queue), or answers with the one written
  // next if it began after this call did (requests that pile up while one is written share
  // the next one). It is reported written only once the store has read it back from disk and
  // verified it. After a failed one the store is
  // reopened before the next, so that nothing RocksDB kept in memory from the failure is built
  // on. Errors: those of the store (RESOURCE_EXHAUSTED when the disk is full, ...); the server
  // keeps running either way.
  absl::StatusOr<CheckpointResponse> CheckpointNow();

  // Starts the timer / update-count thread.
  void Start();
  // Stops it (a checkpoint in progress completes first).
  void Stop();

  // Last checkpoint (id, age, duration), checkpoints written and failed, storage size. Never
  // waits for the store: while it is reopened (after a failed checkpoint; as long as RocksDB
  // takes to open) the storage size is the last one read. (Stats is served on the data path's
  // thread: it waited for the whole reopen, and so did every call behind it.)
  void FillStats(StatsResponse* out);
  const RestoreReport& restored() const { return restored_; }

  // Makes the next checkpoint find its store failed, as after a write error.
  void FailStoreForTest(const absl::Status& status);
  // Called by a reopen of the store while it holds the store's lock (to hold it there).
  void SetReopenHookForTest(std::function<void()> hook) { reopen_hook_ = std::move(hook); }
  // Called as a checkpoint begins, once it knows which requests it answers.
  void SetWriteHookForTest(std::function<void()> hook) { write_hook_ = std::move(hook); }
  // Calls of CheckpointNow so far.
  uint64_t requests() const;

 private:
  Checkpointer(Shard* shard, const CheckpointerOptions& options,
               std::unique_ptr<storage::CheckpointStore> store);
  static absl::StatusOr<std::unique_ptr<storage::CheckpointStore>> OpenStore(
      const CheckpointerOptions& options);
  void Loop();
  absl::StatusOr<CheckpointResponse> Write() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status ReopenStoreIfFailed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status RestoreOne(const storage::CheckpointInfo& info, RestoreReport* report)
      ABSL_SHARED_LOCKS_REQUIRED(store_mu_);
  // Applies `keep` once a restore (or a fresh start) chose the current checkpoint.
  void ApplyRetentionAfterRestore() ABSL_SHARED_LOCKS_REQUIRED(store_mu_);

  Shard* const shard_;  // Not owned.
  const CheckpointerOptions options_;
  RestoreReport restored_;

  absl::Mutex write_mu_;  // one checkpoint at a time
  // Replaced (under a writer lock, holding write_mu_) when a failed checkpoint leaves it
  // unusable; null while reopening it fails. Readers hold a reader lock.
  mutable absl::Mutex store_mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  std::unique_ptr<storage::CheckpointStore> store_ ABSL_GUARDED_BY(store_mu_);
  mutable absl::Mutex mu_;
  uint64_t last_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  double last_duration_s_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_updates_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t storage_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // as last read by FillStats
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::function<void()> reopen_hook_;  // set before the checkpoints it is for
  std::function<void()> write_hook_;
  // Calls of CheckpointNow so far; those up to covered_ are answered by the last checkpoint
  // begun, whose result is last_result_.
  uint64_t requests_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t covered_ ABSL_GUARDED_BY(mu_) = 0;
  absl::StatusOr<CheckpointResponse> last_result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server

#endif  // PS_SERVER_CHECKPOINTER_H_
