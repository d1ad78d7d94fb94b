// The one bridge between gRPC and Abseil statuses. Codes map one to one (both follow
// google.rpc.Code); messages coming in are kept, made safe to print (PeerMessage).
//
// Lives under common/rpc/ because only */rpc/ folders may include grpcpp.
#ifndef PS_COMMON_RPC_GRPC_STATUS_H_
#define PS_COMMON_RPC_GRPC_STATUS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace ps::common {

// Trailing metadata a server sets on a RESOURCE_EXHAUSTED answer that refused a call only
// because the server held too many requests already (reason "server_busy"): the request was
// fine and changed nothing, so a client may send it again after a backoff. Any other
// RESOURCE_EXHAUSTED (a message over the size limit, too many waiting pulls) comes without
// it and is final.
inline constexpr char kServerBusyMetadata[] = "ps-server-busy";

// A status message from a peer, made safe to log and to hand to Python: at most
// kMaxPeerMessageBytes of it (cut at a character, the full length said), every byte that is
// not valid UTF-8 replaced by '?', and control characters (newlines too) by spaces. A peer's
// message is any bytes it likes (up to 64 KiB through a shared-memory channel): unchecked,
// it was logged whole on every retry, and invalid UTF-8 turned the Python client's ps.errors
// exception into a UnicodeDecodeError (found in review, 2026-12-06).
inline constexpr size_t kMaxPeerMessageBytes = 1024;
std::string PeerMessage(absl::string_view message);

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      PeerMessage(status.error_message()));
}

}  // namespace ps::common

#endif  // PS_COMMON_RPC_GRPC_STATUS_H_
