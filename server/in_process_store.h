// InProcessParameterStore: the ParameterStore of centralized mode and of socket-free tests.
// It splits requests with the Partitioner exactly as GrpcParameterStore does, and calls the
// shards (one per server index, all in this process) directly: no sockets, no serialization.
// It validates nothing itself: the shards check every part (Shard::CheckPush, CheckPull), so
// bad input gets the same status, counted under the same reason, as through the gRPC service.
// A part it cannot split (an unknown table, the wrong kind, a payload of the wrong size) goes
// whole to one shard, which refuses it. Only the caller's own buffers (a pull's `out` of the
// wrong size) are refused here (INVALID_ARGUMENT). Every shard checks its part of a push
// before any applies, so a bad push changes no shard.
#ifndef PS_SERVER_IN_PROCESS_STORE_H_
#define PS_SERVER_IN_PROCESS_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/parameter_store.h"
#include "server/shard.h"

namespace ps::server {

struct InProcessStoreOptions {
  // The worker this store speaks for (exactly-once and the consistency bound); -1 = a reader
  // (pulls only: pushes need a worker slot).
  int32_t worker_id = 0;
  uint64_t worker_incarnation = 1;
  // Longest a pull waits for the consistency bound.
  absl::Duration pull_timeout = absl::Minutes(10);
};

// The options of server `server_index`'s shard in centralized mode (CreateCentralized, the
// Python client's): the config's reject_nonfinite, and its parallel apply threshold as a
// server process on this host would choose it (ParallelApplyValues with the cores this
// process may use), so a large push is applied by several threads here as it would be there.
ShardOptions CentralizedShardOptions(const JobConfig& config, uint32_t server_index);

// Thread-safe.
class InProcessParameterStore final : public common::ParameterStore {
 public:
  // `shards`: one per server index, in order. Not owned; they must outlive the store.
  // INVALID_ARGUMENT when they are not the job's servers 0..N-1 with one layout.
  static absl::StatusOr<std::unique_ptr<InProcessParameterStore>> Create(
      std::vector<Shard*> shards, const InProcessStoreOptions& options);
  // Centralized mode: builds the shards of every server of `config` (validated: see
  // common::ValidateJobConfig), owned by the store, as one worker's job
  // (cluster.num_workers = 1). Tables' memory budgets are ignored (no spill directory; logged).
  // Errors: those of Shard::Create.
  static absl::StatusOr<std::unique_ptr<InProcessParameterStore>> CreateCentralized(
      JobConfig config, const InProcessStoreOptions& options);

  absl::Status Pull(const common::PullBatch& batch, const common::PullOptions& options) override;
  absl::Status Push(const common::PushBatch& batch, const common::PushOptions& options) override;
  absl::Status Finish() override;
  // Records the position in every shard's WorkerTracker and returns the furthest one there.
  absl::StatusOr<common::WorkerPosition> ReportPosition(uint32_t epoch,
                                                        uint64_t offset) override;

 private:
  InProcessParameterStore(std::vector<Shard*> shards, const InProcessStoreOptions& options);
  RequestInfo Info(int64_t clock, uint64_t sequence) const;
  struct PullPart;
  struct SplitPush;
  // A pull cut into each shard's parts (INVALID_ARGUMENT for an `out` of the wrong size).
  absl::Status SplitPull(const common::PullBatch& batch,
                         std::vector<std::vector<PullPart>>* parts) const;
  // A push's dense tables cut by block, its sparse rows regrouped by the server of each key.
  absl::Status SplitDense(const common::PushBatch& batch, SplitPush* split) const;
  void SplitSparse(const common::PushBatch& batch, SplitPush* split) const;

  std::vector<std::unique_ptr<Shard>> owned_shards_;  // CreateCentralized's; else empty
  std::vector<Shard*> shards_;  // owned_shards_, or not owned
  const InProcessStoreOptions options_;
  const common::Partitioner* partitioner_;  // shards_[0]'s
  std::atomic<uint64_t> next_sequence_{1};
};

}  // namespace ps::server

#endif  // PS_SERVER_IN_PROCESS_STORE_H_
