// The ParameterServer gRPC service (callback API) over one Shard.
//
// Every request is checked in full before anything changes (see Shard): a bad request gets
// a precise status and leaves the server's state as it was. Pulls may wait for the
// consistency bound and pushes run optimizer math, so both run on a worker pool, never on
// gRPC's callback threads.
#ifndef PS_SERVER_RPC_SERVICE_H_
#define PS_SERVER_RPC_SERVICE_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "common/thread_pool.h"
#include "proto/ps.grpc.pb.h"
#include "server/rpc/auth.h"
#include "server/shard.h"

namespace ps::server {

struct ServiceOptions {
  // Threads running pulls and pushes. REQUIRES: > 0.
  int num_threads = 4;
  // Longest a pull waits for the consistency bound (also capped by the call's deadline).
  absl::Duration max_pull_wait = absl::Minutes(10);
  // Whose calls are checked, and how (server/rpc/auth.h): who may act as which worker, who
  // may administer.
  AuthOptions auth;
};

// Hooks into the process that owns the service (checkpointing, shutdown).
struct ServiceHooks {
  // Writes a checkpoint now and returns what was written.
  std::function<absl::StatusOr<CheckpointResponse>()> checkpoint;
  // Starts a graceful shutdown (returns at once).
  std::function<void(bool checkpoint)> shutdown;
  // Fills restore facts of ServerInfo (restored checkpoint, updates lost).
  std::function<void(ServerInfoResponse*)> server_info;
  // Fills checkpoint facts of Stats.
  std::function<void(StatsResponse*)> stats;
};

// Thread-safe.
//
// Metrics (registered in the registry given to the constructor): latency histograms of pulls
// and pushes from arrival to answer (ps_server_{pull,push}_latency_seconds), the time pulls
// wait for the consistency bound, request and response bytes, answers by method and code,
// and refused requests by method, code and reason (the reason Shard::Reject tagged the status
// with; "other" when none). Each pull or push costs a few atomic adds; a refused one also a
// lookup under a mutex.
class ParameterServerService final : public ::ps::ParameterServer::CallbackService {
 public:
  // `shard` is not owned and must outlive the service. The service registers its metrics in
  // `metrics` (not owned, must outlive the service; nullptr = a registry of its own).
  ParameterServerService(Shard* shard, const ServiceOptions& options, ServiceHooks hooks,
                         common::metrics::Registry* metrics = nullptr);
  ~ParameterServerService() override;

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const PullRequest* request, PullResponse* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const PushRequest* request, PushResponse* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const StatsRequest* request, StatsResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const CheckpointRequest* request,
                                       CheckpointResponse* response) override;
  grpc::ServerUnaryReactor* ServerInfo(grpc::CallbackServerContext* context,
                                       const ServerInfoRequest* request,
                                       ServerInfoResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* context,
                                     const ShutdownRequest* request,
                                     ShutdownResponse* response) override;

  // The request handlers without gRPC around them (used by the service and by tests/fuzzers).
  // They count in the metrics as requests do.
  absl::Status HandlePull(const PullRequest& request, absl::Time deadline,
                          PullResponse* response);
  absl::Status HandlePush(const PushRequest& request, PushResponse* response);
  // Heartbeat from `peer`: PERMISSION_DENIED when the peer is not the worker the header
  // names; FAILED_PRECONDITION for `finished` from an incarnation that is not the worker's
  // current one (only the running process may say it is done). A tool's heartbeat (negative
  // id) changes nothing.
  absl::Status HandleHeartbeat(const PeerIdentity& peer, const HeartbeatRequest& request,
                               HeartbeatResponse* response);
  // Shutdown from `peer`: PERMISSION_DENIED unless an operator; INVALID_ARGUMENT without a
  // reason; UNIMPLEMENTED without a shutdown hook. Logs who asked and why.
  absl::Status HandleShutdown(const PeerIdentity& peer, const ShutdownRequest& request);

 private:
  struct Metrics;
  enum Method { kPull = 0, kPush = 1 };
  // Handle*, with the latency counted from `arrived`.
  absl::Status ServePull(const PullRequest& request, absl::Time deadline, PullResponse* response,
                         absl::Time arrived);
  absl::Status ServePush(const PushRequest& request, PushResponse* response, absl::Time arrived);
  absl::Status PullImpl(const PullRequest& request, absl::Time deadline, PullResponse* response);
  absl::Status PushImpl(const PushRequest& request, PushResponse* response);
  void Record(Method method, absl::Time arrived, const absl::Status& status, size_t bytes_in,
              size_t bytes_out);
  // Counts an answer of one of the other methods.
  void CountCall(const char* method, const absl::Status& status);
  // The peer of `context` may act as worker `worker_id` (see PeerAuthorizer::CheckWorker);
  // a refusal is counted under the reason "identity".
  absl::Status CheckWorker(const grpc::CallbackServerContext& context, int32_t worker_id,
                           const char* method);

  Shard* const shard_;  // Not owned.
  const ServiceOptions options_;
  const ServiceHooks hooks_;
  const PeerAuthorizer auth_;
  std::unique_ptr<common::metrics::Registry> own_registry_;  // when none was given
  std::unique_ptr<Metrics> metrics_;
  common::ThreadPool pool_;
};

}  // namespace ps::server

#endif  // PS_SERVER_RPC_SERVICE_H_
