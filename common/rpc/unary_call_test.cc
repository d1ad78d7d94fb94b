#include "common/rpc/unary_call.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"

namespace ps::common {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// Answers every call, whatever its method, with the bytes or the status it was last given.
class AnsweringService final : public grpc::CallbackGenericService {
 public:
  void Answer(std::string bytes) {
    absl::MutexLock lock(&mu_);
    bytes_ = std::move(bytes);
    status_ = grpc::Status::OK;
  }
  void Fail(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
  }
  std::string last_request() {
    absl::MutexLock lock(&mu_);
    return last_request_;
  }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new Reactor(this);
  }

 private:
  class Reactor final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Reactor(AnsweringService* service) : service_(service) { StartRead(&request_); }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
        return;
      }
      grpc::Status status;
      std::string bytes;
      {
        absl::MutexLock lock(&service_->mu_);
        std::vector<grpc::Slice> slices;
        (void)request_.Dump(&slices);
        service_->last_request_.clear();
        for (const grpc::Slice& s : slices) {
          service_->last_request_.append(reinterpret_cast<const char*>(s.begin()), s.size());
        }
        status = service_->status_;
        bytes = service_->bytes_;
      }
      if (!status.ok()) {
        Finish(status);
        return;
      }
      grpc::Slice slice(bytes);
      answer_ = grpc::ByteBuffer(&slice, 1);
      StartWriteAndFinish(&answer_, grpc::WriteOptions(), grpc::Status::OK);
    }
    void OnDone() override { delete this; }

   private:
    AnsweringService* const service_;
    grpc::ByteBuffer request_;
    grpc::ByteBuffer answer_;
  };

  absl::Mutex mu_;
  std::string bytes_ ABSL_GUARDED_BY(mu_);
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  std::string last_request_ ABSL_GUARDED_BY(mu_);
};

// The answers are ServerInfoResponses: a message with a map field (StatsResponse) cannot be
// reflected on under ThreadSanitizer here (Debian's libprotobuf lays MapFieldBase out without
// the members its headers add under TSan: SpaceUsedLong read a wrong pointer), and
// tools/sanitize.sh runs this test under TSan too.
class UnaryCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ =
        std::make_unique<grpc::GenericStub>(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override { server_->Shutdown(); }

  absl::Status Call(const google::protobuf::Message& request, size_t bound,
                    google::protobuf::Message* response) {
    grpc::ClientContext context;
    return BoundedUnaryCall(*stub_, &context, "/ps.ParameterServer/ServerInfo", request, bound,
                            response);
  }

  AnsweringService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

// An answer within the bound is parsed; the request went as its serialized bytes.
TEST_F(UnaryCallTest, AnAnswerWithinTheBoundIsParsed) {
  ServerInfoResponse sent;
  sent.set_server_index(3);
  sent.set_layout_fingerprint(12345);
  service_.Answer(sent.SerializeAsString());
  HeartbeatRequest request;
  request.set_epoch(7);
  ServerInfoResponse got;
  ASSERT_THAT(Call(request, size_t{1} << 20, &got), IsOk());
  EXPECT_EQ(got.server_index(), 3u);
  EXPECT_EQ(got.layout_fingerprint(), 12345u);
  EXPECT_EQ(service_.last_request(), request.SerializeAsString());
}

// An answer that would take far more parsed than its size (100,000 unknown fields: 300 KB on
// the wire, several MB parsed) is refused unparsed, under a bound 3x its wire size, and the
// response is left empty.
TEST_F(UnaryCallTest, AnAnswerTakingMoreThanTheBoundParsedIsRefused) {
  ServerInfoResponse sent;
  sent.set_server_index(3);
  for (int i = 0; i < 100000; ++i) {
    sent.GetReflection()->MutableUnknownFields(&sent)->AddVarint(999, 1);
  }
  const std::string bytes = sent.SerializeAsString();
  service_.Answer(bytes);
  ServerInfoResponse got;
  got.set_layout_fingerprint(1);
  const absl::Status status = Call(ServerInfoRequest(), 3 * bytes.size(), &got);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInternal, HasSubstr("bytes parsed")));
  EXPECT_THAT(status.message(), HasSubstr("/ps.ParameterServer/ServerInfo"));
  EXPECT_EQ(got.ByteSizeLong(), 0u);
  // The same answer under a bound that fits what it takes parsed is taken.
  ASSERT_THAT(Call(ServerInfoRequest(), 64 * bytes.size(), &got), IsOk());
  EXPECT_EQ(got.server_index(), 3u);
}

// Bytes that are no message are refused as such; a failed call keeps its own status.
TEST_F(UnaryCallTest, GarbageAndFailedCallsAreRefused) {
  service_.Answer(std::string("\xff\xff\xff", 3));
  ServerInfoResponse got;
  const absl::Status garbage = Call(ServerInfoRequest(), size_t{1} << 20, &got);
  EXPECT_THAT(garbage, StatusIs(absl::StatusCode::kInternal,
                                HasSubstr("ServerInfo is not a ps.ServerInfoResponse")));
  EXPECT_THAT(garbage.message(), Not(HasSubstr("bytes parsed")));  // not a size refusal
  service_.Fail(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not you"));
  EXPECT_THAT(Call(ServerInfoRequest(), size_t{1} << 20, &got),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("not you")));
}

}  // namespace
}  // namespace ps::common
