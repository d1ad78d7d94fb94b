#include "server/rpc/grpc_server.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/rpc/credentials.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/rpc/service.h"

namespace ps::server {

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const GrpcServerOptions& options,
                                                              const SecurityConfig& security,
                                                              ParameterServerService* service) {
  ASSIGN_OR_RETURN(auto credentials, common::MakeServerCredentials(security));
  // The service answers the health check itself (ParameterServerService::health_service).
  grpc::EnableDefaultHealthCheckService(false);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.address, credentials, &port);
  const int max_bytes = static_cast<int>(std::min<uint64_t>(options.max_message_bytes, INT_MAX));
  builder.SetMaxReceiveMessageSize(max_bytes);
  builder.SetMaxSendMessageSize(max_bytes);
  // Workers keep idle channels alive with pings (rpc.keepalive_s); allow them, at most one
  // per kMinKeepaliveS, the least rpc.keepalive_s validation admits.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(common::kMinKeepaliveS * 1000));
  for (const auto& [name, value] : common::DataPathChannelArgs()) {
    builder.AddChannelArgument(name, value);
  }
  if (options.data_threads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_threads is ", options.data_threads, ": expected > 0"));
  }
  if (options.max_concurrent_streams <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_concurrent_streams is ", options.max_concurrent_streams, ": expected > 0"));
  }
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  // gRPC binds with SO_REUSEPORT by default: a second server on a port in use would start, and
  // the kernel would split the connections between the two (a leftover server of an earlier
  // job, or two servers given one port, took part of a job's traffic). Refused instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(
      GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
      static_cast<int>(
          std::clamp<int64_t>(absl::ToInt64Milliseconds(options.handshake_timeout), 1, INT_MAX)));
  service->ServeFromQueue();
  builder.RegisterService(service);
  builder.RegisterAsyncGenericService(service->health_service());
  std::unique_ptr<grpc::ServerCompletionQueue> queue = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    if (server != nullptr) server->Shutdown();
    queue->Shutdown();
    void* tag;
    bool ok;
    while (queue->Next(&tag, &ok)) {
    }
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.address));
  }
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(server), port, service,
                                                    std::move(queue), options.data_threads,
                                                    options.busy_poll));
}

GrpcServer::GrpcServer(std::unique_ptr<grpc::Server> server, int port,
                       ParameterServerService* service,
                       std::unique_ptr<grpc::ServerCompletionQueue> queue, int data_threads,
                       absl::Duration busy_poll)
    : queue_(std::move(queue)), server_(std::move(server)), port_(port), service_(service) {
  if (data_threads > 1) busy_poll = absl::ZeroDuration();  // see GrpcServerOptions
  for (int i = 0; i < data_threads; ++i) {
    data_threads_.emplace_back([this, busy_poll] { service_->ServeQueue(queue_.get(), busy_poll); });
  }
}

GrpcServer::~GrpcServer() {
  Shutdown(absl::ZeroDuration());
  Wait();
}

void GrpcServer::SetServing(bool serving) {
  service_->SetServing(serving);
}

void GrpcServer::Shutdown(absl::Duration drain) {
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMicroseconds(drain));
  // Calls still running on the queue are cancelled by now; they end, then the queue.
  service_->StopQueue(queue_.get());
}

void GrpcServer::Wait() {
  server_->Wait();
  absl::MutexLock lock(&join_mu_);
  for (std::thread& t : data_threads_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace ps::server
