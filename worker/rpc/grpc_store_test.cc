// GrpcParameterStore against a fake ParameterServer on an in-process channel (no sockets).
#include "worker/rpc/grpc_store.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/codec.h"
#include "common/config/config.h"
#include "common/rpc/frame.h"
#include "common/rpc/frame_testing.h"
#include "common/rpc/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "proto/ps.grpc.pb.h"
#include "worker/rpc/push_residuals.h"

namespace ps::worker {
namespace {

// Records every push it receives (the PushPull frames the store sends, as the PushRequest
// each stands for) and answers the first `fail_pushes` with `code` (marked as a busy
// server's refusal when `busy`).
class RecordingServer final
    : public ParameterServer::WithRawCallbackMethod_PushPull<ParameterServer::CallbackService> {
 public:
  RecordingServer(int fail_pushes, grpc::StatusCode code, bool busy)
      : code_(code), busy_(busy), fail_pushes_(fail_pushes) {}

  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::StatusOr<PushRequest> push = common::PushOfFrame(*request);
    EXPECT_TRUE(push.ok()) << push.status();
    absl::MutexLock lock(&mu_);
    pushes_.push_back(push.ok() ? *push : PushRequest());
    if (fail_pushes_ > 0) {
      --fail_pushes_;
      if (busy_) context->AddTrailingMetadata(common::kServerBusyMetadata, "1");
      reactor->Finish(grpc::Status(code_, "dropped for the test"));
    } else {
      *response = common::FrameBuilder(PushPullResponse()).Build();
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

  std::vector<PushRequest> pushes() {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }

 private:
  const grpc::StatusCode code_;
  const bool busy_;
  absl::Mutex mu_;
  int fail_pushes_ ABSL_GUARDED_BY(mu_);
  std::vector<PushRequest> pushes_ ABSL_GUARDED_BY(mu_);
};

class GrpcStoreTest : public ::testing::Test {
 protected:
  void Start(int fail_pushes, grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE,
             bool busy = false, uint32_t max_retries = 20) {
    service_ = std::make_unique<RecordingServer>(fail_pushes, code, busy);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);

    JobConfig config;
    config.mutable_cluster()->set_num_servers(1);
    config.mutable_cluster()->add_servers("in-process");
    config.mutable_cluster()->set_num_workers(1);
    TableConfig* dense = config.add_tables();
    dense->set_name("w");
    dense->add_shape(8);
    dense->set_wire_encoding(ENCODING_BF16);
    TableConfig* sparse = config.add_tables();
    sparse->set_name("emb");
    sparse->set_kind(TABLE_KIND_SPARSE);
    sparse->set_dim(2);
    sparse->set_wire_encoding(ENCODING_BF16);
    ASSERT_TRUE(common::ExpandModelTables(&config).ok());

    GrpcStoreOptions options;
    options.initial_backoff = absl::Milliseconds(1);
    options.max_backoff = absl::Milliseconds(1);
    options.deadline = absl::Seconds(30);
    options.max_retries = max_retries;
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    channels.push_back(server_->InProcessChannel(grpc::ChannelArguments()));
    auto store = GrpcParameterStore::CreateWithChannels(config, options, std::move(channels));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  void TearDown() override {
    store_.reset();
    if (server_ != nullptr) server_->Shutdown();
  }

  absl::Status PushOnce(int64_t clock) {
    common::PushBatch batch;
    batch.dense.push_back({"w", dense_grad_});
    batch.sparse.push_back({"emb", keys_, sparse_grad_});
    return store_->Push(batch, common::PushOptions{clock, false});
  }

  const std::vector<float> dense_grad_ = {1.0013f, 3e-3f, -2.718f, 7.77e-4f,
                                          1.37f,   0.1f,  -5e-5f,  42.42f};
  const std::vector<uint64_t> keys_ = {5, 9};
  const std::vector<float> sparse_grad_ = {1.0013f, -3e-3f, 0.777f, 1e-4f};
  std::unique_ptr<RecordingServer> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<GrpcParameterStore> store_;
};

// A busy server's refusal changed nothing at the server: the store sends the same push (same
// sequence) again, within its retries.
TEST_F(GrpcStoreTest, ABusyServersRefusalIsRetried) {
  Start(/*fail_pushes=*/2, grpc::StatusCode::RESOURCE_EXHAUSTED, /*busy=*/true);
  ASSERT_TRUE(PushOnce(1).ok());
  const std::vector<PushRequest> pushes = service_->pushes();
  ASSERT_EQ(pushes.size(), 3u);
  EXPECT_EQ(pushes[1].SerializeAsString(), pushes[0].SerializeAsString());
  EXPECT_EQ(pushes[2].SerializeAsString(), pushes[0].SerializeAsString());
  EXPECT_EQ(store_->stats().retries, 2u);
}

TEST_F(GrpcStoreTest, BusyRetriesAreBounded) {
  Start(/*fail_pushes=*/100, grpc::StatusCode::RESOURCE_EXHAUSTED, /*busy=*/true,
        /*max_retries=*/3);
  const absl::Status status = PushOnce(1);
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_EQ(service_->pushes().size(), 4u);
}

// Without the busy mark RESOURCE_EXHAUSTED says the request cannot be served (too large,
// too many waiting pulls): returned at once.
TEST_F(GrpcStoreTest, OtherResourceExhaustedIsNotRetried) {
  Start(/*fail_pushes=*/1, grpc::StatusCode::RESOURCE_EXHAUSTED, /*busy=*/false);
  const absl::Status status = PushOnce(1);
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_EQ(service_->pushes().size(), 1u);
  EXPECT_EQ(store_->stats().retries, 0u);
}

TEST_F(GrpcStoreTest, RetriedPushResendsIdenticalBytes) {
  Start(/*fail_pushes=*/1);
  ASSERT_TRUE(PushOnce(1).ok());
  std::vector<PushRequest> pushes = service_->pushes();
  ASSERT_EQ(pushes.size(), 2u);  // the failed attempt and its retry
  EXPECT_EQ(pushes[0].SerializeAsString(), pushes[1].SerializeAsString());
  EXPECT_EQ(store_->stats().retries, 1u);
}

TEST_F(GrpcStoreTest, ResidualIsAddedOncePerPushNotPerAttempt) {
  Start(/*fail_pushes=*/2);
  ASSERT_TRUE(PushOnce(1).ok());  // three attempts
  ASSERT_TRUE(PushOnce(2).ok());  // one attempt
  std::vector<PushRequest> pushes = service_->pushes();
  ASSERT_EQ(pushes.size(), 4u);

  // What two pushes through error feedback must send.
  PushResiduals reference;
  std::string dense[2], sparse[2];
  for (int step = 0; step < 2; ++step) {
    reference.AppendDense("w", 8, 0, dense_grad_, ENCODING_BF16, &dense[step]);
    for (size_t i = 0; i < keys_.size(); ++i) {
      reference.AppendSparseRow("emb", keys_[i],
                                absl::MakeConstSpan(sparse_grad_).subspan(2 * i, 2),
                                ENCODING_BF16, &sparse[step]);
    }
  }
  ASSERT_NE(dense[0], dense[1]);  // the residual changed the second push
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int step = attempt < 3 ? 0 : 1;
    const PushRequest& p = pushes[attempt];
    ASSERT_EQ(p.tables_size(), 2) << attempt;
    EXPECT_EQ(p.tables(0).blocks(0).values(), dense[step]) << attempt;
    EXPECT_EQ(p.tables(1).rows(), sparse[step]) << attempt;
  }
}

TEST_F(GrpcStoreTest, ErrorFeedbackCanBeTurnedOff) {
  Start(/*fail_pushes=*/0);
  store_.reset();
  JobConfig config;
  config.mutable_cluster()->set_num_servers(1);
  config.mutable_cluster()->add_servers("in-process");
  config.mutable_cluster()->set_num_workers(1);
  TableConfig* dense = config.add_tables();
  dense->set_name("w");
  dense->add_shape(8);
  dense->set_wire_encoding(ENCODING_BF16);
  dense->set_wire_error_feedback(false);
  ASSERT_TRUE(common::ExpandModelTables(&config).ok());
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  channels.push_back(server_->InProcessChannel(grpc::ChannelArguments()));
  auto store = GrpcParameterStore::CreateWithChannels(config, GrpcStoreOptions(), std::move(channels));
  ASSERT_TRUE(store.ok()) << store.status();
  common::PushBatch batch;
  batch.dense.push_back({"w", dense_grad_});
  ASSERT_TRUE((*store)->Push(batch, common::PushOptions{1, false}).ok());
  ASSERT_TRUE((*store)->Push(batch, common::PushOptions{2, false}).ok());
  std::vector<PushRequest> pushes = service_->pushes();
  ASSERT_EQ(pushes.size(), 2u);
  std::string nearest;
  common::EncodeFloats(dense_grad_, ENCODING_BF16, &nearest);
  EXPECT_EQ(pushes[0].tables(0).blocks(0).values(), nearest);
  EXPECT_EQ(pushes[1].tables(0).blocks(0).values(), nearest);
}

}  // namespace
}  // namespace ps::worker
