// Shard: one server's part of every table of the job, the rules for changing it, and what
// it knows about the workers. No gRPC and no RocksDB here: the RPC service (server/rpc/) and
// the in-process store (centralized mode) both call this class, and the Checkpointer streams
// its snapshots into storage.
//
// Requests go in two phases so that a bad request changes nothing: first every part is
// resolved and checked (Find*Table, Check*), then the whole push is applied (ApplyPush). An
// applied push is all-or-nothing with respect to snapshots: a checkpoint never holds half of
// a push.
#ifndef PS_SERVER_SHARD_H_
#define PS_SERVER_SHARD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/partitioner.h"
#include "common/thread_pool.h"
#include "kernels/optimizer_config.h"
#include "proto/checkpoint.pb.h"
#include "proto/config.pb.h"
#include "proto/ps.pb.h"
#include "server/memory_budget.h"
#include "server/storage/spill_store.h"
#include "server/table.h"
#include "server/worker_tracker.h"

namespace ps::server {

struct ShardOptions {
  // This server's index, 0..num_servers-1. REQUIRES: < the config's server count.
  uint32_t server_index = 0;
  // Changes on every start of the server process; reported to clients.
  uint64_t incarnation = 1;
  // Refuse gradients holding NaN/Inf (they are counted either way).
  bool reject_nonfinite = true;
  // Injected clock for leases (nullptr = absl::Now).
  std::function<absl::Time()> now;
  // Directory of the spill store, where sparse tables with a memory_budget_rows keep the rows
  // beyond their budget (storage::SpillStore; its previous contents are deleted). Empty: such
  // tables keep every row in memory (a warning is logged).
  std::string spill_dir;
  // Bytes this server may hold in parameters, optimizer slots and sparse rows (see
  // MemoryBudget); 0 = unlimited. Create refuses a layout whose dense tables do not fit
  // (RESOURCE_EXHAUSTED, nothing allocated); sparse rows beyond it are refused to the call
  // that would create them (tables that spill evict instead).
  uint64_t max_memory_bytes = 0;
  // Threads that help apply the dense blocks of a large push (at least kParallelApplyValues
  // values) in parallel with the pushing thread, so that a big optimizer step runs at memory
  // bandwidth rather than one core's speed. -1 = one fewer than the machine's cores; 0 = every
  // push is applied by the thread that received it.
  int apply_threads = -1;
};

// Who sent a request (from the wire header, or the in-process store).
struct RequestInfo {
  int32_t worker_id = -1;
  uint64_t worker_incarnation = 0;
  uint64_t sequence = 0;
  int64_t clock = 0;
  uint64_t layout_fingerprint = 0;
  // Until when a push may wait for its turn (training.deterministic).
  absl::Time deadline = absl::InfiniteFuture();
};

// One checked part of a push. Spans must stay valid until ApplyPush returns.
struct PendingUpdate {
  TablePart* table = nullptr;
  uint32_t block = 0;                 // dense
  absl::Span<const uint64_t> keys;    // sparse
  absl::Span<const float> values;
};

// Pushes with at least this many dense values are applied in parallel (ShardOptions).
inline constexpr size_t kParallelApplyValues = size_t{1} << 20;

struct PushResult {
  bool duplicate = false;
  uint64_t updates_applied = 0;  // server total after this push
};

// Thread-safe.
class Shard {
 public:
  // `config` must be prepared (common::LoadAndPrepareJobConfig). INVALID_ARGUMENT for a bad
  // server index or optimizer settings, or a memory_budget_rows on a dense table; the errors of
  // storage::SpillStore::Open when a sparse table has a budget and options.spill_dir is set.
  static absl::StatusOr<std::unique_ptr<Shard>> Create(const JobConfig& config,
                                                       const ShardOptions& options);

  const common::Partitioner& partitioner() const { return partitioner_; }
  const JobConfig& config() const { return config_; }
  uint32_t server_index() const { return options_.server_index; }
  uint64_t incarnation() const { return options_.incarnation; }
  WorkerTracker& workers() { return workers_; }
  // The spill store of tables with a memory budget; null if none (tests damage it).
  storage::SpillStore* SpillStoreForTest() const { return spill_store_.get(); }

  // ---- Checks (phase 1). Each failure is counted under a reason in Stats.
  // FAILED_PRECONDITION if the sender's layout differs from this server's.
  absl::Status CheckLayout(const RequestInfo& info);
  // NOT_FOUND for an unknown table; INVALID_ARGUMENT if it is not of the kind asked for.
  absl::StatusOr<DenseTablePart*> FindDenseTable(absl::string_view name);
  absl::StatusOr<SparseTablePart*> FindSparseTable(absl::string_view name);
  absl::StatusOr<TablePart*> FindTable(absl::string_view name);
  // INVALID_ARGUMENT for a block out of range; FAILED_PRECONDITION for a block another
  // server owns. With num_values >= 0 also checks the payload size (INVALID_ARGUMENT with
  // the expected and actual sizes).
  absl::Status CheckBlock(const DenseTablePart& table, uint32_t block, int64_t num_values);
  // FAILED_PRECONDITION for a key another server owns; with num_values >= 0 checks that the
  // values are keys.size() rows of the table's dim.
  absl::Status CheckKeys(const SparseTablePart& table, absl::Span<const uint64_t> keys,
                         int64_t num_values);
  // INVALID_ARGUMENT naming the table, the part and the first bad index when values hold
  // NaN or Inf and such gradients are rejected. Counted either way.
  absl::Status CheckFinite(const TablePart& table, absl::string_view part,
                           absl::Span<const float> values);
  void CountRejection(absl::string_view reason);
  // Counts a refused request under `reason` (as CountRejection) and returns `status` tagged
  // with it, for RejectionReason. REQUIRES: !status.ok().
  absl::Status Reject(absl::string_view reason, absl::Status status);

  // ---- Pulls.
  // Waits for the consistency bound (see WorkerTracker) and records the sender as alive.
  // INVALID_ARGUMENT for a worker (id >= 0) with a negative clock, or with a clock no push
  // could let through (WorkerTracker::CheckPullClock).
  absl::Status BeginPull(const RequestInfo& info, absl::Time deadline);
  // BeginPull without holding the thread (see WorkerTracker::WhenBound): the same checks, then
  // 0 when the pull may read now, or the id of the parked pull, whose `done` is called once
  // with OK when the bound lets it through, DEADLINE_EXCEEDED (reason "bound_timeout") at
  // `deadline`, or the status it was cancelled with. RESOURCE_EXHAUSTED (counted as
  // "too_many_waiting") beyond `limits`. A tool's pull (worker id < 0) never parks.
  absl::StatusOr<WorkerTracker::WaiterId> ParkPull(const RequestInfo& info, absl::Time deadline,
                                                   const WorkerTracker::ParkLimits& limits,
                                                   WorkerTracker::BoundCallback done);
  void CountPull(uint64_t bytes_out);

  // ---- Pushes (phase 2): applies every update of a checked push, at most once per
  // (worker, incarnation, sequence). A worker id < 0 (tools, tests) skips exactly-once.
  // INVALID_ARGUMENT (nothing applied) for a worker with a negative clock. Rows of tables over
  // their memory budget are brought into memory first; if the spill store fails (DATA_LOSS,
  // UNAVAILABLE, RESOURCE_EXHAUSTED, naming the table and key) nothing is applied and the push
  // is not recorded as seen.
  absl::StatusOr<PushResult> ApplyPush(const RequestInfo& info,
                                       absl::Span<const PendingUpdate> updates,
                                       const UpdateOptions& options, uint64_t bytes_in);

  // ---- Snapshots and restore.
  // Takes a consistent snapshot (no push half-applied) and streams it to `sink` while
  // pushes and pulls go on. Returns the metadata to commit with it.
  absl::StatusOr<CheckpointMeta> Snapshot(const SnapshotSink& sink, size_t record_bytes);
  // Restore: BeginRestore checks that the checkpoint fits this server (layout, index,
  // optimizer slots: FAILED_PRECONDITION naming what differs), RestoreRecord loads one
  // record (DATA_LOSS for one that does not fit; also BeginRestore for a worker with a
  // negative clock), EndRestore adopts the workers' state.
  // REQUIRES: nothing else uses the shard while restoring.
  absl::Status BeginRestore(const CheckpointMeta& meta);
  absl::Status RestoreRecord(absl::string_view key, absl::string_view value);
  void EndRestore(const CheckpointMeta& meta);

  // ---- Stats.
  void FillStats(StatsResponse* out);
  void FillServerInfo(ServerInfoResponse* out) const;
  uint64_t updates_applied() const;
  // The factor a pushed local-SGD delta is added with (training.local_sgd.merge): 1 for SUM,
  // 1 / cluster.num_workers for AVERAGE.
  float delta_scale() const;

 private:
  Shard(const JobConfig& config, const ShardOptions& options, common::Partitioner partitioner,
        const WorkerTrackerOptions& tracker_options,
        std::unique_ptr<storage::SpillStore> spill_store);
  // INVALID_ARGUMENT (counted as "bad_clock") for a worker's negative clock.
  absl::Status CheckWorkerAndClock(const RequestInfo& info);
  // A worker's pull before any wait: its clock (bad_clock, clock_ahead) and its header
  // (recorded as alive).
  absl::Status CheckPullStart(const RequestInfo& info);
  // INVALID_ARGUMENT for a push without a worker slot (negative id): every push goes through
  // exactly-once admission.
  absl::Status CheckPusher(const RequestInfo& info);
  // RESOURCE_EXHAUSTED naming the table and the bytes when the dense tables' parameters and
  // slots on this server exceed options.max_memory_bytes. Allocates nothing.
  static absl::Status CheckDenseMemory(const common::Partitioner& partitioner,
                                       const ShardOptions& options);
  // Applies checked updates: dense blocks of a large push spread over apply_pool_ (a block
  // always goes to the same part, so repeated blocks keep their order), sparse ones here.
  void ApplyUpdates(absl::Span<const PendingUpdate> updates, const UpdateOptions& options);

  // Constant after construction.
  const JobConfig config_;
  const ShardOptions options_;
  const common::Partitioner partitioner_;
  // The spilled rows of sparse tables with a memory budget (null if none). Declared before the
  // tables, which use it: members are destroyed in reverse order.
  std::unique_ptr<storage::SpillStore> spill_store_;
  MemoryBudget memory_;  // charged by the tables: declared before them
  std::vector<std::unique_ptr<TablePart>> tables_;  // index = Partitioner table index
  std::unique_ptr<common::ThreadPool> apply_pool_;   // null = no parallel apply
  absl::flat_hash_map<std::string, TablePart*> by_name_;
  const absl::Time start_time_;

  WorkerTracker workers_;

  // Pushes hold this shared while they apply; a snapshot holds it exclusively for an
  // instant to pick its cut. Never held while waiting for anything.
  absl::Mutex apply_mu_;
  uint64_t snapshot_epoch_ ABSL_GUARDED_BY(apply_mu_) = 0;
  absl::Mutex snapshot_mu_;  // one snapshot at a time

  mutable absl::Mutex stats_mu_;
  uint64_t pulls_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t pushes_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t updates_applied_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t duplicates_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t nonfinite_values_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t bytes_in_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t bytes_out_ ABSL_GUARDED_BY(stats_mu_) = 0;
  absl::flat_hash_map<std::string, uint64_t> rejected_ ABSL_GUARDED_BY(stats_mu_);
};

// The short reason ("nonfinite", "unknown_table", "stale_incarnation", ...) a refused request
// was tagged with by Shard::Reject or WithRejectionReason; "" if none.
std::string RejectionReason(const absl::Status& status);
// `status` tagged with `reason` without counting it (for failures that are not bad input,
// such as a pull that timed out waiting for the consistency bound).
absl::Status WithRejectionReason(absl::Status status, absl::string_view reason);

// The kernels' optimizer parameters for a table's configured optimizer.
using kernels::ToOptimizerParams;

}  // namespace ps::server

#endif  // PS_SERVER_SHARD_H_
