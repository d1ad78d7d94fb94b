// The one bridge between gRPC and Abseil statuses. Codes map one to one (both follow
// google.rpc.Code); messages are kept.
//
// Lives under common/rpc/ because only */rpc/ folders may include grpcpp.
#ifndef PS_COMMON_RPC_GRPC_STATUS_H_
#define PS_COMMON_RPC_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace ps::common {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace ps::common

#endif  // PS_COMMON_RPC_GRPC_STATUS_H_
