// This server's part of one table: dense blocks or sparse rows, with optimizer slots.
//
// Memory layout. A dense block of n values stores [params n][slot0 n][slot1 n]... in one
// allocation; a sparse row of `dim` stores [params dim][slot0 dim]... in a chunked arena, so
// an update touches one contiguous run of memory.
//
// Concurrency. Every dense block has its own mutex; sparse rows live in kNumStripes stripes,
// each with its own mutex and hash map. A read copies a block or row under its lock, so no
// reader sees a half-applied update, and no operation takes a table-wide lock.
//
// Consistent snapshots without stopping the world. A checkpoint at epoch E starts when the
// Shard, with no push in flight, calls BeginSnapshot(E, sink). From then until EndSnapshot(),
// the first update to a block or row that the snapshot writer has not visited yet first saves
// the old contents: a dense block is written to the sink right there (write-through, so no
// copy of a large table is ever held), a sparse row is copied aside for the writer. The
// writer emits every block and row not saved that way and marks it visited. Rows created
// after the snapshot began are not part of it. The result equals the table exactly as it was
// at BeginSnapshot while pushes and pulls continue; the extra memory is one block per
// concurrent push plus the sparse rows updated during the write.
//
// A sparse table may have a memory budget: rows beyond it live in a spill table on disk and
// move in and out as they are used; SparseTablePart describes how snapshots stay exact then.
#ifndef PS_SERVER_TABLE_H_
#define PS_SERVER_TABLE_H_

#include <cstdint>
#include <atomic>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/partitioner.h"
#include "common/thread_pool.h"
#include "kernels/optimizer.h"
#include "proto/config.pb.h"
#include "server/memory_budget.h"
#include "server/row_index.h"
#include "server/storage/spill_table.h"

namespace ps::server {

// How a pushed payload changes the parameters.
enum class UpdateKind {
  kGradient,  // the table's optimizer rule
  kDelta,     // params += delta_scale * values (local-SGD merge); slots untouched
};

struct UpdateOptions {
  UpdateKind kind = UpdateKind::kGradient;
  float delta_scale = 1.0f;
};

// Consecutive float32 values of a dense block's update where they lie (any alignment).
struct BlockPiece {
  size_t offset = 0;  // index of the first value in the block
  kernels::FloatBytes values;
};

// Receives snapshot records: a key naming the block or row group, and its serialized bytes.
// The sink of a snapshot is called from the writer and from pushing threads at once: it must
// be thread-safe.
using SnapshotSink = std::function<absl::Status(absl::string_view key, absl::string_view value)>;

// Common state of both table kinds. Thread-safe.
class TablePart {
 public:
  TablePart(const common::TableInfo& info, const kernels::OptimizerParams& optimizer);
  virtual ~TablePart() = default;
  TablePart(const TablePart&) = delete;
  TablePart& operator=(const TablePart&) = delete;

  const common::TableInfo& info() const { return info_; }
  const std::string& name() const { return info_.name; }
  const kernels::OptimizerParams& optimizer() const { return optimizer_; }
  int num_slots() const { return num_slots_; }

  // Rows (sparse) or blocks (dense) held, and the bytes of parameters and slots.
  virtual uint64_t NumRows() const = 0;
  virtual uint64_t NumBytes() const = 0;

  // Snapshot protocol (see the file comment). REQUIRES: no update in flight during
  // BeginSnapshot; one snapshot at a time; `sink` is thread-safe and outlives EndSnapshot.
  virtual void BeginSnapshot(uint64_t epoch, const SnapshotSink* sink) = 0;
  // Emits every block or row as of BeginSnapshot to the sink, in records of about
  // `record_bytes`. Updates may run concurrently. Returns the first error of the sink,
  // including errors of writes made by updates.
  virtual absl::Status WriteSnapshot(size_t record_bytes) = 0;
  virtual void EndSnapshot() = 0;
  // Rows (dense: blocks) the snapshot in progress wrote, once WriteSnapshot returned OK.
  virtual uint64_t SnapshotRows() const { return NumRows(); }

  // Restores one record written by WriteSnapshot. INVALID_ARGUMENT/DATA_LOSS if it does not
  // fit this table (wrong size, block out of range); nothing is changed then.
  virtual absl::Status RestoreRecord(absl::string_view key, absl::string_view value) = 0;

  uint64_t updates_applied() const;
  // The count a checkpoint saved (restore).
  void set_updates_applied(uint64_t n);

 protected:
  void CountUpdate();

  // Constant after construction.
  const common::TableInfo info_;
  const kernels::OptimizerParams optimizer_;
  const int num_slots_;

 private:
  mutable absl::Mutex counter_mu_;
  uint64_t updates_applied_ ABSL_GUARDED_BY(counter_mu_) = 0;
};

// This server's blocks of a dense table. Thread-safe.
class DenseTablePart final : public TablePart {
 public:
  // Allocates and initializes the blocks this server owns (from the Partitioner). `cancelled`
  // (may be empty) is asked before each block; once it says true the remaining blocks are not
  // allocated and the part is incomplete: its owner discards it (see ShardOptions::cancelled).
  DenseTablePart(const common::TableInfo& info, const kernels::OptimizerParams& optimizer,
                 const common::Partitioner& partitioner, uint32_t server_index,
                 const std::function<bool()>& cancelled = nullptr);

  // True if this server owns block `block`.
  bool Owns(uint32_t block) const;
  // Number of values in block `block`. REQUIRES: Owns(block).
  size_t BlockSize(uint32_t block) const;
  // Floats from the start of block `block`'s parameters to the start of its first optimizer
  // slot, and from each slot to the next: DenseSlotStride(BlockSize) (server/memory_budget.h).
  // For tests. REQUIRES: Owns(block).
  size_t BlockSlotStride(uint32_t block) const;

  // Copies block `block`'s parameters to out, with non-temporal stores if `stream`
  // (common/stream_copy.h). REQUIRES: Owns(block), out.size()==BlockSize.
  void Read(uint32_t block, absl::Span<float> out, bool stream = false) const;
  // ---- A large pull read in ranges by several threads (Shard::ReadPull). The caller holds
  // ReaderLockBlock on every block it reads (taken in increasing order of table and block, as
  // pushes take theirs) until every range is read, so that each block is read as one version.
  void ReaderLockBlock(uint32_t block) const;
  void ReaderUnlockBlock(uint32_t block) const;
  // REQUIRES: a thread waiting for this call holds ReaderLockBlock(block); begin + out.size()
  // <= BlockSize(block). Copies the parameters [begin, begin + out.size()) to out, as Read.
  void ReadLocked(uint32_t block, size_t begin, absl::Span<float> out, bool stream) const;
  // Applies one update to block `block`. REQUIRES: Owns(block), values.size()==BlockSize.
  void Apply(uint32_t block, absl::Span<const float> values, const UpdateOptions& options);
  // The same with the values in pieces that cover the block in order (BlockPiece): one
  // update (one step), under one hold of the block's lock, bit for bit what Apply does with
  // the values in one span (every rule is element-wise; REQUIRES: clip_norm == 0, which sums
  // the whole block).
  void Apply(uint32_t block, absl::Span<const BlockPiece> pieces, const UpdateOptions& options);

  // ---- A push's finite check and SGD update in one pass (Shard::ApplyPush). The caller
  // locks every block the push updates (LockBlock, in increasing order of table and block, so
  // that two such pushes cannot deadlock), applies each update with ApplyCountingNonFinite,
  // then keeps them all (CountUpdate per update, UnlockBlock) or undoes them in reverse order
  // (UndoUpdate, UnlockBlock): no reader sees an update that is then undone.
  // True when this table's updates may take that path: SGD without clip_norm.
  bool SupportsOnePass() const;
  void LockBlock(uint32_t block) const;
  void UnlockBlock(uint32_t block) const;
  // REQUIRES: this thread holds LockBlock(block); SupportsOnePass(); the pieces cover the
  // block in order; `undo` holds BlockSize(block) floats. Applies one gradient update (one
  // step) reading each value once, a value that is not finite as 0, and returns how many were
  // not finite. `undo` and *old_step receive what UndoUpdate needs.
  size_t ApplyCountingNonFinite(uint32_t block, absl::Span<const BlockPiece> pieces, float* undo,
                                int64_t* old_step);
  // REQUIRES: this thread holds LockBlock(block). Puts back the parameters and step an
  // ApplyCountingNonFinite of the block saved.
  void UndoUpdate(uint32_t block, const float* undo, int64_t old_step);
  using TablePart::CountUpdate;

  // ---- A large push applied in ranges by several threads (Shard::ApplyUpdates). The caller
  // locks every block the push updates (LockBlock, in increasing order of table and block,
  // as for one pass) and keeps them locked until the helpers are done; per update it calls
  // BeginLockedUpdate once, has ApplyPiecesLocked applied over pieces that cover the block
  // once (from any threads, each piece once), then CountUpdate. Each range comes out bit for
  // bit as in a whole-block Apply: REQUIRES AppliesInRanges(options).
  // True when this table's updates of that kind are element-wise (no clip_norm, which sums
  // the whole block; deltas always are).
  bool AppliesInRanges(const UpdateOptions& options) const;
  // REQUIRES: this thread holds LockBlock(block). The step the update uses (one update).
  int64_t BeginLockedUpdate(uint32_t block, const UpdateOptions& options);
  // REQUIRES: the caller's thread holds LockBlock(block) and waits for this call; `pieces`
  // lie inside the block; `step` is BeginLockedUpdate's. Applies the values of `pieces`.
  void ApplyPiecesLocked(uint32_t block, int64_t step, absl::Span<const BlockPiece> pieces,
                         const UpdateOptions& options);

  uint64_t NumRows() const override { return blocks_.size(); }
  uint64_t NumBytes() const override { return bytes_; }
  void BeginSnapshot(uint64_t epoch, const SnapshotSink* sink) override;
  absl::Status WriteSnapshot(size_t record_bytes) override;
  void EndSnapshot() override;
  absl::Status RestoreRecord(absl::string_view key, absl::string_view value) override;

 private:
  struct Block {
    explicit Block(size_t n) : size(n), stride(DenseSlotStride(n)) {}
    const size_t size;    // values per parameter or slot array
    const size_t stride;  // floats from one array's start to the next's
    mutable absl::Mutex mu;
    // [params][padding][slot0][padding][slot1]: slot s at stride * (s + 1).
    std::vector<float> data ABSL_GUARDED_BY(mu);
    int64_t step ABSL_GUARDED_BY(mu) = 0;         // updates applied to this block
    uint64_t saved_epoch ABSL_GUARDED_BY(mu) = 0;  // last snapshot that has this block
  };
  Block* Find(uint32_t block) const;
  // Under b->mu, before an update of block `id` changes it: saves its old contents if a
  // snapshot is under way and has not saved it yet; returns the step the update uses.
  int64_t BeginUpdate(uint32_t id, Block* b, const UpdateOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu);
  // A block's snapshot record: [int64 step][params][slot0]..., without the padding.
  absl::string_view EncodeBlock(const Block& b) const ABSL_SHARED_LOCKS_REQUIRED(b.mu);
  static std::string BlockKey(uint32_t id);
  void RecordSinkError(const absl::Status& status);

  // Constant after construction.
  std::vector<uint32_t> block_ids_;                   // owned, ascending
  absl::flat_hash_map<uint32_t, size_t> position_;    // block id -> index in blocks_
  std::vector<std::unique_ptr<Block>> blocks_;
  uint64_t bytes_ = 0;

  // The snapshot in progress: its epoch (0 = none) and sink. Written only while no update
  // is in flight (BeginSnapshot) or after the writer is done (EndSnapshot); the epoch's
  // release/acquire publishes the sink to updating threads.
  std::atomic<uint64_t> active_epoch_{0};
  const SnapshotSink* sink_ = nullptr;
  absl::Mutex error_mu_;
  absl::Status sink_error_ ABSL_GUARDED_BY(error_mu_);
};

// Counters of a sparse table's memory budget (zero for a table that keeps every row in memory,
// apart from resident_rows).
struct SpillStats {
  uint64_t resident_rows = 0;    // rows in memory
  uint64_t spilled_rows = 0;     // rows only in the spill table
  uint64_t faults = 0;           // rows read back from the spill table
  uint64_t evictions = 0;        // rows dropped from memory (written out if they changed)
  uint64_t writes = 0;           // rows written to the spill table
  uint64_t eviction_errors = 0;  // evictions that failed (the row stayed in memory)
  // Rows looked at to pick eviction victims: the eviction policy's work, at most
  // kVictimSamples (16) per victim.
  uint64_t victim_slots_examined = 0;
};

// This server's rows of a sparse table: key -> row, created by the first update of a key
// from the table's deterministic initializer; a read of a key that is no row gets those
// initial values and creates nothing. Thread-safe.
//
// Memory budget. Given a SpillTable and budget_rows > 0, at most budget_rows rows stay in
// memory; the others live in the spill table, each with its step and optimizer slots, and are
// faulted back in when a pull or push names them. The spill table keeps the copy it had of a
// row faulted in: a row that was only read since is dropped at eviction without writing it
// again, and one that changed ("dirty") is written over its old copy. So the spill table holds
// every row that is not in memory, plus older copies of some rows that are. The budget is split
// evenly over the stripes (rows hash evenly onto them), and each stripe evicts on its own,
// under its own lock, so pulls and pushes of rows in different stripes never wait for each
// other's I/O. Rows pinned by a push in flight are never evicted; a stripe whose rows are all
// pinned goes over its share until the push is done. A push that would pin more rows beyond
// the budget than the memory budget has room for is refused first (NewRowsBytes). Which
// stripe a key lands in depends on a seed drawn once per process, so that a client cannot
// choose keys that all land in one stripe (one lock, and a 1/256 share of the budget).
//
// Eviction picks the least frequently used of 16 rows sampled at random among the stripe's
// rows that are not pinned (LFU by sampling, as Redis does): a use counter per row, halved
// every 20 x (stripe budget) uses so that popularity can change. On Zipf-distributed keys this
// keeps clearly more hot rows than LRU or CLOCK at small budgets (docs/performance.md has the
// measured hit ratios), and costs a counter increment per use instead of list updates (the
// list of unpinned rows changes only when a row's first pin starts or its last one ends).
//
// Snapshots with spilled rows. Rows move between memory and the spill table only while
// holding move_mu_ shared; BeginSnapshot holds it exclusively while it sets the epoch, takes a
// Snapshot() of the spill table and notes which keys in memory have a copy there, so the cut is
// one instant for both places. Rows in memory at the cut are handled as above (copy-on-write);
// the rows that were only in the spill table at the cut are read from its snapshot, skipping
// the noted keys (their copy there is stale). A row evicted before the writer saved it is
// copied aside like an updated one; a row faulted in after the cut counts as saved (its cut
// value is in the spill snapshot, or was saved before it was evicted). So every row is written
// exactly once, as of the cut.
class SparseTablePart final : public TablePart {
 public:
  static constexpr int kNumStripes = 256;
  // What a row costs beside its floats: an index entry at a typical load (about half full)
  // and its keys/steps/saved_epoch entries.
  static constexpr uint64_t kBookkeepingBytesPerRow = 2 * RowIndex::bytes_per_entry() + 3 * 8;

  // `spill` (not owned; must outlive the table) with budget_rows > 0 limits the rows in memory
  // as described above; with nullptr or 0 every row stays in memory.
  SparseTablePart(const common::TableInfo& info, const kernels::OptimizerParams& optimizer,
                  storage::SpillTable* spill = nullptr, uint64_t budget_rows = 0);

  // True if rows beyond the budget go to a spill table.
  bool spills() const { return spill_ != nullptr; }
  // RestoreRecord refuses (DATA_LOSS) a record holding a key for which `owns` is false: a
  // checkpoint of another server, or of another layout. Unset: every key is accepted.
  void set_key_owner(std::function<bool(uint64_t)> owns) { owns_key_ = std::move(owns); }
  uint64_t budget_rows() const { return budget_rows_; }
  // Charges the bytes this table allocates (rows, index, per-row bookkeeping) to `budget`
  // (not owned; must outlive the table), and, for a table that does not spill, refuses to
  // create rows beyond it. Call before the first row is created.
  void set_memory_budget(MemoryBudget* budget) { memory_ = budget; }
  // A Read (of a table that keeps every row in memory) or Apply of at least this many keys
  // spreads its stripes over the helper threads, if any.
  static constexpr size_t kParallelKeys = 4096;
  // Threads (not owned; may be null; must outlive the table) that take part of the stripes of
  // a large Read or Apply, the calling thread doing the rest: a lookup waits on cache misses,
  // and two cores keep twice as many in flight. Each stripe is still worked by one thread in
  // request order, so results are those of one thread. Tasks never wait for other tasks, so
  // the pool may be shared (Shard's apply pool). Call before the first Read or Apply.
  void set_helpers(common::ThreadPool* helpers) { helpers_ = helpers; }
  // RESOURCE_EXHAUSTED, naming the table, when the rows NewRowsBytes counts for `keys` would
  // not fit in the memory budget. Restoring a checkpoint checks this before it makes rows.
  [[nodiscard]] absl::Status CheckRoomForNewRows(absl::Span<const uint64_t> keys) const;
  // The bytes that a push of `parts`' keys would charge to the memory budget, each key
  // counted once however many times the parts name it, and in `missing` how many rows that
  // is; 0 (and 0 rows) for a table without a memory budget. A table that does not spill
  // counts the keys that are no row yet. One that spills makes room for new rows by evicting
  // others, within the row budget that Shard::CheckMemoryAtStart found room for, but cannot
  // evict pinned rows: it counts the rows beyond its budget that it would hold while the
  // keys are pinned (in each stripe, the rows pinned already and the keys no push pins yet,
  // beyond the stripe's rows and share). A push whose parts name several tables, or one table more
  // than once, sums these and checks the sum before it is admitted (Shard), since Apply cannot fail
  // half-way.
  uint64_t NewRowsBytes(absl::Span<const absl::Span<const uint64_t>> parts,
                        uint64_t* missing) const;
  // At least NewRowsBytes of `num_keys` keys, whichever they are, without looking any up: a
  // push whose bound fits need not look its rows up.
  uint64_t MaxNewRowsBytes(uint64_t num_keys) const;
  // NewRowsBytes' count of rows as an error names it: "N new rows", or for a table that
  // spills "N rows pinned beyond memory_budget_rows B".
  std::string NewRowsText(uint64_t rows) const;
  // About the bytes a table that spills, with rows of `row_bytes` and that row budget, holds
  // in memory when every stripe is at its share: the arena chunks its rows take (whole, with
  // the spare one a stripe keeps), its index and per-row bookkeeping at the capacities they
  // grow to. Shard::CheckMemoryAtStart's figure for the table.
  static double BytesAtRowBudget(size_t row_bytes, uint64_t budget_rows);
  // The stripe `key` lands in, in this process.
  int StripeForTest(uint64_t key) const { return StripeOf(key); }

  // Copies the rows of `keys` into out (keys.size() * dim), faulting spilled ones in. A key
  // that is no row (never pushed) reads as its initial values and stays no row: reads create
  // nothing, so they never need memory or disk. REQUIRES: out.size() == keys.size() * dim.
  // Errors (only when spilling) from the spill table, naming the table and key: DATA_LOSS (a
  // spilled row is corrupt), UNAVAILABLE / RESOURCE_EXHAUSTED / PERMISSION_DENIED (I/O). The
  // rows' values are unchanged then; `out` is partly written.
  [[nodiscard]] absl::Status Read(absl::Span<const uint64_t> keys, absl::Span<float> out);

  // A push to a spilling table goes Pin, Apply, Unpin: Pin brings the rows of `keys` into
  // memory (creating missing ones) and keeps them there until Unpin(keys), so that Apply cannot
  // fail half-way. Errors: as Read; nothing stays pinned then. No-op for a table that does not
  // spill.
  [[nodiscard]] absl::Status Pin(absl::Span<const uint64_t> keys);
  // Releases one Pin(keys) and evicts rows above the budget. An eviction that fails is logged
  // and counted; the row stays in memory and a later call evicts it.
  void Unpin(absl::Span<const uint64_t> keys);

  // Applies one update per key (rows of dim values). Missing rows are created first.
  // REQUIRES: when spilling, the keys are pinned.
  void Apply(absl::Span<const uint64_t> keys, absl::Span<const float> values,
             const UpdateOptions& options);

  // All rows (in memory and spilled); NumBytes counts what the rows in memory really take:
  // their floats in allocated chunks, the hash index at its capacity and the per-row vectors
  // at theirs (not the spill table's disk), and the rows copied aside for a snapshot in
  // progress until its writer has them (also charged to the memory budget, but never
  // refused: an update cannot fail).
  uint64_t NumRows() const override;
  uint64_t NumBytes() const override;
  SpillStats spill_stats() const;
  void BeginSnapshot(uint64_t epoch, const SnapshotSink* sink) override;
  absl::Status WriteSnapshot(size_t record_bytes) override;
  void EndSnapshot() override;
  uint64_t SnapshotRows() const override { return snapshot_rows_; }
  // When spilling, may fail as Read does (rows beyond the budget are spilled while restoring).
  absl::Status RestoreRecord(absl::string_view key, absl::string_view value) override;

 private:
  std::function<bool(uint64_t)> owns_key_;
  // Rows live in chunks aligned to a cache line, so that a row of 16 floats (or a multiple)
  // spans one line (or that many), not one more: a read of a row that is not cached waits on
  // one miss, not two.
  static constexpr std::align_val_t kChunkAlignment{64};
  struct ChunkDeleter {
    void operator()(float* p) const { ::operator delete[](p, kChunkAlignment); }
  };
  using Chunk = std::unique_ptr<float[], ChunkDeleter>;
  struct Stripe {
    mutable absl::Mutex mu;
    // Rows in memory occupy slots [0, keys.size()); evicting a row moves the last one into its
    // slot.
    RowIndex index ABSL_GUARDED_BY(mu);  // key -> row slot
    std::vector<Chunk> chunks ABSL_GUARDED_BY(mu);
    std::vector<uint64_t> keys ABSL_GUARDED_BY(mu);         // per slot
    std::vector<int64_t> steps ABSL_GUARDED_BY(mu);         // per slot
    std::vector<uint64_t> saved_epoch ABSL_GUARDED_BY(mu);  // per slot
    // Rows copied aside for the snapshot in progress: key -> (step, row).
    absl::flat_hash_map<uint64_t, std::pair<int64_t, std::vector<float>>> pending
        ABSL_GUARDED_BY(mu);
    // Spilling tables only.
    uint64_t budget = 0;                             // this stripe's share; const after ctor
    std::vector<uint16_t> uses ABSL_GUARDED_BY(mu);  // per slot: LFU counter
    std::vector<uint32_t> pins ABSL_GUARDED_BY(mu);  // per slot: pushes in flight
    std::vector<uint8_t> flags ABSL_GUARDED_BY(mu);  // per slot: kOnDisk, kDirty
    // The slots without a pin, in no order, and per slot its position there (RowIndex::kAbsent
    // while pinned): victims are sampled from them, so a stripe of many pinned rows costs no
    // scan, and keys.size() - unpinned.size() rows are pinned.
    std::vector<uint32_t> unpinned ABSL_GUARDED_BY(mu);
    std::vector<uint32_t> unpinned_at ABSL_GUARDED_BY(mu);
    uint64_t uses_since_aging ABSL_GUARDED_BY(mu) = 0;
    uint64_t random ABSL_GUARDED_BY(mu) = 0;  // xorshift state for sampling
    uint64_t on_disk ABSL_GUARDED_BY(mu) = 0;           // keys in the spill table
    uint64_t resident_on_disk ABSL_GUARDED_BY(mu) = 0;  // ... of rows also in memory
    uint64_t faults ABSL_GUARDED_BY(mu) = 0;
    uint64_t evictions ABSL_GUARDED_BY(mu) = 0;
    uint64_t writes ABSL_GUARDED_BY(mu) = 0;
    uint64_t eviction_errors ABSL_GUARDED_BY(mu) = 0;
    uint64_t victim_slots_examined ABSL_GUARDED_BY(mu) = 0;
    int64_t bytes ABSL_GUARDED_BY(mu) = 0;  // what StripeBytes() said last
  };
  // Bytes the stripe's containers hold (capacities, not sizes).
  int64_t StripeBytes(const Stripe& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Brings bytes_, s.bytes and the memory budget up to date after s changed size.
  void Recount(Stripe& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Frees s.pending (the snapshot's writer has its rows, or the snapshot is over).
  void DropPending(Stripe& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // About what one more row costs: its floats plus index and bookkeeping entries
  // (kBookkeepingBytesPerRow).
  uint64_t RowCost() const;
  // Bytes of one arena chunk (rows_per_chunk_ rows).
  uint64_t ChunkBytes() const;
  // What `n` more rows in `s` cost: RowCost each, and the chunks they need allocated.
  uint64_t NewRowsCost(const Stripe& s, uint64_t n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Spilling: what pinning `n` keys in `s`, none pinned now, may add beyond its rows and its
  // share (see NewRowsBytes), and in `rows` how many rows that is.
  uint64_t PinnedBeyondBudgetCost(const Stripe& s, uint64_t n, uint64_t* rows) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  int StripeOf(uint64_t key) const;
  // A request's keys grouped by stripe with a stable counting sort: the positions (indexes
  // into the keys) of stripe s are order[first[s] .. first[s + 1]), in request order. A call
  // then takes each stripe's lock once, not once per key, and prefetches the index entries
  // and rows of the keys ahead under it (a request's rows are scattered over the table, so a
  // per-key lookup waits on several cache misses in turn); the updates of a key that appears
  // twice keep their order, and rows are created in the same order within a stripe as a
  // per-key loop would create them.
  struct StripeGroups {
    std::vector<uint32_t> order;
    uint32_t first[kNumStripes + 1];
  };
  void GroupByStripe(absl::Span<const uint64_t> keys, StripeGroups* groups) const;
  // Runs work(first, last) over the stripes [first, last) of a partition of all stripes: one
  // part per helper thread plus one on the calling thread when num_keys >= kParallelKeys,
  // else one part. Returns the first error by part.
  absl::Status ForStripes(size_t num_keys, absl::FunctionRef<absl::Status(int, int)> work);
  // Apply's work on one stripe: its keys' rows found (or created) and updated in order.
  void ApplyStripe(int stripe, absl::Span<const uint64_t> keys, absl::Span<const float> values,
                   const UpdateOptions& options, const StripeGroups& groups,
                   std::vector<uint32_t>* slots);
  // Read for a table that keeps every row in memory; ReadSpilling for one with a budget.
  absl::Status ReadResident(absl::Span<const uint64_t> keys, absl::Span<float> out);
  absl::Status ReadSpilling(absl::Span<const uint64_t> keys, absl::Span<float> out);
  // Read's and Apply's work on the n keys of one stripe at positions order[0, n) of `keys`:
  // finds (or creates) each row's slot into slots[0, n), prefetching ahead. kRead
  // (ReadResident): a missing row's slot is RowIndex::kAbsent (the reader fills in its initial
  // values; nothing is created). kUpdate: a missing row is created (a table without a budget)
  // or is a bug (a spilling Apply of a row not pinned); its step is prefetched too.
  enum class SlotUse { kRead, kUpdate };
  absl::Status FindSlots(Stripe& s, absl::Span<const uint64_t> keys, const uint32_t* order,
                         size_t n, SlotUse use, uint32_t* slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  size_t row_floats() const { return row_floats_; }
  float* RowPtr(Stripe& s, uint32_t slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Returns the slot of `key`, creating and initializing the row if missing (no budget).
  uint32_t FindOrCreate(Stripe& s, uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  uint32_t AddRow(Stripe& s, uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // The initial parameters of `key` (dim_ floats), and its whole row (with the slots).
  void InitParams(uint64_t key, float* params) const;
  void InitRow(uint64_t key, float* row) const;
  // Drops the row in `slot` (not pinned), moving the last row into it.
  void RemoveSlot(Stripe& s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Gives back the per-row vectors' and chunk list's memory once they hold much more than
  // the rows need (after a spike of pinned rows).
  static void ShrinkIfSparse(Stripe& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Takes `slot` out of s.unpinned (its pin count went from 0 to 1, or it is removed), or
  // puts it in (a new row, or its pin count went from 1 to 0).
  static void MarkPinned(Stripe& s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  static void MarkUnpinned(Stripe& s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

  // Spilling tables: moves between memory and the spill table.
  // The slot of `key` in memory: found, faulted in, or created. With `create` false, a key
  // neither in memory nor spilled is RowIndex::kAbsent, and nothing is evicted for it.
  absl::StatusOr<uint32_t> FindOrFault(Stripe& s, uint64_t key, bool create = true)
      ABSL_SHARED_LOCKS_REQUIRED(move_mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Evicts rows until one more fits in the stripe's share (or only pinned rows are left).
  absl::Status MakeRoom(Stripe& s) ABSL_SHARED_LOCKS_REQUIRED(move_mu_)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Evicts rows until the stripe is within its share (or only pinned rows are left); errors
  // are logged and counted.
  void Trim(Stripe& s) ABSL_SHARED_LOCKS_REQUIRED(move_mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  absl::Status Evict(Stripe& s, uint32_t slot) ABSL_SHARED_LOCKS_REQUIRED(move_mu_)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // A slot holding no pin, by LFU over up to kVictimSamples of them sampled at random; -1 at
  // once if every row is pinned.
  int64_t PickVictim(Stripe& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Counts a use of the row in `slot` (LFU).
  void Use(Stripe& s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  void UnpinHeld(absl::Span<const uint64_t> keys) ABSL_SHARED_LOCKS_REQUIRED(move_mu_);
  // The spilled rows of the snapshot in progress, as records of about record_bytes.
  absl::Status WriteSpilled(size_t record_bytes);

  const size_t dim_;
  const size_t row_floats_;  // dim * (1 + num_slots)
  storage::SpillTable* const spill_;  // Not owned; null = no budget.
  const uint64_t budget_rows_;
  const uint32_t rows_per_chunk_;
  const uint64_t stripe_seed_;      // StripeOf's, one per process
  MemoryBudget* memory_ = nullptr;  // Not owned; null = no budget.
  common::ThreadPool* helpers_ = nullptr;  // Not owned; null = one thread per call.
  std::atomic<int64_t> bytes_{0};   // sum of the stripes' bytes
  std::vector<float> slot_init_;  // a fresh row's slot values (row_floats - dim)
  std::unique_ptr<Stripe[]> stripes_;
  std::atomic<uint64_t> active_epoch_{0};
  uint64_t snapshot_rows_ = 0;  // written by the snapshot in progress (its writer's)
  const SnapshotSink* sink_ = nullptr;
  // Held shared while a row moves between memory and the spill table, exclusively while a
  // snapshot begins or ends. Lock order: Shard::apply_mu_, move_mu_, a stripe's mu; never
  // acquired while holding a stripe's mu.
  absl::Mutex move_mu_;
  // The spill table as of BeginSnapshot, and the keys that were in memory then with a (stale)
  // copy in it; set and reset with move_mu_ held exclusively, used by the snapshot writer in
  // between.
  std::unique_ptr<storage::SpillSnapshot> spill_snapshot_;
  absl::flat_hash_set<uint64_t> in_memory_at_cut_;
};

}  // namespace ps::server

#endif  // PS_SERVER_TABLE_H_
