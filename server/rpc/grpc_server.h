// GrpcServer: the gRPC server a ParameterServer serves its service on.
//
// The one place of the server that builds a grpc::Server: listening port and credentials
// (mutual TLS or plaintext, from the job's SecurityConfig), message size limits, the cap on
// calls per connection, keepalive policy and the standard grpc.health.v1 service. The header names no gRPC type, so
// server/parameter_server.cc composes it without including grpcpp.
#ifndef PS_SERVER_RPC_GRPC_SERVER_H_
#define PS_SERVER_RPC_GRPC_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"

namespace grpc {
class Server;
class ServerCompletionQueue;
}  // namespace grpc

namespace ps::server {

class ParameterServerService;

struct GrpcServerOptions {
  // Address to listen on, "host:port"; port 0 picks a free one (see GrpcServer::port()).
  std::string address = "0.0.0.0:0";
  // Largest message received or sent, in bytes (server.max_message_bytes; capped at 2^31-1).
  uint64_t max_message_bytes = 64ull << 20;
  // Threads that serve calls from the server's completion queue (each reads, serves and
  // answers a call itself; see ParameterServerService::ServeQueue), so that calls arriving
  // together are served in parallel (server.data_threads). REQUIRES: > 0.
  int data_threads = 1;
  // Calls one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS,
  // server.max_concurrent_streams). gRPC clients queue calls beyond it on their side; a peer
  // that opens more streams anyway after acknowledging the setting loses its connection. So
  // a connection makes the server hold at most this many requests of up to
  // max_message_bytes each, however many calls it sends. Keep it above the parked pulls a
  // worker may have (ServiceOptions::max_parked_pulls_per_worker, 16), so that a worker's
  // waiting pulls never hold every stream its pushes need. REQUIRES: > 0.
  int max_concurrent_streams = 32;
  // How long a data thread polls the queue before it sleeps (server.busy_poll_us;
  // common/rpc/busy_poll.h). Zero: it sleeps at once. Used only with one data thread: gRPC
  // lets one thread at a time poll the connections, and while another sleeps in the queue
  // as that poller, the wake-ups polling is for are paid anyway.
  absl::Duration busy_poll = absl::ZeroDuration();
  // How long a new connection may take to finish its handshake (server.handshake_timeout_s):
  // after it, a peer that sent nothing (or half a TLS ClientHello) is disconnected.
  absl::Duration handshake_timeout = absl::Seconds(10);
};

// Thread-safe. STARTED by Start(); Shutdown() then Wait() stop it (the destructor does both).
class GrpcServer {
 public:
  // Builds and starts the server with `service` (not owned; must outlive the server).
  // Errors: INVALID_ARGUMENT (credentials: see common/rpc/credentials.h), UNAVAILABLE (the
  // address cannot be bound, naming it).
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                           const SecurityConfig& security,
                                                           ParameterServerService* service);
  ~GrpcServer();

  // The port bound (the one asked for, or the free one picked for port 0).
  int port() const { return port_; }
  // What the health service answers: SERVING or NOT_SERVING.
  void SetServing(bool serving);
  // Refuses new calls and lets calls in flight finish for up to `drain`, then cancels them.
  void Shutdown(absl::Duration drain);
  // Blocks until Shutdown() has completed.
  void Wait();

 private:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port, ParameterServerService* service,
             std::unique_ptr<grpc::ServerCompletionQueue> queue, int data_threads,
             absl::Duration busy_poll);

  // Declared before server_: the server goes first.
  const std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  const std::unique_ptr<grpc::Server> server_;
  const int port_;
  ParameterServerService* const service_;  // Not owned.
  std::vector<std::thread> data_threads_;
  absl::Mutex join_mu_;  // one joiner at a time
};

}  // namespace ps::server

#endif  // PS_SERVER_RPC_GRPC_SERVER_H_
