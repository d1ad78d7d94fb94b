// GrpcServer serves every method from its completion queue, the health check included (gRPC's
// default health service is off there): grpc.health.v1.Health/Check answers SERVING or
// NOT_SERVING as SetServing says, NOT_FOUND for a named service, and other unregistered
// methods get UNIMPLEMENTED; the service's control methods answer as on the callback API;
// with several data threads, one serves while another is busy.
#include "server/rpc/grpc_server.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/rpc/unary_call.h"
#include "common/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/rpc/service.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::testing::HasSubstr;

// The config of these tests' one table, for `workers` workers.
JobConfig TestConfig(int workers) {
  auto config = common::ParseJobConfigText(absl::StrCat(R"pb(
    security { plaintext: true }
    tables { name: "w" kind: TABLE_KIND_DENSE shape: 4 optimizer { kind: SGD learning_rate: 1 } }
    cluster { num_servers: 1 num_workers: )pb", workers, " }"), "test");
  CHECK(config.ok()) << config.status();
  return *config;
}

std::unique_ptr<Shard> TestShard(const JobConfig& config) {
  auto shard = Shard::Create(config, ShardOptions{});
  CHECK(shard.ok()) << shard.status();
  return *std::move(shard);
}

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const JobConfig config = TestConfig(1);
    shard_ = TestShard(config);
    ServiceOptions options;
    options.auth.check_identities = false;
    service_ = std::make_unique<ParameterServerService>(shard_.get(), options, ServiceHooks{});
    GrpcServerOptions server_options;
    server_options.address = "127.0.0.1:0";
    auto server = GrpcServer::Start(server_options, config.security(), service_.get());
    ASSERT_THAT(server.status(), IsOk());
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
  }

  void TearDown() override {
    server_.reset();
    service_.reset();
  }

  // A unary call of `method` with `request` bytes; the answer's bytes go to `answer`.
  grpc::Status Call(const std::string& method, const std::string& request, std::string* answer) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    grpc::Slice slice(request);
    grpc::ByteBuffer request_buffer(&slice, 1);
    grpc::ByteBuffer response;
    grpc::Status status;
    EXPECT_TRUE(
        common::BlockingUnaryCall(stub, &context, method, request_buffer, &response, &status));
    std::vector<grpc::Slice> slices;
    answer->clear();
    if (status.ok() && response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        answer->append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    return status;
  }

  static constexpr const char* kCheck = "/grpc.health.v1.Health/Check";
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(GrpcServerTest, HealthCheckFollowsSetServing) {
  std::string answer;
  // HealthCheckResponse { status: SERVING (1) } and { status: NOT_SERVING (2) }.
  ASSERT_TRUE(Call(kCheck, "", &answer).ok());
  EXPECT_EQ(answer, std::string("\x08\x01", 2));
  server_->SetServing(false);
  ASSERT_TRUE(Call(kCheck, "", &answer).ok());
  EXPECT_EQ(answer, std::string("\x08\x02", 2));
  server_->SetServing(true);
  ASSERT_TRUE(Call(kCheck, "", &answer).ok());
  EXPECT_EQ(answer, std::string("\x08\x01", 2));
}

TEST_F(GrpcServerTest, HealthCheckOfANamedServiceIsNotFound) {
  std::string answer;
  EXPECT_EQ(Call(kCheck, std::string("\x0a\x05other", 7), &answer).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // Not a HealthCheckRequest at all.
  EXPECT_EQ(Call(kCheck, "\xff\xff", &answer).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(GrpcServerTest, UnknownMethodsAreUnimplemented) {
  std::string answer;
  EXPECT_EQ(Call("/grpc.health.v1.Health/Watch", "", &answer).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(Call("/ps.ParameterServer/NoSuchMethod", "", &answer).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(GrpcServerTest, ControlMethodsAreServedFromTheQueue) {
  auto stub = ParameterServer::NewStub(channel_);
  {
    grpc::ClientContext context;
    ServerInfoResponse info;
    ASSERT_TRUE(stub->ServerInfo(&context, ServerInfoRequest(), &info).ok());
    EXPECT_EQ(info.layout_fingerprint(), shard_->partitioner().layout_fingerprint());
  }
  {
    grpc::ClientContext context;
    ShutdownRequest request;
    request.set_reason("test");
    ShutdownResponse response;
    // No shutdown hook: refused as on the callback API.
    EXPECT_EQ(stub->Shutdown(&context, request, &response).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  {
    grpc::ClientContext context;
    CheckpointResponse response;
    // No data dir to checkpoint to.
    EXPECT_EQ(stub->Checkpoint(&context, CheckpointRequest(), &response).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
}

// With two data threads, a call is served while the other thread is held inside a call.
// A second server on a port in use is refused (gRPC's SO_REUSEPORT default let it start, and
// the kernel split the connections between the two before 2026-12-05).
TEST_F(GrpcServerTest, APortInUseIsRefused) {
  const JobConfig config = TestConfig(1);
  std::unique_ptr<Shard> shard = TestShard(config);
  ServiceOptions options;
  options.auth.check_identities = false;
  ParameterServerService service(shard.get(), options, ServiceHooks{});
  GrpcServerOptions server_options;
  server_options.address = absl::StrCat("127.0.0.1:", server_->port());
  EXPECT_THAT(GrpcServer::Start(server_options, config.security(), &service).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot listen")));
}

TEST(GrpcServerThreadsTest, ASecondDataThreadServesWhileTheFirstIsBusy) {
  const JobConfig config = TestConfig(2);
  std::unique_ptr<Shard> shard = TestShard(config);
  absl::Notification entered, release;
  ServiceHooks hooks;
  // Stats is served on the data thread that took it: this one holds its thread.
  hooks.stats = [&](StatsResponse*) {
    entered.Notify();
    release.WaitForNotification();
  };
  ServiceOptions options;
  options.auth.check_identities = false;
  ParameterServerService service(shard.get(), options, std::move(hooks));
  GrpcServerOptions server_options;
  server_options.address = "127.0.0.1:0";
  server_options.data_threads = 2;
  server_options.busy_poll = absl::Milliseconds(1);  // not used with two threads
  auto server = GrpcServer::Start(server_options, config.security(), &service);
  ASSERT_THAT(server.status(), IsOk());
  auto stub = ParameterServer::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*server)->port()), grpc::InsecureChannelCredentials()));

  std::thread held([&] {
    grpc::ClientContext context;
    StatsResponse stats;
    EXPECT_TRUE(stub->Stats(&context, StatsRequest(), &stats).ok());
  });
  entered.WaitForNotification();
  // With one data thread this call would wait for the release and miss its deadline.
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  ServerInfoResponse info;
  const grpc::Status status = stub->ServerInfo(&context, ServerInfoRequest(), &info);
  release.Notify();
  held.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(info.layout_fingerprint(), shard->partitioner().layout_fingerprint());
}

}  // namespace
}  // namespace ps::server
