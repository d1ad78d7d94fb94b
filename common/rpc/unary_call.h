// One unary call through gRPC's generic API, waited for: for tools and control calls that send
// bytes of their own (frames, raw requests), or that parse a peer's answer themselves within
// a bound (common/rpc/parse_bound.h) instead of letting gRPC parse whatever fits the channel's
// receive limit.
#ifndef PS_COMMON_RPC_UNARY_CALL_H_
#define PS_COMMON_RPC_UNARY_CALL_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace ps::common {

// The most a server's answer to an operator's call (Stats, Checkpoint, Shutdown) may take
// parsed (psctl, the Python client's admin calls). A Stats answer names each table and
// worker, far less than this; an answer of many small unknown fields would take tens of times
// its size parsed, up to the channel's receive limit.
inline constexpr size_t kMaxAdminAnswerBytes = size_t{64} << 20;

// Calls `method` with `request` through `stub` and waits for the answer: its status in
// *status and its bytes in *response. False when the call did not complete (its completion
// queue ended without it; *status then says nothing). The completion queue is shut down and
// drained before it goes.
bool BlockingUnaryCall(grpc::GenericStub& stub, grpc::ClientContext* context,
                       const std::string& method, const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* response, grpc::Status* status);

// Calls `method` (e.g. "/ps.ParameterServer/Stats") with `request` and parses the answer into
// `response` if that takes at most `max_parsed_bytes` (common::ParseWithin). The call's own
// status when it fails; INTERNAL naming the method and the bound when the peer's answer is not
// a `response` or would take more than the bound parsed (`response` is then left empty).
absl::Status BoundedUnaryCall(grpc::GenericStub& stub, grpc::ClientContext* context,
                              const std::string& method, const google::protobuf::Message& request,
                              size_t max_parsed_bytes, google::protobuf::Message* response);

}  // namespace ps::common

#endif  // PS_COMMON_RPC_UNARY_CALL_H_
