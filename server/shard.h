// Shard: one server's part of every table of the job, the rules for changing it, and what
// it knows about the workers. No gRPC and no RocksDB here: the RPC service (server/rpc/) and
// the in-process store (centralized mode) both call this class, and the Checkpointer streams
// its snapshots into storage.
//
// The shard validates its own input: every store (the gRPC service, the in-process store of
// centralized mode and of the Python client) hands it a decoded, wire-independent request
// (PushView, PullTable) and gets the same status for the same bad input, counted under the same
// reason. Requests go in two phases so that a bad request changes nothing: first every part is
// resolved and checked (CheckPush, CheckPull), then the whole push is applied (ApplyPush). An
// applied push is all-or-nothing with respect to snapshots: a checkpoint never holds half of
// a push.
#ifndef PS_SERVER_SHARD_H_
#define PS_SERVER_SHARD_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/partitioner.h"
#include "common/rpc/following_payload.h"
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

// By default, pushes with at least this many dense values are applied in parallel
// (ShardOptions::parallel_apply_values).
inline constexpr size_t kParallelApplyValues = size_t{1} << 20;
// The same with 8 or more usable cores (ParallelApplyValues).
inline constexpr size_t kManyCoresParallelApplyValues = size_t{1} << 16;
// By default, a parallel apply splits no block into ranges of fewer values than this
// (ShardOptions::parallel_apply_range_values).
inline constexpr size_t kParallelApplyRangeValues = size_t{1} << 14;

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
  // Threads that help apply the dense blocks of a large push (parallel_apply_values or more
  // values) in parallel with the pushing thread, so that a big optimizer step runs at memory
  // bandwidth rather than one core's speed. -1 = one fewer than the cores the process may use
  // (common/startup/cores.h); 0 = every push is applied by the thread that received it.
  // ServerConfig.apply_threads (ApplyHelpers).
  int apply_threads = -1;
  // Pushes with at least this many dense values are checked and applied in parallel (when
  // there are apply threads); ServerConfig.parallel_apply_min_values.
  size_t parallel_apply_values = kParallelApplyValues;
  // In a parallel apply, a block larger than the push's share per thread (its dense values
  // over the threads, at least this many), updated once in the push by an element-wise rule,
  // is split into ranges of that size that threads apply side by side: a push of a few large
  // blocks then keeps every thread busy. Ranges are whole multiples of 1024 values but the
  // last. ServerConfig.parallel_apply_range_values.
  size_t parallel_apply_range_values = kParallelApplyRangeValues;
  // How long each apply thread watches for the next push's work before it sleeps, and the
  // thread that hands work out for the helpers' last units (common::ThreadPool::Spin): work
  // then starts without wake-ups, at the cost of the helpers' cores while they watch (they
  // yield them to any other thread that wants them). Zero = they sleep at once.
  // ServerConfig.apply_spin_us.
  absl::Duration apply_spin = absl::ZeroDuration();
  // A pull whose dense answer from this shard is more than this many bytes is read out of
  // the tables with non-temporal stores (common/stream_copy.h). The server process sets half
  // its last-level cache (ParameterServer::Create). UINT64_MAX = never, the default: the
  // in-process store's caller computes with the values next, and nothing measured says
  // streaming helps it.
  uint64_t stream_pull_bytes = UINT64_MAX;
  // Asked between the blocks of the dense tables Create allocates and initializes (several GB
  // take seconds to minutes): once it returns true, Create stops and returns CANCELLED. Empty:
  // never cancelled. Called on Create's thread only.
  std::function<bool()> cancelled;
};

// Sorts dense blocks into the one order in which every thread that holds several of their
// locks at once takes them (table, then block), without repeats: two such threads cannot
// wait for each other. (Shard's pushes that lock all their blocks, and its parallel pulls.)
void SortForLocking(std::vector<std::pair<DenseTablePart*, uint32_t>>* blocks);

// ShardOptions::parallel_apply_values for `config` on a process that may use `usable_cores`
// cores: server.parallel_apply_min_values when set, else kManyCoresParallelApplyValues with 8
// cores or more and kParallelApplyValues with fewer.
size_t ParallelApplyValues(const JobConfig& config, unsigned usable_cores);
// ShardOptions::apply_spin for `config` on a process that may use `usable_cores` cores:
// server.apply_spin_us when positive, none when negative, else kManyCoresApplySpin with 8
// cores or more and none with fewer.
absl::Duration ApplySpin(const JobConfig& config, unsigned usable_cores);
inline constexpr absl::Duration kManyCoresApplySpin = absl::Microseconds(1000);

// ShardOptions::apply_threads for `config` on a process that may use `usable_cores` cores:
// server.apply_threads minus the receiving thread when set, else usable_cores - 1.
int ApplyHelpers(const JobConfig& config, unsigned usable_cores);

// ShardOptions::parallel_apply_range_values for `config`: server.parallel_apply_range_values
// when set, else kParallelApplyRangeValues.
size_t ParallelApplyRangeValues(const JobConfig& config);

// Who sent a request (from the wire header, or the in-process store).
struct RequestInfo {
  int32_t worker_id = -1;
  uint64_t worker_incarnation = 0;
  uint64_t sequence = 0;
  int64_t clock = 0;
  // The worker's own completed clock (RequestHeader.done_clock; 0 = not told).
  int64_t done_clock = 0;
  uint64_t layout_fingerprint = 0;
  // Until when a push may wait for its turn (training.deterministic).
  absl::Time deadline = absl::InfiniteFuture();
};

// ---- Requests as the shard sees them, whatever the wire form (server/rpc/service.cc
// decodes protobuf messages and PushPull frames into these; InProcessParameterStore builds
// them from float spans). They are views: payloads stay where the caller received them and
// must stay valid until the call that takes them returns.

// One table of a push: a dense table by blocks, a sparse one by keyed rows.
struct PushTable {
  struct Block {
    uint32_t id = 0;
    absl::string_view bytes;  // BlockSize(id) values in `encoding`
    // Or, when not empty (and `bytes` is), the payload as consecutive pieces where a network
    // buffer holds them (one per gRPC receive slice). Float32 pieces are checked and applied
    // where they lie, at any alignment; a value cut between two pieces is copied (4 bytes).
    absl::Span<const absl::string_view> pieces;
  };
  absl::string_view table;
  Encoding encoding = ENCODING_FLOAT32;
  std::vector<Block> blocks;        // dense
  absl::Span<const uint64_t> keys;  // sparse
  absl::string_view rows;           // sparse: keys.size() rows of the table's dim
  // The payloads lie in memory another process may still write (a worker's shared-memory
  // segment), so a value read twice could differ: float32 blocks taken in place are read once
  // more after the check, by the update, which takes a value no longer finite as 0
  // (kernels::FloatBytes::zero_nonfinite); every other payload is copied before the check.
  bool payload_may_change = false;
};

// A whole push to this shard.
struct PushView {
  RequestInfo info;
  bool is_delta = false;  // a local-SGD delta, not a gradient
  absl::Span<const PushTable> tables;
  // When not null, the tables' payloads lie in it and are still being written by the worker
  // (common/rpc/following_payload.h): CheckPush reads none of their bytes before they are
  // there, and refuses the push ("payload_late", DEADLINE_EXCEEDED) when they do not come in
  // time. Must outlive the CheckedPush.
  common::FollowingPayload* following = nullptr;
};

// One table of a pull: a dense table by block ids, a sparse one by keys.
struct PullTable {
  absl::string_view table;
  Encoding encoding = ENCODING_FLOAT32;  // of the answer
  absl::Span<const uint32_t> blocks;
  absl::Span<const uint64_t> keys;
};

// The part index PullSink gets for a sparse table's rows.
inline constexpr size_t kRowsPart = ~size_t{0};
// Where Shard::ReadPull puts a pull's values. Called once per part, in request order, with
// the table's index in the request, the part (an index into PullTable::blocks, or kRowsPart)
// and its number of values; the sink calls `fill` once with a float32 destination of that
// many values (its final place, or a scratch buffer it then encodes) and returns its status.
using PullSink = absl::FunctionRef<absl::Status(
    size_t table, size_t part, size_t num_values,
    absl::FunctionRef<absl::Status(absl::Span<float>)> fill)>;

// One checked part of a push.
struct PendingUpdate {
  TablePart* table = nullptr;
  uint32_t block = 0;                 // dense
  absl::Span<const uint64_t> keys;    // sparse
  absl::Span<const float> values;     // sparse rows; a dense block in one aligned span
  // A dense block's values in place, in pieces that cover it in order (values empty).
  absl::Span<const BlockPiece> pieces;

  size_t num_values() const;
  // The values [begin, end) as pieces that cover them in order (offsets from the update's
  // start; zero_nonfinite as its pieces'). REQUIRES: begin <= end <= num_values().
  absl::InlinedVector<BlockPiece, 4> Pieces(size_t begin, size_t end) const;
  // Value i of the update (for error messages). REQUIRES: i < num_values().
  float value(size_t i) const;
  // Index of the first NaN or Inf value; num_values() if none.
  size_t FirstNonFinite() const;
};

// A push that Shard::CheckPush found good in every part, ready for Shard::ApplyPush. It keeps
// the values it had to decode (16-bit encodings, unaligned payloads); the others are views
// into the PushView's payloads, which must stay valid until ApplyPush returns. Move-only.
class CheckedPush {
 public:
  CheckedPush(CheckedPush&&) = default;
  CheckedPush& operator=(CheckedPush&&) = default;

 private:
  friend class Shard;
  CheckedPush() = default;

  RequestInfo info_;
  UpdateOptions options_;
  std::vector<PendingUpdate> updates_;
  std::vector<std::vector<float>> decoded_;  // moved vectors keep their buffers
  // PendingUpdate::pieces point here, and into straddles_ for values cut between two
  // pieces: both are reserved once (CheckPush), so they never move.
  std::vector<BlockPiece> pieces_;
  std::vector<float> straddles_;
  uint64_t bytes_in_ = 0;
  // The finite check is left to the update, which reads each value once (Shard::ApplyOnePass).
  bool one_pass_ = false;
  common::FollowingPayload* following_ = nullptr;  // PushView::following
};

// What Shard::SparseStats reports of one sparse table.
struct SparseTableStats {
  uint64_t rows = 0;         // in memory and spilled
  bool spills = false;       // has a memory budget and a spill store
  uint64_t budget_rows = 0;  // rows kept in memory when it spills
  SpillStats spill;
};

// A push of at most this many dense values, all SGD gradients without clip_norm, is checked
// for non-finite values by its update itself: one read of its bytes instead of two, with the
// old values kept aside (a per-thread buffer of at most this size) to undo it if one is not
// finite (Shard::ApplyOnePass). The one pass touches three arrays of the push's size (the
// gradient, the parameters, the old values) where the check and then the update touch two.
// Which way is faster depends on the host: on the 2-vCPU VM of 2026-12-03 the one pass won at
// 1 MB; on that of docs/lab/2026-12-05-prefetch-check.md (2 MB of L2 per core) the server
// spent 124 us on a 1 MB push in the one pass against 105 us in two, and on that host two
// passes also gave 1 + 1 pushes of 32-128 KB 3-22% more calls/s (512 KB 2-7%, measured with
// the limit at 64 KB), and two servers with two clients (512 KB to each server) 26-46 us less
// server CPU per 1 MB call; 256 KB lost 5-12% (docs/lab/2026-12-06-long-contended-spins.md).
// The limit is this last host's: 16 KB, where the three arrays fill its 48 KB L1 (sizes
// between 4 and 32 KB were not measured).
inline constexpr size_t kOnePassMaxValues = size_t{1} << 12;
// A dense float32 payload is checked and applied where it lies when it comes in at most
// kFreePieces + bytes / kMinPieceBytes pieces (gRPC receive slices); more, smaller pieces (a
// peer's tiny HTTP/2 frames) are gathered into one buffer first, so a push's bookkeeping
// stays proportional to its bytes.
inline constexpr size_t kMinPieceBytes = 1024;
inline constexpr size_t kFreePieces = 4;

struct PushResult {
  bool duplicate = false;
  uint64_t updates_applied = 0;  // server total after this push
};

// Thread-safe.
class Shard {
 public:
  // `config` must be prepared (common::LoadAndPrepareJobConfig). INVALID_ARGUMENT for a bad
  // server index or optimizer settings, or a memory_budget_rows on a dense table; the errors of
  // storage::SpillStore::Open when a sparse table has a budget and options.spill_dir is set;
  // CANCELLED when options.cancelled said so while the tables were being allocated (nothing
  // is kept).
  static absl::StatusOr<std::unique_ptr<Shard>> Create(const JobConfig& config,
                                                       const ShardOptions& options);

  const common::Partitioner& partitioner() const { return partitioner_; }
  const JobConfig& config() const { return config_; }
  uint32_t server_index() const { return options_.server_index; }
  uint64_t incarnation() const { return options_.incarnation; }
  WorkerTracker& workers() { return workers_; }
  // Ends every pull parked for the consistency bound and every push waiting for its
  // deterministic turn, now and from now on, with UNAVAILABLE `why` (reason server_stopping):
  // the server stops.
  void CloseWaiters(absl::string_view why);
  // The server's memory budget (server.max_memory_bytes): the tables charge it, and the
  // service charges the shared-memory segments it makes for workers.
  MemoryBudget& memory() { return memory_; }
  // The spill store of tables with a memory budget; null if none (tests damage it).
  storage::SpillStore* SpillStoreForTest() const { return spill_store_.get(); }

  // ---- Validation. Every refusal is counted under a reason in Stats (see Reject), whichever
  // store the request came through.
  // FAILED_PRECONDITION ("layout_mismatch") if the sender's layout differs from this server's.
  absl::Status CheckLayout(const RequestInfo& info);
  // Counts a refused request under `reason` and returns `status` tagged with it, for
  // RejectionReason (the RPC layer's own refusals: identity, unparseable). REQUIRES:
  // !status.ok().
  absl::Status Reject(absl::string_view reason, absl::Status status);

  // ---- Pushes, in two phases so that a bad push changes nothing: CheckPush checks every part
  // (and a store that spans several shards checks them all) before ApplyPush changes any.
  // CheckPush errors, each counted: FAILED_PRECONDITION for another layout
  // ("layout_mismatch"), a block or key another server owns ("wrong_server");
  // INVALID_ARGUMENT for a push without a worker slot or a worker id outside the job
  // ("bad_worker"), a negative clock ("bad_clock"), an unknown encoding ("bad_encoding"), a
  // table addressed as the other kind ("wrong_kind"), a block out of range ("bad_block"), a
  // payload of the wrong size ("bad_size"), NaN/Inf values when they are refused
  // ("nonfinite"; counted either way); NOT_FOUND for an unknown table ("unknown_table");
  // DEADLINE_EXCEEDED for a following payload whose bytes did not come in time
  // ("payload_late").
  absl::StatusOr<CheckedPush> CheckPush(const PushView& push);
  // Applies a checked push at most once per (worker, incarnation, sequence); under
  // training.deterministic, waits for the push's turn first (DEADLINE_EXCEEDED at
  // info.deadline). FAILED_PRECONDITION for an older incarnation, INVALID_ARGUMENT for a
  // sequence the worker cannot take; those of a push with sparse parts are found before any
  // row is made. RESOURCE_EXHAUSTED when the push's new sparse rows, all its tables together,
  // do not fit in server.max_memory_bytes (nothing made). Rows of tables over their memory
  // budget are brought into memory first; if the spill store fails (DATA_LOSS, UNAVAILABLE,
  // RESOURCE_EXHAUSTED, naming the table and key) nothing is applied and the push is not
  // recorded as seen.
  absl::StatusOr<PushResult> ApplyPush(CheckedPush push);
  // CheckPush, then ApplyPush.
  absl::StatusOr<PushResult> Push(const PushView& push);
  // Waits for a following payload's bytes up to `end` (all of them when null); OK at once
  // without one. "payload_late" (DEADLINE_EXCEEDED) when they do not come in time.
  absl::Status AwaitPayload(common::FollowingPayload* following, const void* end = nullptr);

  // ---- Pulls: CheckPull, then BeginPull (the wait), then ReadPull.
  // Checks every part as CheckPush does (layout, encoding, tables, kinds, blocks, keys) and
  // returns the bytes of the answer's payload.
  absl::StatusOr<uint64_t> CheckPull(const RequestInfo& info, absl::Span<const PullTable> tables);
  // The clock checks BeginPull and ParkPull start with (bad_worker, bad_clock, clock_ahead),
  // recording nothing: for a call that does more before its pull (a segment's offer).
  absl::Status CheckPullClocks(const RequestInfo& info);
  // Waits for the consistency bound (see WorkerTracker) and records the sender as alive.
  // INVALID_ARGUMENT for a worker (id >= 0) with a negative clock, or with a clock no push
  // could let through (WorkerTracker::CheckPullClock).
  absl::Status BeginPull(const RequestInfo& info, absl::Time deadline);
  // BeginPull without holding the thread (see WorkerTracker::WhenBound): the same checks, then
  // 0 when the pull may read now, or the id of the parked pull, whose `done` is called once
  // with OK when the bound lets it through, DEADLINE_EXCEEDED (reason "bound_timeout") at
  // `deadline`, FAILED_PRECONDITION (counted as "stale_incarnation") once a newer incarnation
  // of the worker is heard from, or the status it was cancelled with. RESOURCE_EXHAUSTED
  // (counted as "too_many_waiting") beyond `limits`, `held_bytes` (what the parked pull keeps
  // of its request) counted against their bytes. A tool's pull (worker id < 0) never parks.
  absl::StatusOr<WorkerTracker::WaiterId> ParkPull(const RequestInfo& info, absl::Time deadline,
                                                   const WorkerTracker::ParkLimits& limits,
                                                   WorkerTracker::BoundCallback done,
                                                   uint64_t held_bytes = 0);
  // Reads the parts of a pull CheckPull accepted into `sink` and counts the pull. A sparse key
  // that is no row reads as its initial values and is not created; the spill store's errors
  // for a table that spills. `stream`: dense answers are read out with non-temporal
  // stores whatever their size (the caller knows their reader wants them so: a worker's
  // shared memory, SharedPayload.stream_answer), else from ShardOptions::stream_pull_bytes.
  // `in_place`: the caller promises that every span its sink hands to `fill` for a dense
  // block is the block's final place, stays valid until ReadPull returns, and is not read by
  // the sink. A large pull (parallel_apply_values dense values or more, with apply threads)
  // then has its dense blocks read after the sink's calls, in ranges on the apply threads
  // (RangeValues), every block reader-locked until all of it is read (each block one version,
  // as when read whole); a sink's error leaves the answer's dense values unread.
  absl::Status ReadPull(absl::Span<const PullTable> tables, PullSink sink, bool stream = false,
                        bool in_place = false);

  // Statistics of a sparse table's rows (in memory, spilled, moved); NOT_FOUND for a table
  // that is not a sparse table of the job.
  absl::StatusOr<SparseTableStats> SparseStats(absl::string_view table) const;

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
  // Pushes that took the one-pass check and update (kOnePassMaxValues), whatever became of
  // them.
  uint64_t one_pass_pushes() const;
  // Pushes whose dense blocks were applied by several threads (parallel_apply_values).
  uint64_t parallel_pushes() const;
  // Of those, the pushes with blocks split into ranges (parallel_apply_range_values).
  uint64_t ranged_pushes() const;
  // Pulls whose dense blocks were read by several threads (ReadPull's `in_place`).
  uint64_t parallel_pulls() const;
  // Threads a parallel apply or read runs on, the calling one included (1: none helps).
  int apply_threads() const { return apply_pool_ == nullptr ? 1 : apply_pool_->num_threads() + 1; }
  // Times a thread's undo buffer for the one pass grew: it is kept for the thread's next
  // push, so a steady stream of pushes allocates none.
  uint64_t one_pass_buffers_allocated() const;

 private:
  // The factor a pushed local-SGD delta is added with (training.local_sgd.merge): 1 for SUM,
  // 1 / cluster.num_workers for AVERAGE.
  float delta_scale() const;
  void CountRejection(absl::string_view reason);
  // Takes back one count of `reason` (a refusal that another one, earlier in the same
  // request, replaces); nothing for "".
  void UncountRejection(absl::string_view reason);
  // NOT_FOUND ("unknown_table") for a table the job does not have.
  absl::StatusOr<TablePart*> FindTable(absl::string_view name);
  // INVALID_ARGUMENT for an unknown encoding.
  absl::Status CheckEncoding(Encoding encoding);
  // INVALID_ARGUMENT for a block out of range; FAILED_PRECONDITION for a block another
  // server owns. With num_values >= 0 also checks the payload size (INVALID_ARGUMENT with
  // the expected and actual sizes).
  absl::Status CheckBlock(const DenseTablePart& table, uint32_t block, int64_t num_values);
  // With num_values >= 0 checks that the values are keys.size() rows of the table's dim
  // (INVALID_ARGUMENT); FAILED_PRECONDITION for a key another server owns.
  absl::Status CheckKeys(const SparseTablePart& table, absl::Span<const uint64_t> keys,
                         int64_t num_values);
  // INVALID_ARGUMENT naming the table, the part and the first bad index for the first of
  // `updates` whose values hold NaN or Inf, when such gradients are rejected; counted either
  // way. A large push is counted by apply_pool_ as well as this thread. With `following`,
  // values are counted as they come (AwaitPayload).
  absl::Status CheckFinite(absl::Span<const PendingUpdate> updates,
                           common::FollowingPayload* following = nullptr);

  // A dense block's place in a pull's answer, read after the sink's calls (ReadPull's
  // `in_place`).
  struct PullPlace {
    DenseTablePart* table = nullptr;
    uint32_t block = 0;
    absl::Span<float> out;
  };
  // Reads `places` (`values` values in all) in ranges on this thread and apply_pool_'s, every
  // block reader-locked (in the order pushes lock theirs) until all of it is read.
  void ReadInRanges(absl::Span<const PullPlace> places, size_t values, bool stream);
  // The tables of a push, each checked and added to `checked` in turn, up to the first error.
  absl::Status CheckPushTables(const PushView& push, CheckedPush* checked);
  // The parts of one table of a push, checked and added to `push`.
  absl::Status CheckDensePush(DenseTablePart* table, const PushTable& t, CheckedPush* push);
  absl::Status CheckSparsePush(SparseTablePart* table, const PushTable& t, CheckedPush* push);
  // The values of a payload of `n` values: in place when float32, aligned and not
  // `may_change`, else decoded (copied) into a buffer `push` keeps.
  absl::StatusOr<absl::Span<const float>> PayloadValues(absl::string_view bytes, Encoding encoding,
                                                        size_t n, CheckedPush* push,
                                                        bool may_change = false);
  // The update of dense block `block` (whose size the pieces' float32 bytes make up) with its
  // values where they lie; values cut between two pieces are copied into push->straddles_.
  // With `may_change` the update reads values no longer finite as 0 (PushTable).
  static PendingUpdate PieceUpdate(DenseTablePart* table, uint32_t block,
                                   absl::Span<const absl::string_view> pieces, CheckedPush* push,
                                   bool may_change = false);
  // RESOURCE_EXHAUSTED (naming the tables and their new rows) when the rows that `updates`
  // would create in tables that do not spill, or pin beyond their row budget in tables that
  // do, all parts together (a key two parts of a table name counted once), do not fit in the
  // memory budget (server.max_memory_bytes). Looks rows up only when the push's upper bound
  // does not fit. Creates nothing.
  absl::Status CheckRoomForNewRows(absl::Span<const PendingUpdate> updates);
  // Checks room for the new rows of `updates` (CheckRoomForNewRows), then brings the rows of
  // tables over a memory budget into memory and pins them (listed in `pinned`), creating
  // missing ones. Refused for room: nothing created nor pinned. On a spill store error the
  // parts pinned before stay in `pinned` (the caller unpins them).
  absl::Status PrepareRows(absl::Span<const PendingUpdate> updates,
                           std::vector<const PendingUpdate*>* pinned);
  Shard(const JobConfig& config, const ShardOptions& options, common::Partitioner partitioner,
        const WorkerTrackerOptions& tracker_options,
        std::unique_ptr<storage::SpillStore> spill_store);
  // INVALID_ARGUMENT (counted as "bad_clock") for a worker's negative clock or done_clock.
  absl::Status CheckWorkerAndClock(const RequestInfo& info);
  // A worker's pull before any wait: its clock (bad_clock, clock_ahead) and its header
  // (recorded as alive; its clock raised to its done_clock).
  absl::Status CheckPullStart(const RequestInfo& info);
  // INVALID_ARGUMENT for a push without a worker slot (negative id): every push goes through
  // exactly-once admission.
  absl::Status CheckPusher(const RequestInfo& info);
  // RESOURCE_EXHAUSTED naming the table and the bytes when the dense tables' parameters and
  // slots on this server, with the rows the `spilling` tables keep in memory
  // (memory_budget_rows each), exceed options.max_memory_bytes. Allocates nothing.
  static absl::Status CheckMemoryAtStart(const common::Partitioner& partitioner,
                                         const ShardOptions& options,
                                         const std::vector<std::string>& spilling);
  // Applies checked updates: sparse ones here, then dense blocks, those of a large push on
  // this thread and apply_pool_'s, each block's updates in push order on one thread.
  void ApplyUpdates(absl::Span<const PendingUpdate> updates, const UpdateOptions& options);
  // The values of a range in a parallel check, apply or read of `values` values: their share
  // per thread (rounded up to 1024), at least parallel_apply_range_values.
  // REQUIRES: apply_pool_.
  size_t RangeValues(size_t values) const;
  // ApplyUpdates' parallel apply with blocks split into ranges: every block of the push
  // locked at once (in LockOrder), then units of `range` values or whole blocks on the pool.
  // `heads` and `next` chain each block's updates; returns false, having done nothing, when
  // no block is split (or a rule is not element-wise).
  bool ApplyInRanges(absl::Span<const PendingUpdate> updates, const UpdateOptions& options,
                     absl::Span<const size_t> heads, absl::Span<const size_t> next, size_t range);
  // True when `push` may take ApplyOnePass (kOnePassMaxValues).
  bool OnePassFits(const CheckedPush& push) const;
  // ApplyPush's admission and update of a push marked one_pass_: every block it updates
  // locked at once, each updated while its values are counted; a value that is not finite, a
  // refused admission or a duplicate undoes the updates before the locks are released, so
  // nothing changes and no pull saw them. The refusal of a non-finite value is CheckFinite's.
  // `replaced`: where admission puts answers to parked pulls (run after the caller's locks).
  absl::StatusOr<PushResult> ApplyOnePass(const CheckedPush& push,
                                          WorkerTracker::Released* replaced);
  // An admission other than kApply as ApplyPush answers it (the refusal, or a duplicate,
  // counted, once the attempt it repeats is applied or info.deadline passes); nullopt for
  // kApply.
  std::optional<absl::StatusOr<PushResult>> NotAdmitted(
      const absl::StatusOr<WorkerTracker::Admission>& admission, const RequestInfo& info);
  // After an admitted push's updates: its worker's clock and the counts.
  PushResult Applied(const CheckedPush& push);

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

  // Pushes hold this shared from before their rows are prepared until they are applied; a
  // snapshot holds it exclusively for an instant to pick its cut (and again to end it). A
  // push may wait while it holds it: for the spill store's I/O (PrepareRows faults rows in
  // and evicts others), and, when a duplicate, for the attempt it repeats to be applied
  // (NotAdmitted's WaitUntilApplied, until the push's deadline). That attempt holds it already,
  // so the wait needs no one else to take it; but a snapshot's exclusive hold, and with it
  // the pushes that come after the snapshot asked, may wait as long.
  absl::Mutex apply_mu_;
  uint64_t snapshot_epoch_ ABSL_GUARDED_BY(apply_mu_) = 0;
  absl::Mutex snapshot_mu_;  // one snapshot at a time

  // Adds the wall time of its scope to a counter of nanoseconds (push_check_ns_ and the others).
  class Timed {
   public:
    explicit Timed(std::atomic<uint64_t>* ns) : ns_(ns), start_(Now()) {}
    ~Timed() { ns_->fetch_add(Now() - start_, std::memory_order_relaxed); }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    static uint64_t Now() {
      return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now().time_since_epoch())
                                       .count());
    }
    std::atomic<uint64_t>* const ns_;
    const uint64_t start_;
  };
  // StatsResponse's push_check_s, push_apply_s and pull_read_s, in nanoseconds.
  std::atomic<uint64_t> push_check_ns_{0}, push_apply_ns_{0}, pull_read_ns_{0};

  mutable absl::Mutex stats_mu_;
  uint64_t pulls_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t pushes_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t updates_applied_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t duplicates_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t one_pass_pushes_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t parallel_pushes_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t ranged_pushes_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t parallel_pulls_ ABSL_GUARDED_BY(stats_mu_) = 0;
  uint64_t one_pass_buffers_allocated_ ABSL_GUARDED_BY(stats_mu_) = 0;
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
