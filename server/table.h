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
#ifndef PS_SERVER_TABLE_H_
#define PS_SERVER_TABLE_H_

#include <cstdint>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/partitioner.h"
#include "kernels/optimizer.h"
#include "proto/config.pb.h"

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

  // Restores one record written by WriteSnapshot. INVALID_ARGUMENT/DATA_LOSS if it does not
  // fit this table (wrong size, block out of range); nothing is changed then.
  virtual absl::Status RestoreRecord(absl::string_view key, absl::string_view value) = 0;

  uint64_t updates_applied() const;

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
  // `blocks`: the block ids this server owns, from the Partitioner.
  DenseTablePart(const common::TableInfo& info, const kernels::OptimizerParams& optimizer,
                 const common::Partitioner& partitioner, uint32_t server_index);

  // True if this server owns block `block`.
  bool Owns(uint32_t block) const;
  // Number of values in block `block`. REQUIRES: Owns(block).
  size_t BlockSize(uint32_t block) const;

  // Copies block `block`'s parameters to out. REQUIRES: Owns(block), out.size()==BlockSize.
  void Read(uint32_t block, absl::Span<float> out) const;
  // Applies one update to block `block`. REQUIRES: Owns(block), values.size()==BlockSize.
  void Apply(uint32_t block, absl::Span<const float> values, const UpdateOptions& options);

  uint64_t NumRows() const override { return blocks_.size(); }
  uint64_t NumBytes() const override { return bytes_; }
  void BeginSnapshot(uint64_t epoch, const SnapshotSink* sink) override;
  absl::Status WriteSnapshot(size_t record_bytes) override;
  void EndSnapshot() override;
  absl::Status RestoreRecord(absl::string_view key, absl::string_view value) override;

 private:
  struct Block {
    explicit Block(size_t n) : size(n) {}
    const size_t size;  // values per parameter or slot array
    mutable absl::Mutex mu;
    std::vector<float> data ABSL_GUARDED_BY(mu);  // [params][slot0]...
    int64_t step ABSL_GUARDED_BY(mu) = 0;         // updates applied to this block
    uint64_t saved_epoch ABSL_GUARDED_BY(mu) = 0;  // last snapshot that has this block
  };
  Block* Find(uint32_t block) const;
  static absl::string_view EncodeBlock(int64_t step, absl::Span<const float> data);
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

// This server's rows of a sparse table: key -> row, created on first pull with the table's
// deterministic initializer. Thread-safe.
class SparseTablePart final : public TablePart {
 public:
  static constexpr int kNumStripes = 256;

  SparseTablePart(const common::TableInfo& info, const kernels::OptimizerParams& optimizer);

  // Copies the rows of `keys` into out (keys.size() * dim), creating missing rows.
  // REQUIRES: out.size() == keys.size() * dim.
  void Read(absl::Span<const uint64_t> keys, absl::Span<float> out);
  // Applies one update per key (rows of dim values). Missing rows are created first.
  void Apply(absl::Span<const uint64_t> keys, absl::Span<const float> values,
             const UpdateOptions& options);

  uint64_t NumRows() const override;
  uint64_t NumBytes() const override;
  void BeginSnapshot(uint64_t epoch, const SnapshotSink* sink) override;
  absl::Status WriteSnapshot(size_t record_bytes) override;
  void EndSnapshot() override;
  absl::Status RestoreRecord(absl::string_view key, absl::string_view value) override;

 private:
  static constexpr uint32_t kRowsPerChunk = 1024;
  struct Stripe {
    mutable absl::Mutex mu;
    absl::flat_hash_map<uint64_t, uint32_t> index ABSL_GUARDED_BY(mu);  // key -> row slot
    std::vector<std::unique_ptr<float[]>> chunks ABSL_GUARDED_BY(mu);
    std::vector<uint64_t> keys ABSL_GUARDED_BY(mu);         // per slot
    std::vector<int64_t> steps ABSL_GUARDED_BY(mu);         // per slot
    std::vector<uint64_t> saved_epoch ABSL_GUARDED_BY(mu);  // per slot
    // Rows copied aside for the snapshot in progress: key -> (step, row).
    absl::flat_hash_map<uint64_t, std::pair<int64_t, std::vector<float>>> pending
        ABSL_GUARDED_BY(mu);
  };
  static int StripeOf(uint64_t key);
  size_t row_floats() const { return row_floats_; }
  float* RowPtr(Stripe& s, uint32_t slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Returns the slot of `key`, creating and initializing the row if missing.
  uint32_t FindOrCreate(Stripe& s, uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  uint32_t AddRow(Stripe& s, uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

  const size_t dim_;
  const size_t row_floats_;  // dim * (1 + num_slots)
  std::vector<float> slot_init_;  // a fresh row's slot values (row_floats - dim)
  std::unique_ptr<Stripe[]> stripes_;
  std::atomic<uint64_t> active_epoch_{0};
  const SnapshotSink* sink_ = nullptr;
};

}  // namespace ps::server

#endif  // PS_SERVER_TABLE_H_
