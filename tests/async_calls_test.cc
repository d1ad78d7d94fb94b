// Asynchronous store calls (GrpcParameterStore::AsyncCalls) through real services on
// in-process gRPC channels (no sockets): one thread keeps 8 calls in flight while every third
// reply is lost after the server answered (the store retries those frames with their
// sequences). Every push is applied exactly once, whatever order the calls in flight reach
// the servers in, and pulls read what a blocking pull reads.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config/config.h"
#include "common/status_matchers.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"
#include "gtest/gtest.h"
#include "server/rpc/service.h"
#include "server/shard.h"
#include "worker/rpc/grpc_async_calls.h"
#include "worker/rpc/grpc_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using AsyncCalls = worker::GrpcParameterStore::AsyncCalls;

// 2 servers; "b": one block of 8 floats (on one server); "m": 9 blocks over both. SGD.
constexpr char kConfig[] = R"pb(
  cluster { num_servers: 2 num_workers: 1 dense_block_floats: 65536 }
  default_optimizer { kind: SGD learning_rate: 0.5 }
  tables { name: "b" kind: TABLE_KIND_DENSE shape: 8 initializer { kind: ZEROS } }
  tables { name: "m" kind: TABLE_KIND_DENSE shape: 525000 initializer { kind: UNIFORM low: -1 high: 1 } }
  security { plaintext: true }
)pb";

// Replaces the status of every third PushPull reply with UNAVAILABLE after the server
// answered: the server applied the push, the client does not know.
class LoseReplies final : public grpc::experimental::Interceptor {
 public:
  LoseReplies(grpc::experimental::ClientRpcInfo* info, std::atomic<int>* replies,
              std::atomic<int>* lost)
      : data_path_(std::string(info->method()) == "/ps.ParameterServer/PushPull"),
        replies_(replies),
        lost_(lost) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (data_path_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_STATUS)) {
      grpc::Status* status = methods->GetRecvStatus();
      if (status->ok() && ++*replies_ % 3 == 0) {
        ++*lost_;
        *status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "reply lost (injected)");
      }
    }
    methods->Proceed();
  }

 private:
  const bool data_path_;
  std::atomic<int>* const replies_;
  std::atomic<int>* const lost_;
};

class LoseRepliesFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new LoseReplies(info, &replies, &lost);
  }
  std::atomic<int> replies{0}, lost{0};
};

// Over plain frames; with shared memory for the payloads, the calls by the socket (lost
// replies give the segment up); and with the calls through the segment's channel too, where
// no gRPC reply is there to lose (the channel's own lost answers: service_test's
// SharedCallsTest).
enum Path { kFrames, kSharedPayloads, kSharedCalls };

class AsyncCallsTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    auto config = common::ParseJobConfigText(kConfig, "test");
    ASSERT_THAT(config.status(), IsOk());
    config_ = *config;
    ASSERT_THAT(common::ExpandModelTables(&config_), IsOk());  // default_optimizer per table
    for (int s = 0; s < 2; ++s) config_.mutable_cluster()->add_servers("in-process");
    std::vector<std::shared_ptr<grpc::Channel>> plain, lossy;
    for (uint32_t s = 0; s < 2; ++s) {
      server::ShardOptions options;
      options.server_index = s;
      auto shard = server::Shard::Create(config_, options);
      ASSERT_THAT(shard.status(), IsOk());
      shards_.push_back(*std::move(shard));
      server::ServiceOptions service_options;
      service_options.auth.check_identities = false;  // plaintext, in-process
      if (GetParam() != kFrames) service_options.max_shared_bytes_per_worker = 16 << 20;
      services_.push_back(std::make_unique<server::ParameterServerService>(
          shards_.back().get(), service_options, server::ServiceHooks{}));
      grpc::ServerBuilder builder;
      builder.RegisterService(services_.back().get());
      servers_.push_back(builder.BuildAndStart());
      ASSERT_NE(servers_.back(), nullptr);
      plain.push_back(servers_.back()->InProcessChannel(grpc::ChannelArguments()));
      auto factory = std::make_unique<LoseRepliesFactory>();
      losers_.push_back(factory.get());  // owned by the channel
      std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> f;
      f.push_back(std::move(factory));
      lossy.push_back(servers_.back()->experimental().InProcessChannelWithInterceptors(
          grpc::ChannelArguments(), std::move(f)));
    }
    worker::GrpcStoreOptions options;
    options.deadline = absl::Seconds(30);
    options.initial_backoff = absl::Milliseconds(1);
    options.max_backoff = absl::Milliseconds(1);
    if (GetParam() != kFrames) options.shared_memory_bytes = 16 << 20;
    options.shared_memory_calls = GetParam() == kSharedCalls;
    auto store = worker::GrpcParameterStore::CreateWithChannels(config_, options, lossy);
    ASSERT_THAT(store.status(), IsOk());
    store_ = *std::move(store);
    // A second worker id's store on plain channels: reads without losing replies.
    options.worker_id = -1;
    auto reader = worker::GrpcParameterStore::CreateWithChannels(config_, options, plain);
    ASSERT_THAT(reader.status(), IsOk());
    reader_ = *std::move(reader);
  }

  void TearDown() override {
    store_.reset();
    reader_.reset();
    for (auto& s : servers_) s->Shutdown();
  }

  StatsResponse Stats(uint32_t s) {
    StatsResponse stats;
    shards_[s]->FillStats(&stats);
    return stats;
  }
  int Lost() const { return losers_[0]->lost.load() + losers_[1]->lost.load(); }

  JobConfig config_;
  std::vector<std::unique_ptr<server::Shard>> shards_;
  std::vector<std::unique_ptr<server::ParameterServerService>> services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<LoseRepliesFactory*> losers_;  // owned by the lossy channels
  std::unique_ptr<worker::GrpcParameterStore> store_;
  std::unique_ptr<worker::GrpcParameterStore> reader_;
};

// Keeps `window` calls of start() in flight from this thread until `total` ended OK.
void RunWindow(AsyncCalls* calls, int window, int total,
               const std::function<absl::StatusOr<AsyncCalls::CallId>(int)>& start) {
  int started = 0, ended = 0;
  while (ended < total) {
    while (started < total && calls->pending() < static_cast<size_t>(window)) {
      absl::StatusOr<AsyncCalls::CallId> id = start(started++);
      ASSERT_THAT(id.status(), IsOk());
    }
    absl::StatusOr<AsyncCalls::Done> done = calls->Next();
    ASSERT_THAT(done.status(), IsOk());
    ASSERT_THAT(done->status, IsOk());
    ++ended;
  }
}

TEST_P(AsyncCallsTest, PushesInFlightAreAppliedOnceWithRepliesLost) {
  const uint32_t owner = store_->partitioner().ServerForBlock(
      *store_->partitioner().FindTable("b"), 0);
  const std::vector<float> grad(8, 1.0f);
  if (GetParam() == kSharedCalls) {
    // The channel comes up once an ask for the segment is answered (a lost reply asks again
    // later); how many calls go by the socket meanwhile depends on the machine's load. Pulls
    // bring it up first, so that the window below starts on it.
    std::vector<float> b(8);
    common::PullBatch pull;
    pull.dense.push_back({"b", absl::MakeSpan(b)});
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (store_->stats().calls_shared == 0 && absl::Now() < give_up) {
      ASSERT_THAT(store_->Pull(pull, common::PullOptions{}), IsOk());
    }
    ASSERT_GT(store_->stats().calls_shared, 0u) << "the channel never came up";
  }
  const int lost_before = Lost();
  std::unique_ptr<AsyncCalls> calls = store_->NewAsyncCalls();
  constexpr int kPushes = 120;
  RunWindow(calls.get(), 8, kPushes, [&](int i) {
    common::PushBatch push;
    push.dense.push_back({"b", grad});
    return calls->StartPush(push, common::PushOptions{i + 1, false});
  });
  EXPECT_EQ(Stats(owner).pushes(), static_cast<uint64_t>(kPushes));
  EXPECT_EQ(Stats(1 - owner).pushes(), 0u);
  if (GetParam() == kSharedCalls) {
    // The pushes went through the channel, where no gRPC reply is lost (a call the channel
    // gave back to the socket may lose one); every one lost was retried.
    EXPECT_LT(Lost() - lost_before, kPushes / 6) << "the calls did not go through the channels";
    EXPECT_EQ(store_->stats().retries, static_cast<uint64_t>(Lost()));
  } else {
    EXPECT_GE(Lost(), kPushes / 3);
    // Each lost reply was retried; a push whose retries' replies were lost too counts as one
    // duplicate, answered by its last attempt.
    EXPECT_EQ(store_->stats().retries, static_cast<uint64_t>(Lost()));
    EXPECT_GE(store_->stats().duplicate_pushes, 1u);
    EXPECT_LE(store_->stats().duplicate_pushes, static_cast<uint64_t>(Lost()));
  }
  // SGD, learning rate 0.5, gradient 1: -0.5 per push applied, exact in float.
  std::vector<float> b(8);
  common::PullBatch pull;
  pull.dense.push_back({"b", absl::MakeSpan(b)});
  ASSERT_THAT(reader_->Pull(pull, common::PullOptions{}), IsOk());
  for (float v : b) EXPECT_EQ(v, -0.5f * kPushes);
  const uint64_t shared_in = services_[owner]->data_path_counters().bytes_shared_in.load();
  if (GetParam() != kFrames) {
    EXPECT_GT(shared_in, 0u);
  } else {
    EXPECT_EQ(shared_in, 0u);
  }
}

TEST_P(AsyncCallsTest, PullsInFlightReadWhatABlockingPullReads) {
  const size_t numel = 525000;
  std::vector<float> expected(numel);
  common::PullBatch reference;
  reference.dense.push_back({"m", absl::MakeSpan(expected)});
  ASSERT_THAT(reader_->Pull(reference, common::PullOptions{}), IsOk());
  constexpr int kWindow = 8;
  std::vector<std::vector<float>> out(kWindow, std::vector<float>(numel, 7.0f));
  std::unique_ptr<AsyncCalls> calls = store_->NewAsyncCalls();
  for (int i = 0; i < kWindow; ++i) {
    common::PullBatch pull;  // gone before the call ends: only its buffers must live
    pull.dense.push_back({"m", absl::MakeSpan(out[i])});
    ASSERT_THAT(calls->StartPull(pull, common::PullOptions{}).status(), IsOk());
  }
  for (int i = 0; i < kWindow; ++i) {
    absl::StatusOr<AsyncCalls::Done> done = calls->Next();
    ASSERT_THAT(done.status(), IsOk());
    ASSERT_THAT(done->status, IsOk());
  }
  EXPECT_GT(Lost(), 0);  // (the first calls, which ask for the segments, go by the socket)
  for (int i = 0; i < kWindow; ++i) EXPECT_TRUE(out[i] == expected) << "pull " << i;
}

TEST_P(AsyncCallsTest, FusedCallsInFlightPushOnceAndPullTheirServersAnswers) {
  const std::vector<float> grad(8, 1.0f);
  constexpr int kCalls = 30;
  std::vector<std::vector<float>> out(kCalls, std::vector<float>(8));
  std::unique_ptr<AsyncCalls> calls = store_->NewAsyncCalls();
  RunWindow(calls.get(), 4, kCalls, [&](int i) {
    common::PushBatch push;
    push.dense.push_back({"b", grad});
    common::PullBatch pull;
    pull.dense.push_back({"b", absl::MakeSpan(out[i])});
    return calls->StartPushPull(push, common::PushOptions{i + 1, false}, pull,
                                common::PullOptions{i});
  });
  std::vector<float> b(8);
  common::PullBatch pull;
  pull.dense.push_back({"b", absl::MakeSpan(b)});
  ASSERT_THAT(reader_->Pull(pull, common::PullOptions{}), IsOk());
  for (float v : b) EXPECT_EQ(v, -0.5f * kCalls);
  // Each fused pull read the table after its own push: between 1 and kCalls pushes applied.
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_LE(out[i][0], -0.5f) << i;
    EXPECT_GE(out[i][0], -0.5f * kCalls) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, AsyncCallsTest,
                         ::testing::Values(kFrames, kSharedPayloads, kSharedCalls),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == kFrames           ? "Frames"
                                              : info.param == kSharedPayloads ? "SharedMemory"
                                                                              : "SharedCalls");
                         });

}  // namespace
}  // namespace ps
