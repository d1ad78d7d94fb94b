// LocalSgdStore: local SGD, also called periodic model averaging (the federated pattern,
// Paddle's GEO-async). The worker trains its own copy of the parameters for k steps and then
// pushes only the accumulated change, which the servers merge (training.local_sgd.merge:
// SUM adds it, AVERAGE adds it / num_workers). Training data never leaves the worker, and the
// network carries one round trip per k steps instead of one per step.
//
// It is a ParameterStore wrapped around the job's store, so the trainer and the models run
// unchanged:
//   - Pull serves the local copy. A period starts with a fresh copy from the servers (dense
//     tables when first pulled in the period, sparse rows when first pulled in the period);
//     those remote pulls carry the clock of the period's start, so that under SSP/BSP they
//     wait only for the others' last merged period.
//   - Push applies the table's configured optimizer to the local copy, with optimizer slots
//     that stay on the worker (across periods). After the k-th push of a period, the
//     difference between the local copy and the copy fetched at the period's start is pushed
//     as a delta (PushOptions::is_delta) with the step's clock, and the period ends.
//   - Finish pushes the delta of an unfinished period, then finishes the remote store.
// With k = 1 and plain SGD under SUM, the servers end up exactly where gradient pushes would
// take them (a delta of -lr * g instead of g).
//
// Memory: a copy of the dense tables, the sparse rows pulled in the current period, and the
// optimizer slots of every sparse row this worker ever updated.
#ifndef PS_WORKER_LOCAL_SGD_STORE_H_
#define PS_WORKER_LOCAL_SGD_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/parameter_store.h"
#include "kernels/optimizer.h"
#include "proto/config.pb.h"

namespace ps::worker {

struct LocalSgdStats {
  uint64_t local_steps = 0;   // pushes applied locally
  uint64_t merges = 0;        // deltas pushed to the servers
  uint64_t remote_pulls = 0;  // pulls that went to the servers
};

// Thread-safe (one mutex; a worker's trainer calls it from one thread).
class LocalSgdStore final : public common::ParameterStore {
 public:
  // `tables`: the job's tables (kind, shape or dim, optimizer). `steps`: k >= 1.
  // INVALID_ARGUMENT for k = 0, a table without shape/dim or an invalid optimizer.
  static absl::StatusOr<std::unique_ptr<LocalSgdStore>> Create(
      common::ParameterStore* remote /* not owned */, absl::Span<const TableConfig> tables,
      uint32_t steps);

  // Errors: NOT_FOUND (unknown table), INVALID_ARGUMENT (wrong kind or buffer size), and the
  // remote store's errors when the period's copy is fetched.
  absl::Status Pull(const common::PullBatch& batch, const common::PullOptions& options) override;
  // Errors: NOT_FOUND, INVALID_ARGUMENT (sizes, non-finite gradient values: nothing applied),
  // FAILED_PRECONDITION (a table or row not pulled in this period), and the remote store's
  // errors when a period's delta is pushed. A failed merge is of unknown fate (servers may
  // have applied part of it): every later Push, merge and Finish is then FAILED_PRECONDITION,
  // nothing applied, rather than sending the period again (it was, before 2026-12-05, and
  // servers that had applied it applied it twice).
  absl::Status Push(const common::PushBatch& batch, const common::PushOptions& options) override;
  // Merges the unfinished period (its delta pushed, as at a period's end); nothing when the
  // period is empty. Errors as a merge's.
  absl::Status Flush();
  // Flush, then the remote store's Finish.
  absl::Status Finish() override;
  // The remote store's.
  absl::StatusOr<common::WorkerPosition> ReportPosition(uint32_t epoch,
                                                        uint64_t offset) override {
    return remote_->ReportPosition(epoch, offset);
  }

  LocalSgdStats stats() const;

 private:
  struct Table {
    TableConfig config;
    kernels::OptimizerParams optimizer;
    int num_slots = 0;
    int64_t dim = 0;  // sparse: row width; dense: element count
    // Dense: the local copy, the copy fetched at the period's start, optimizer slots.
    bool fetched = false;
    std::vector<float> current, base;
    std::vector<std::vector<float>> slots;
    int64_t step = 0;
  };
  struct Row {
    std::vector<float> current, base;
  };
  struct RowState {
    int64_t step = 0;
    std::vector<float> slots;  // num_slots * dim
  };

  LocalSgdStore(common::ParameterStore* remote, uint32_t steps) : remote_(remote), k_(steps) {}

  absl::StatusOr<Table*> Find(const std::string& name, TableKind kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Merge(int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckNoFailedMerge() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  common::ParameterStore* const remote_;
  const uint32_t k_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Table> tables_ ABSL_GUARDED_BY(mu_);
  // Sparse rows fetched in this period, per table.
  absl::flat_hash_map<std::string, absl::flat_hash_map<uint64_t, Row>> rows_ ABSL_GUARDED_BY(mu_);
  // Optimizer state of sparse rows, per table; kept across periods.
  absl::flat_hash_map<std::string, absl::flat_hash_map<uint64_t, RowState>> row_state_
      ABSL_GUARDED_BY(mu_);
  uint32_t pushes_in_period_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t period_clock_ ABSL_GUARDED_BY(mu_) = -1;  // -1: no period open
  int64_t last_clock_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status merge_failed_ ABSL_GUARDED_BY(mu_);  // the first merge that failed
  LocalSgdStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::worker

#endif  // PS_WORKER_LOCAL_SGD_STORE_H_
