// Helpers shared by the files of ParameterServerService (service.cc, service_control.cc).
// Internal.
#ifndef PS_SERVER_RPC_SERVICE_INTERNAL_H_
#define PS_SERVER_RPC_SERVICE_INTERNAL_H_

#include "absl/status/status.h"
#include "common/rpc/grpc_status.h"
#include "grpcpp/support/server_callback.h"
#include "proto/ps.pb.h"
#include "server/shard.h"

namespace ps::server::service_internal {

// The shard's view of a request's header.
inline RequestInfo InfoOf(const RequestHeader& h) {
  RequestInfo info;
  info.worker_id = h.worker_id();
  info.worker_incarnation = h.worker_incarnation();
  info.sequence = h.sequence();
  info.clock = h.clock();
  info.done_clock = h.done_clock();
  info.layout_fingerprint = h.layout_fingerprint();
  return info;
}

// Finishes `reactor` with `status`.
inline void Finish(grpc::ServerUnaryReactor* reactor, const absl::Status& status) {
  reactor->Finish(common::ToGrpcStatus(status));
}

}  // namespace ps::server::service_internal

#endif  // PS_SERVER_RPC_SERVICE_INTERNAL_H_
