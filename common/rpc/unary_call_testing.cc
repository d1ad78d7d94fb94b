#include "common/rpc/unary_call_testing.h"

namespace ps::common {

bool BlockingUnaryCall(grpc::GenericStub& stub, grpc::ClientContext* context,
                       const std::string& method, const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* response, grpc::Status* status) {
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(context, method, request, &cq);
  call->StartCall();
  call->Finish(response, status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  const bool completed = cq.Next(&tag, &ok) && ok;
  cq.Shutdown();  // a completion queue must be shut down and drained before it is destroyed
  while (cq.Next(&tag, &ok)) {
  }
  return completed;
}

}  // namespace ps::common
