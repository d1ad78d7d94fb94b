// grpc_health_check HOST:PORT [SERVICE]: asks grpc.health.v1.Health/Check, as Kubernetes' grpc
// readiness probe does, and prints the serving status. Exit 0 only for SERVING.
//
// The health protos are not part of Debian's gRPC headers, so the call goes through the generic
// stub with the two tiny messages encoded by hand: HealthCheckRequest { string service = 1; }
// and HealthCheckResponse { ServingStatus status = 1; } (UNKNOWN 0, SERVING 1, NOT_SERVING 2,
// SERVICE_UNKNOWN 3).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/unary_call.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace {

constexpr const char* kStatusNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};

std::string EncodeRequest(const std::string& service) {
  if (service.empty()) return "";  // proto3: the default is not written
  std::string out = "\x0a";        // field 1, length-delimited
  for (size_t n = service.size(); ; n >>= 7) {  // varint length
    out.push_back(static_cast<char>((n & 0x7f) | (n > 0x7f ? 0x80 : 0)));
    if (n <= 0x7f) break;
  }
  return out + service;
}

// The status field of a HealthCheckResponse; anything else in it is an error.
absl::StatusOr<int> DecodeResponse(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (buffer.Valid() && !buffer.Dump(&slices).ok()) return absl::InternalError("unreadable reply");
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes.empty()) return 0;
  if (bytes.size() == 2 && bytes[0] == 0x08 && bytes[1] >= 0 && bytes[1] <= 3) return bytes[1];
  return absl::DataLossError(absl::StrCat("unexpected HealthCheckResponse of ", bytes.size(), " bytes"));
}

absl::StatusOr<int> Check(const std::string& address, const std::string& service) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const std::string request_bytes = EncodeRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  if (!ps::common::BlockingUnaryCall(stub, &context, "/grpc.health.v1.Health/Check", request,
                                     &response, &status)) {
    return absl::InternalError("the call did not complete");
  }
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("Health/Check: code ", status.error_code(), ": ", status.error_message()));
  }
  return DecodeResponse(response);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: grpc_health_check HOST:PORT [SERVICE]\n");
    return 2;
  }
  absl::StatusOr<int> serving = Check(argv[1], argc == 3 ? argv[2] : "");
  if (!serving.ok()) {
    std::fprintf(stderr, "grpc_health_check %s: %s\n", argv[1], serving.status().ToString().c_str());
    return 1;
  }
  std::printf("%s %s\n", argv[1], kStatusNames[*serving]);
  return *serving == 1 ? 0 : 1;
}
