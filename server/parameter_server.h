// ParameterServer: one server process's lifecycle, without flags or signals.
//
// Owns the shard (its part of every table), the checkpointer (restore at start, periodic and
// final checkpoints), the gRPC service and server, and the metrics registry with its HTTP
// endpoint. ps_server's main turns flags into ParameterServerOptions and calls
//
//   ASSIGN_OR_RETURN(auto server, ParameterServer::Create(config, options));  // restores
//   RETURN_IF_ERROR(server->Start());                                        // serves
//   ... a signal thread calls server->RequestStop() ...
//   return server->Wait();                                 // drains, final checkpoint
//
// Tests start one in-process on port 0 the same way.
//
// State machine: NEW (Create: tables built, checkpoint restored) -> STARTED (Start: listening,
// health SERVING, checkpointer running) -> STOPPED (Wait returned: health NOT_SERVING, calls
// drained, final checkpoint written, listening socket closed).
#ifndef PS_SERVER_PARAMETER_SERVER_H_
#define PS_SERVER_PARAMETER_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/metrics/metrics.h"
#include "proto/config.pb.h"

namespace ps::common::metrics {
class MetricsHttpServer;
}  // namespace ps::common::metrics

namespace ps::server {

class Checkpointer;
class GrpcServer;
class ParameterServerService;
class Shard;

class ParameterServer;

// A stop asked for from another thread (a signal-waiting one), whether the server is still
// being created or already serving. Thread-safe.
class StopRequest {
 public:
  // Stops the server this request belongs to, or makes its Create stop and return CANCELLED.
  void Request();
  bool requested() const;

 private:
  friend class ParameterServer;
  // Requests go to `server` from now on; false (nothing attached) if one came already.
  bool Attach(ParameterServer* server);
  void Detach(const ParameterServer* server);

  mutable absl::Mutex mu_;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  ParameterServer* server_ ABSL_GUARDED_BY(mu_) = nullptr;
};

struct ParameterServerOptions {
  // This server's index, 0..num_servers-1. REQUIRES: in range.
  int32_t server_index = 0;
  // Address and port to listen on; port 0 picks a free one (see port()).
  std::string host = "0.0.0.0";
  int32_t port = 0;
  // RocksDB checkpoints, the PROGRESS file, and DIR/spill for tables with a memory budget.
  // Empty: no persistence (a warning is logged) and no table may have a memory budget.
  std::string data_dir;
  // Restore at start: the newest checkpoint (restore_id unset), a given one, or nothing
  // (restore = false). Ignored without a data_dir.
  bool restore = true;
  std::optional<uint64_t> restore_id;
  // Threads serving pulls and pushes; 0 = server.num_threads, else the core count (at least
  // 2). A synchronous job gets at least one per worker, plus 2.
  int num_threads = 0;
  // The Prometheus endpoint: -1 = off, 0 = a free port; on metrics_host (empty = host).
  int32_t metrics_port = -1;
  std::string metrics_host;
  // Shut down by itself once every worker of the job has said it finished.
  bool exit_when_done = true;
  // A stop asked for from another thread (a signal): while Create allocates and initializes
  // the tables it ends Create with CANCELLED within one block's time (ShardOptions::cancelled)
  // instead of after the whole layout (gigabytes); later it stops the server (RequestStop).
  // Not owned; null = none.
  StopRequest* stop = nullptr;
};

// Threads serving the data path's queue (server.data_threads): the value set, or for 0 one
// per worker of the job, at most `cores` (at least 1).
int DataThreads(const JobConfig& config, unsigned cores);

// Requests the serving pool may hold (server.max_pool_requests): the value set, raised in a
// deterministic job to two per worker plus two, since each of a clock's pushes holds one
// while it waits for its turn, and a push refused for room never arrives: with more workers
// than the limit, the turn of worker 0 (which waits for every worker's push) never came.
int PoolRequests(const JobConfig& config);

// Thread-safe: RequestStop() may be called from any thread (a signal thread, the Shutdown
// RPC); Start() and Wait() are called once each, in that order, from one thread.
class ParameterServer {
 public:
  // Builds the shard from `config` (validated by the caller: common::ValidateJobConfig) and
  // restores the checkpoint asked for. Errors: INVALID_ARGUMENT (options or config), those of
  // Shard::Create and Checkpointer::Restore (DATA_LOSS for a corrupt checkpoint, ...);
  // CANCELLED when options.stop was requested before the server was ready.
  static absl::StatusOr<std::unique_ptr<ParameterServer>> Create(
      const JobConfig& config, const ParameterServerOptions& options);
  ~ParameterServer();

  // Starts the metrics endpoint (if asked for), the gRPC server and the checkpointer.
  // Errors: UNAVAILABLE (an address cannot be bound), INVALID_ARGUMENT (credentials).
  absl::Status Start();
  // The ports bound by Start() (metrics_port() = -1 without an endpoint).
  int port() const;
  int metrics_port() const;

  // Asks Wait() to stop the server. `final_checkpoint` = false skips the final checkpoint
  // (checkpoint.on_shutdown = false skips it regardless).
  void RequestStop(bool final_checkpoint = true);

  // Serves until RequestStop() or, with exit_when_done, until every worker finished; then
  // health NOT_SERVING, drains calls in flight (up to 5 s), writes the final checkpoint and
  // stops. Returns OK, or the final checkpoint's error.
  absl::Status Wait();

  Shard* shard() const { return shard_.get(); }
  // Updates applied since the restored checkpoint that the previous run reported and that
  // were lost (0 when nothing was restored or nothing was lost).
  uint64_t updates_lost() const { return updates_lost_; }

 private:
  ParameterServer(const JobConfig& config, const ParameterServerOptions& options);
  absl::Status Restore();
  void ServeUntilStopped();
  absl::Status Drain();

  // Constant after Create.
  const JobConfig config_;
  const ParameterServerOptions options_;
  // Declared first: outlives everything that registers metrics in it.
  common::metrics::Registry metrics_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<Checkpointer> checkpointer_;  // null without a data_dir
  uint64_t updates_lost_ = 0;

  // Set by Start.
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<GrpcServer> grpc_server_;
  std::unique_ptr<common::metrics::MetricsHttpServer> metrics_server_;
  common::metrics::Gauge* up_ = nullptr;
  common::metrics::CollectorHandle stats_metrics_;
  common::metrics::CollectorHandle process_metrics_;

  absl::Notification stop_requested_;
  absl::Mutex mu_;
  bool final_checkpoint_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server

#endif  // PS_SERVER_PARAMETER_SERVER_H_
