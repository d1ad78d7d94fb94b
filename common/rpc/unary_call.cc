#include "common/rpc/unary_call.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/parse_bound.h"
#include "grpcpp/impl/codegen/proto_utils.h"

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

absl::Status BoundedUnaryCall(grpc::GenericStub& stub, grpc::ClientContext* context,
                              const std::string& method, const google::protobuf::Message& request,
                              size_t max_parsed_bytes, google::protobuf::Message* response) {
  response->Clear();
  grpc::ByteBuffer bytes;
  bool own = false;
  if (grpc::Status made =
          grpc::SerializationTraits<google::protobuf::Message>::Serialize(request, &bytes, &own);
      !made.ok()) {
    return FromGrpcStatus(made);
  }
  grpc::ByteBuffer answer;
  grpc::Status status;
  if (!BlockingUnaryCall(stub, context, method, bytes, &answer, &status)) {
    return absl::UnavailableError(absl::StrCat(method, ": the call did not complete"));
  }
  if (!status.ok()) return FromGrpcStatus(status);
  if (absl::Status read = ParseWithin(&answer, max_parsed_bytes, response); !read.ok()) {
    // INTERNAL either way (the peer's answer, not this caller's request, is at fault), saying
    // which: over the bound, or not the message.
    return absl::InternalError(
        absl::IsResourceExhausted(read)
            ? absl::StrCat("the answer to ", method, " was refused (at most ", max_parsed_bytes,
                           " bytes parsed): ", read.message())
            : absl::StrCat("the answer to ", method, " is not a ",
                           response->GetDescriptor()->full_name(), ": ", read.message()));
  }
  return absl::OkStatus();
}

}  // namespace ps::common
