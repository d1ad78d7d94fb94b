#include "python/rpc/admin.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/credentials.h"
#include "common/rpc/unary_call.h"
#include "common/status_macros.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.pb.h"

namespace ps::python {
namespace {

class GrpcAdminClient final : public AdminClient {
 public:
  struct Server {
    std::string address;
    std::unique_ptr<grpc::GenericStub> stub;
  };

  GrpcAdminClient(std::vector<Server> servers, absl::Duration deadline)
      : servers_(std::move(servers)), deadline_(deadline) {}

  absl::StatusOr<std::vector<StatsResponse>> Stats() override {
    return CallAll<StatsRequest, StatsResponse>("Stats");
  }

  absl::StatusOr<std::vector<CheckpointResponse>> Checkpoint() override {
    return CallAll<CheckpointRequest, CheckpointResponse>("Checkpoint");
  }

 private:
  // Calls the servers one after the other: these are rare operator calls, and a checkpoint
  // taken server by server is what ps_server's own timer does too.
  // (Each answer parsed within common::kMaxAdminAnswerBytes.)
  template <typename Request, typename Response>
  absl::StatusOr<std::vector<Response>> CallAll(const std::string& method) {
    std::vector<Response> out(servers_.size());
    for (size_t i = 0; i < servers_.size(); ++i) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
      const absl::Status s = common::BoundedUnaryCall(
          *servers_[i].stub, &context, absl::StrCat("/ps.ParameterServer/", method), Request(),
          common::kMaxAdminAnswerBytes, &out[i]);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("server ", i, " (", servers_[i].address,
                                                   "): ", s.message()));
      }
    }
    return out;
  }

  std::vector<Server> servers_;
  const absl::Duration deadline_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<AdminClient>> AdminClient::Create(const JobConfig& config,
                                                                 absl::Duration deadline) {
  std::vector<GrpcAdminClient::Server> servers;
  for (const std::string& address : config.cluster().servers()) {
    ASSIGN_OR_RETURN(auto channel, common::MakeChannel(address, config));
    servers.push_back({address, std::make_unique<grpc::GenericStub>(channel)});
  }
  return std::unique_ptr<AdminClient>(new GrpcAdminClient(std::move(servers), deadline));
}

}  // namespace ps::python
