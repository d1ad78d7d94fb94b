// ParameterStore: the one interface between training code and parameter storage.
//
// Implementations:
//   - GrpcParameterStore (worker/rpc/): splits each call by the Partitioner, one concurrent
//     RPC per server, deadlines, retries of idempotent pushes.
//   - InProcessParameterStore (server/): calls the shard core directly (centralized mode and
//     socket-free tests).
//
// A training step pulls every table it needs in one Pull and pushes every gradient in one
// Push, so an implementation can make one round trip per server per step.
#ifndef PS_COMMON_PARAMETER_STORE_H_
#define PS_COMMON_PARAMETER_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ps::common {

// A whole dense table, read into `out` (row-major, size = the table's element count).
struct DensePull {
  std::string table;
  absl::Span<float> out;
};

// Sparse rows: `out` receives keys.size() rows of the table's dim, in the order of `keys`.
// Duplicate keys are allowed (each gets the row).
struct SparsePull {
  std::string table;
  absl::Span<const uint64_t> keys;
  absl::Span<float> out;
};

struct PullBatch {
  std::vector<DensePull> dense;
  std::vector<SparsePull> sparse;
};

// A gradient (or, with PushOptions::is_delta, a delta) for a whole dense table.
struct DensePush {
  std::string table;
  absl::Span<const float> values;
};

// Gradient rows for `keys` (keys.size() * dim floats). Keys should be unique; duplicates are
// applied as separate updates.
struct SparsePush {
  std::string table;
  absl::Span<const uint64_t> keys;
  absl::Span<const float> values;
};

struct PushBatch {
  std::vector<DensePush> dense;
  std::vector<SparsePush> sparse;
};

// The largest clock (steps) a peer may send or a checkpoint may hold: a clock counts steps,
// and one near 2^63 would overflow the step after it and the bound's sums.
inline constexpr int64_t kMaxClock = int64_t{1} << 62;

// Per-call options of Pull.
struct PullOptions {
  // The caller's clock (steps completed). Under SSP/BSP the pull waits until every live
  // worker's clock is at least clock - staleness.
  int64_t clock = 0;
};

// Per-call options of Push.
struct PushOptions {
  // The caller's clock after this step (steps completed, this one included).
  int64_t clock = 0;
  // The values are parameter deltas to add, not gradients for the optimizer (local SGD).
  bool is_delta = false;
};

// Where a worker is in its data shard, as a store remembers it: what a restarted worker
// resumes from.
struct WorkerPosition {
  uint32_t epoch = 0;   // epochs completed
  uint64_t offset = 0;  // examples consumed in the current epoch
  int64_t clock = 0;    // steps pushed
};

// Memory a store lends for the values of a push (ParameterStore::LendPushBuffer): the dense
// tables named in the lend, each whole, one after the other in that order. A push that names
// those tables in that order, with these spans as their values, reaches the server without a
// copy in this process. The memory starts zeroed and stays valid while this object lives, also
// after the store is gone. The server reads it while a push of it is in flight: the caller
// writes it only between such pushes (a push's values are the caller's until the call returns
// in any case). Once revoked() the caller must not write it again: the store gave up an
// attempt of a push whose server may still be reading it after the push returned (sent again
// by the socket, a copy of it applied). The caller keeps it, and its own buffers take over.
class LentBuffer {
 public:
  virtual ~LentBuffer() = default;
  LentBuffer(const LentBuffer&) = delete;
  LentBuffer& operator=(const LentBuffer&) = delete;

  // Every table's values, in the order of the lend.
  absl::Span<float> values() const { return values_; }
  // Table i of the lend (its element count).
  absl::Span<float> table(size_t i) const {
    return values_.subspan(starts_[i], starts_[i + 1] - starts_[i]);
  }
  size_t num_tables() const { return starts_.size() - 1; }
  // True once the caller may no longer write this memory (see the class comment). Thread-safe.
  bool revoked() const { return revoked_ != nullptr && revoked_->load(std::memory_order_acquire); }

 protected:
  // `starts`: where each table begins in `values`, then values.size(). `revoked`: the flag the
  // store sets to revoke the buffer (null: never revoked).
  LentBuffer(absl::Span<float> values, std::vector<size_t> starts,
             std::shared_ptr<const std::atomic<bool>> revoked = nullptr)
      : values_(values), starts_(std::move(starts)), revoked_(std::move(revoked)) {}

 private:
  const absl::Span<float> values_;
  const std::vector<size_t> starts_;
  const std::shared_ptr<const std::atomic<bool>> revoked_;
};

// Thread-safe: implementations accept concurrent calls.
class ParameterStore {
 public:
  virtual ~ParameterStore() = default;

  // Reads the requested tables into the caller's buffers.
  // Errors: NOT_FOUND (unknown table), INVALID_ARGUMENT (wrong kind or buffer size),
  // DEADLINE_EXCEEDED (consistency bound or server too slow), UNAVAILABLE (server down after
  // retries), FAILED_PRECONDITION (layout mismatch).
  virtual absl::Status Pull(const PullBatch& batch, const PullOptions& options) = 0;

  // Applies gradients (or deltas). Errors as Pull, plus INVALID_ARGUMENT for non-finite
  // values when the servers reject them. A failed push may have been applied on some
  // servers and not others; each server applies a given push at most once.
  virtual absl::Status Push(const PushBatch& batch, const PushOptions& options) = 0;

  // One step's exchange: applies `push` as Push(push, push_options) does, then reads `pull`
  // as Pull(pull, pull_options) does, the read seeing the push. Stores that talk to servers
  // do both in one round trip per server; this default (Push, then Pull) serves the others.
  // Errors: those of Push and Pull; after an error of the pull, the push may have been
  // applied (at most once, as always).
  virtual absl::Status PushPull(const PushBatch& push, const PushOptions& push_options,
                                const PullBatch& pull, const PullOptions& pull_options) {
    if (absl::Status s = Push(push, push_options); !s.ok()) return s;
    return Pull(pull, pull_options);
  }

  // The worker will push no more: it leaves the consistency bound so that it does not hold
  // back the others. Safe to call more than once.
  virtual absl::Status Finish() = 0;

  // Tells the store where this worker is in its data (epoch 0 and offset 0 = say nothing new)
  // and returns what it remembers of this worker: the furthest position it saw, which a
  // restarted worker resumes from; zeros for a worker it has not seen. The gRPC store keeps
  // it on the servers (and in their checkpoints), the in-process store in its shards. The
  // default remembers nothing. Errors as Pull.
  virtual absl::StatusOr<WorkerPosition> ReportPosition(uint32_t epoch, uint64_t offset) {
    (void)epoch;
    (void)offset;
    return WorkerPosition{};
  }

  // Memory for the values of the dense `tables` (LentBuffer) that this store can hand to
  // their server without copying it, or nullptr where it has none: the tables are not all
  // dense and held by one server, that server is not on this host (or not yet reached), or
  // the room it lends is taken. A caller then pushes from its own memory as always. The
  // default lends nothing.
  virtual std::unique_ptr<LentBuffer> LendPushBuffer(absl::Span<const std::string> tables) {
    (void)tables;
    return nullptr;
  }
};

}  // namespace ps::common

#endif  // PS_COMMON_PARAMETER_STORE_H_
