// One unary call through gRPC's generic API, waited for: for tests and test tools that send
// bytes of their own (frames, raw requests) rather than a generated stub's messages.
#ifndef PS_COMMON_RPC_UNARY_CALL_TESTING_H_
#define PS_COMMON_RPC_UNARY_CALL_TESTING_H_

#include <string>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace ps::common {

// Calls `method` with `request` through `stub` and waits for the answer: its status in
// *status and its bytes in *response. False when the call did not complete (its completion
// queue ended without it; *status then says nothing). The completion queue is shut down and
// drained before it goes.
bool BlockingUnaryCall(grpc::GenericStub& stub, grpc::ClientContext* context,
                       const std::string& method, const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* response, grpc::Status* status);

}  // namespace ps::common

#endif  // PS_COMMON_RPC_UNARY_CALL_TESTING_H_
