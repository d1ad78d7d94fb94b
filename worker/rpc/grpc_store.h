// GrpcParameterStore: the ParameterStore of a worker in a distributed job.
//
// Each Pull/Push is split by the Partitioner into one request per server, sent concurrently,
// and reassembled in order. Sparse keys are deduplicated before pulling. Every call has a
// deadline; calls that fail with UNAVAILABLE or DEADLINE_EXCEEDED are retried with
// exponential back-off and jitter (pushes carry (worker, incarnation, sequence), so a
// retried push is applied at most once). Every server receives every push, empty or not,
// so that each server's view of the worker's clock advances.
//
// Pushes of tables with a 16-bit wire_encoding use error feedback (PushResiduals) unless
// the table sets wire_error_feedback: false. Each Push encodes its gradients once, before
// the first attempt, and every retry resends those bytes, so a retried push neither re-adds
// nor loses a residual. A push that fails for good has still moved the residuals (its
// gradient is lost either way).
#ifndef PS_WORKER_RPC_GRPC_STORE_H_
#define PS_WORKER_RPC_GRPC_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "common/parameter_store.h"
#include "common/partitioner.h"
#include "proto/config.pb.h"
#include "proto/ps.grpc.pb.h"
#include "worker/rpc/push_residuals.h"

namespace ps::worker {

struct GrpcStoreOptions {
  // This worker's index and process incarnation (e.g. start time in ns). -1 = a tool, which
  // takes no part in exactly-once or the consistency bound.
  int32_t worker_id = 0;
  uint64_t worker_incarnation = 1;
  // Deadline of each attempt.
  absl::Duration deadline = absl::Seconds(60);
  // Retries after UNAVAILABLE / DEADLINE_EXCEEDED; then the error is returned.
  uint32_t max_retries = 20;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // Called before each retry (server index, attempt, error); for logs and tests.
  std::function<void(uint32_t, uint32_t, const absl::Status&)> on_retry;
  // Called when a server answers again after failed attempts (server index, retries, time
  // since the first failure); for logs and recovery measurements.
  std::function<void(uint32_t, uint32_t, absl::Duration)> on_recovered;
  // Error feedback of 16-bit pushes: the most sparse rows per table that keep a residual
  // (LRU; each costs dim floats plus about 64 bytes). 0 = no feedback for sparse tables.
  size_t max_residual_rows = PushResiduals::kDefaultMaxSparseRows;
};

// The options of a job's worker `worker_id` (incarnation `incarnation`): deadlines, retries and
// back-off from the config's rpc section, and retries and recoveries logged as warnings.
GrpcStoreOptions JobStoreOptions(const JobConfig& config, int32_t worker_id,
                                 uint64_t incarnation);

// Counters of one store (for the trainer's throughput log).
struct GrpcStoreStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t retries = 0;
  uint64_t duplicate_pushes = 0;
};

// Thread-safe.
//
// Metrics (ps_worker_, in the registry given to Create): retries and failed attempts per
// server, payload bytes sent and received, pushes the servers answered as duplicates.
class GrpcParameterStore final : public common::ParameterStore {
 public:
  // Connects to config.cluster().servers (the config must be prepared). INVALID_ARGUMENT if
  // the server list does not match the layout; errors of the credentials. The store
  // registers its metrics in `metrics` (not owned, must outlive the store; nullptr = a
  // registry of its own).
  static absl::StatusOr<std::unique_ptr<GrpcParameterStore>> Create(
      const JobConfig& config, const GrpcStoreOptions& options,
      common::metrics::Registry* metrics = nullptr);
  // With explicit stubs (tests).
  static absl::StatusOr<std::unique_ptr<GrpcParameterStore>> CreateWithStubs(
      const JobConfig& config, const GrpcStoreOptions& options,
      std::vector<std::unique_ptr<ParameterServer::StubInterface>> stubs,
      common::metrics::Registry* metrics = nullptr);

  ~GrpcParameterStore() override;

  absl::Status Pull(const common::PullBatch& batch, const common::PullOptions& options) override;
  absl::Status Push(const common::PushBatch& batch, const common::PushOptions& options) override;
  absl::Status Finish() override;
  // Heartbeat(epoch, offset, /*finished=*/false).
  absl::StatusOr<common::WorkerPosition> ReportPosition(uint32_t epoch,
                                                        uint64_t offset) override;

  // Waits until every server answers ServerInfo with this job's layout (FAILED_PRECONDITION
  // if one differs) or `timeout` passes (UNAVAILABLE naming the silent servers).
  absl::Status WaitForServers(absl::Duration timeout);
  // Where a worker is, as the servers remember it.
  using Position = common::WorkerPosition;
  // Tells every server where this worker is in its data (offset 0 and epoch 0 = say
  // nothing) and reads back what they remember: the furthest position over the servers,
  // which a restarted worker resumes from.
  absl::StatusOr<Position> Heartbeat(uint32_t epoch, uint64_t offset, bool finished);

  GrpcStoreStats stats() const;
  const common::Partitioner& partitioner() const { return partitioner_; }

 private:
  struct Metrics;
  GrpcParameterStore(const JobConfig& config, const GrpcStoreOptions& options,
                     common::Partitioner partitioner,
                     std::vector<std::unique_ptr<ParameterServer::StubInterface>> stubs,
                     common::metrics::Registry* metrics);
  RequestHeader Header(int64_t clock, uint64_t sequence) const;
  // Sends `requests[s]` to server s for every s where send[s], concurrently, with retries.
  template <typename Request, typename Response>
  absl::Status FanOut(const std::vector<Request>& requests, std::vector<Response>* responses,
                      const std::vector<bool>& send,
                      void (ParameterServer::StubInterface::async_interface::*method)(
                          grpc::ClientContext*, const Request*, Response*,
                          std::function<void(grpc::Status)>));
  absl::Duration Backoff(uint32_t attempt) const;

  const JobConfig config_;
  const GrpcStoreOptions options_;
  const common::Partitioner partitioner_;
  std::vector<std::unique_ptr<ParameterServer::StubInterface>> stubs_;
  std::atomic<uint64_t> next_sequence_{1};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> retries_{0};
  std::atomic<uint64_t> duplicates_{0};
  // Held while a Push encodes (not while it sends).
  absl::Mutex residuals_mu_;
  PushResiduals residuals_ ABSL_GUARDED_BY(residuals_mu_);
  std::unique_ptr<common::metrics::Registry> own_registry_;  // when none was given
  std::unique_ptr<Metrics> metrics_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_RPC_GRPC_STORE_H_
