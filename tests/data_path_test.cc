// The data path end to end on in-process gRPC channels (and, for the zero-copy check, over
// TCP on 127.0.0.1): two real services, a GrpcParameterStore sending PushPull frames. Checks
// what unit tests cannot see through gRPC's slicing of messages: dense pushed bytes are never
// copied on the server and no call allocates a new payload buffer in steady state; pushes go
// only to the servers that hold their data; a fused PushPull reads what Push then Pull read,
// bitwise equal to the in-process store.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/metrics/metrics.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/in_process_store.h"
#include "server/rpc/service.h"
#include "server/shard.h"
#include "worker/rpc/grpc_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::testing::HasSubstr;

// 2 servers; "w": 2 blocks of 64k floats (256 KB each), "b": one block of 8 floats (on one
// server), "m": 9 blocks (the last one short), 4 or 5 on each server. SGD.
constexpr char kConfig[] = R"pb(
  cluster { num_servers: 2 num_workers: 1 dense_block_floats: 65536 }
  default_optimizer { kind: SGD learning_rate: 0.5 }
  tables { name: "w" kind: TABLE_KIND_DENSE shape: 131072 initializer { kind: UNIFORM low: -1 high: 1 } }
  tables { name: "b" kind: TABLE_KIND_DENSE shape: 8 initializer { kind: ZEROS } }
  tables { name: "m" kind: TABLE_KIND_DENSE shape: 525000 initializer { kind: UNIFORM low: -1 high: 1 } }
  security { plaintext: true }
)pb";

class DataPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = common::ParseJobConfigText(config_text_, "test");
    ASSERT_THAT(config.status(), IsOk());
    config_ = *config;
    if (adam_) {
      config_.mutable_default_optimizer()->set_kind(OptimizerConfig::ADAM);
      config_.mutable_default_optimizer()->set_learning_rate(0.01f);
    }
    const uint32_t servers = config_.cluster().num_servers();
    for (uint32_t s = 0; s < servers; ++s) config_.mutable_cluster()->add_servers("in-process");
    for (uint32_t s = 0; s < servers; ++s) {
      server::ShardOptions options;
      options.server_index = s;
      options.stream_pull_bytes = stream_pull_bytes_;
      if (segments_room_ >= 0) {
        // A budget of the tables and that many segments.
        auto probe = server::Shard::Create(config_, options);
        ASSERT_THAT(probe.status(), IsOk());
        options.max_memory_bytes =
            (*probe)->memory().used() + static_cast<uint64_t>(segments_room_) * shared_bytes_;
      }
      auto shard = server::Shard::Create(config_, options);
      ASSERT_THAT(shard.status(), IsOk());
      shards_.push_back(*std::move(shard));
      server::ServiceOptions service_options;
      service_options.auth.check_identities = false;  // plaintext, in-process
      service_options.max_shared_bytes_per_worker = shared_bytes_;
      services_.push_back(std::make_unique<server::ParameterServerService>(
          shards_.back().get(), service_options, server::ServiceHooks{}));
      grpc::ServerBuilder builder;
      builder.RegisterService(services_.back().get());
      builder.SetMaxReceiveMessageSize(64 << 20);
      int port = 0;
      if (tcp_) builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      servers_.push_back(builder.BuildAndStart());
      ASSERT_NE(servers_.back(), nullptr);
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(64 << 20);
      if (tcp_) {
        ASSERT_NE(port, 0);
        channels_.push_back(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                                      grpc::InsecureChannelCredentials(), args));
      } else {
        channels_.push_back(servers_.back()->InProcessChannel(args));
      }
    }
    auto store = worker::GrpcParameterStore::CreateWithChannels(config_, Options(), channels_);
    ASSERT_THAT(store.status(), IsOk());
    store_ = *std::move(store);
  }

  worker::GrpcStoreOptions Options() const {
    worker::GrpcStoreOptions options;
    options.deadline = absl::Seconds(30);
    options.shared_memory_bytes = shared_bytes_;
    return options;
  }

  uint64_t Sum(std::atomic<uint64_t> common::DataPathCounters::*field) const {
    uint64_t n = 0;
    for (auto& s : services_) n += (s->data_path_counters().*field).load();
    return n;
  }

  void TearDown() override {
    store_.reset();
    for (auto& s : servers_) s->Shutdown();
  }

  // An in-process store over shards of its own (kept in `owned`), the same config.
  absl::StatusOr<std::unique_ptr<server::InProcessParameterStore>> LocalStore(
      std::vector<std::unique_ptr<server::Shard>>* owned) {
    std::vector<server::Shard*> shards;
    for (uint32_t s = 0; s < config_.cluster().num_servers(); ++s) {
      server::ShardOptions options;
      options.server_index = s;
      ASSIGN_OR_RETURN(std::unique_ptr<server::Shard> shard,
                       server::Shard::Create(config_, options));
      owned->push_back(std::move(shard));
      shards.push_back(owned->back().get());
    }
    return server::InProcessParameterStore::Create(shards, {});
  }

  uint64_t Pushes(uint32_t s) {
    StatsResponse stats;
    shards_[s]->FillStats(&stats);
    return stats.pushes();
  }
  uint64_t Pulls(uint32_t s) {
    StatsResponse stats;
    shards_[s]->FillStats(&stats);
    return stats.pulls();
  }

  // PushPull steps of "m" (`n` values) from `store`, checked bitwise against `local` after each
  // step.
  void Steps(worker::GrpcParameterStore* store, server::InProcessParameterStore* local, int first,
             int last, size_t n = 525000) {
    std::vector<float> grad(n), got(n), want(n);
    for (int step = first; step <= last; ++step) {
      for (size_t i = 0; i < grad.size(); ++i) {
        grad[i] = 1e-3f * static_cast<float>((i * 7 + step) % 101) - 0.05f;
      }
      common::PushBatch push;
      push.dense.push_back({"m", grad});
      common::PullBatch pull_got, pull_want;
      pull_got.dense.push_back({"m", absl::MakeSpan(got)});
      pull_want.dense.push_back({"m", absl::MakeSpan(want)});
      ASSERT_THAT(store->PushPull(push, {step, false}, pull_got, {step}), IsOk());
      ASSERT_THAT(local->Push(push, {step, false}), IsOk());
      ASSERT_THAT(local->Pull(pull_want, {step}), IsOk());
      ASSERT_EQ(got, want) << "step " << step;
    }
  }

  const char* config_text_ = kConfig;
  // Real sockets on 127.0.0.1 instead of in-process channels; always under ThreadSanitizer,
  // which sees no ordering where an in-process channel hands the server's answer buffers to
  // the client (inside the uninstrumented libgrpc) and reports the client reading them.
#if defined(__SANITIZE_THREAD__)
  bool tcp_ = true;
#else
  bool tcp_ = false;
#endif
  bool adam_ = false;  // Adam (lr 0.01) instead of the config's SGD
  size_t shared_bytes_ = 0;  // shared memory per worker and server (0: none)
  uint64_t stream_pull_bytes_ = UINT64_MAX;  // the shards' ShardOptions::stream_pull_bytes
  int segments_room_ = -1;  // >= 0: each server's budget holds its tables and this many segments
  JobConfig config_;
  std::vector<std::unique_ptr<server::Shard>> shards_;
  std::vector<std::unique_ptr<server::ParameterServerService>> services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::unique_ptr<worker::GrpcParameterStore> store_;
};

TEST_F(DataPathTest, PushBytesAreCopiedAtMostOnceAndBuffersAreReused) {
  std::vector<float> grad(131072, 1e-3f);
  common::PushBatch push;
  push.dense.push_back({"w", grad});
  ASSERT_THAT(store_->Push(push, {1, false}), IsOk());  // first touches: pool buffers
  auto sum = [&](auto field) {
    uint64_t n = 0;
    for (auto& s : services_) n += (s->data_path_counters().*field).load();
    return n;
  };
  const uint64_t allocated = sum(&common::DataPathCounters::buffers_allocated);
  const uint64_t gathered = sum(&common::DataPathCounters::bytes_gathered);
  const uint64_t in_place = sum(&common::DataPathCounters::bytes_in_place);
  constexpr int kPushes = 10;
  for (int i = 0; i < kPushes; ++i) ASSERT_THAT(store_->Push(push, {2 + i, false}), IsOk());
  const uint64_t payload = kPushes * grad.size() * sizeof(float);
  // Every payload byte was taken once: in place or gathered (one copy), never both.
  EXPECT_EQ(sum(&common::DataPathCounters::bytes_gathered) - gathered +
                sum(&common::DataPathCounters::bytes_in_place) - in_place,
            payload);
  EXPECT_EQ(sum(&common::DataPathCounters::buffers_allocated), allocated)
      << "a push allocated a new payload buffer";
}

// The same services over TCP: gRPC reads the socket into slices of up to 64 KB, so a 256 KB
// block arrives in several pieces, cut anywhere, even inside a value, and at any alignment.
class DataPathOverTcpTest : public DataPathTest {
 protected:
  DataPathOverTcpTest() {
    tcp_ = true;
    adam_ = true;
  }
};

// Dense push payloads are checked and applied where gRPC received them: not one byte is
// copied in user space on the server, and the parameters are bit for bit those the in-process
// store computes from the same gradients (Adam, which reads every piece against its slots).
TEST_F(DataPathOverTcpTest, DensePushPayloadsAreNeverCopiedAndApplyLikeTheInProcessStore) {
  ASSERT_EQ(config_.default_optimizer().kind(), OptimizerConfig::ADAM);
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  const uint64_t gathered = Sum(&common::DataPathCounters::bytes_gathered);
  const uint64_t in_place = Sum(&common::DataPathCounters::bytes_in_place);
  constexpr int kSteps = 5;
  Steps(store_.get(), local->get(), 1, kSteps);
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_gathered), gathered);
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_in_place) - in_place,
            kSteps * 525000 * sizeof(float));
}

// The same services with shared memory: the store asks each server for a segment with its
// first call, then puts push payloads there and finds pull answers there.
class DataPathOverSharedMemoryTest : public DataPathTest {
 protected:
  DataPathOverSharedMemoryTest() {
    tcp_ = true;
    adam_ = true;
    shared_bytes_ = 16 << 20;
  }
};

TEST_F(DataPathOverSharedMemoryTest, PayloadsCrossTheSegmentAndApplyLikeTheInProcessStore) {
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  Steps(store_.get(), local->get(), 1, 1);  // asks for the segments (payloads by the socket)
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_shared_in), 0u);
  constexpr int kSteps = 4;
  Steps(store_.get(), local->get(), 2, 1 + kSteps);
  const uint64_t payload = kSteps * 525000 * sizeof(float);
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_shared_in), payload);
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_shared_out), payload);
}

// rpc.shared_memory_calls=false: the payloads cross the segment, the calls go by the socket.
TEST_F(DataPathOverSharedMemoryTest, WithoutTheChannelPayloadsStillCrossTheSegment) {
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  worker::GrpcStoreOptions options = Options();
  options.shared_memory_calls = false;
  auto store = worker::GrpcParameterStore::CreateWithChannels(config_, options, channels_);
  ASSERT_THAT(store.status(), IsOk());
  Steps(store->get(), local->get(), 1, 3);
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_shared_in), 2 * 525000 * sizeof(float));
  EXPECT_EQ(Sum(&common::DataPathCounters::calls_shared), 0u);
  EXPECT_EQ((*store)->stats().calls_shared, 0u);
}

// A segment the server no longer has (another store of the same worker asked for a new one, as
// a restarted server has none): the call is refused with nothing changed and goes by the
// socket, once; the store then asks again. Every push is applied exactly once.
TEST_F(DataPathOverSharedMemoryTest, AForgottenSegmentSendsTheCallBySocketAndAppliesItOnce) {
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  Steps(store_.get(), local->get(), 1, 3);
  const uint64_t shared_in = Sum(&common::DataPathCounters::bytes_shared_in);
  ASSERT_GT(shared_in, 0u);
  const uint64_t channel_calls = Sum(&common::DataPathCounters::calls_shared);
  ASSERT_GT(channel_calls, 0u);
  EXPECT_EQ(store_->stats().calls_shared, channel_calls);
  auto other = worker::GrpcParameterStore::CreateWithChannels(config_, Options(), channels_);
  ASSERT_THAT(other.status(), IsOk());
  std::vector<float> out(525000);
  common::PullBatch pull;
  pull.dense.push_back({"m", absl::MakeSpan(out)});  // on both servers
  ASSERT_THAT((*other)->Pull(pull, {0}), IsOk());    // its asks replace store_'s segments
  uint64_t pushes = Pushes(0) + Pushes(1);
  // The servers closed store_'s channels with its segments: its calls posted there end at
  // once, unserved (ABORTED), and go again by the socket.
  const absl::Time start = absl::Now();
  Steps(store_.get(), local->get(), 4, 4);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "waited for the deadline";
  EXPECT_EQ(Pushes(0) + Pushes(1) - pushes, 2u) << "a push applied twice or not at all";
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_shared_in), shared_in);
  EXPECT_EQ(Sum(&common::DataPathCounters::calls_shared), channel_calls);
  Steps(store_.get(), local->get(), 5, 6);  // asks again, then through the new segment
  EXPECT_GT(Sum(&common::DataPathCounters::bytes_shared_in), shared_in);
}

// A server whose budget has no room for a worker's segment answers its ask without one; the
// worker asks again later (GrpcStoreOptions::shared_memory_reask), and once another worker's
// segment is let go its calls go through a segment of their own.
class DeclinedSegmentTest : public DataPathOverSharedMemoryTest {
 protected:
  DeclinedSegmentTest() {
    config_text_ = kTwoWorkersConfig;
    segments_room_ = 1;
  }
  static constexpr char kTwoWorkersConfig[] = R"pb(
    cluster { num_servers: 2 num_workers: 2 dense_block_floats: 65536 }
    default_optimizer { kind: SGD learning_rate: 0.5 }
    tables {
      name: "m"
      kind: TABLE_KIND_DENSE
      shape: 525000
      initializer { kind: ZEROS }
    }
    security { plaintext: true }
  )pb";
};

TEST_F(DeclinedSegmentTest, AWorkerDeclinedASegmentAsksAgainLater) {
  std::vector<float> out(525000);
  common::PullBatch pull;
  pull.dense.push_back({"m", absl::MakeSpan(out)});  // on both servers
  ASSERT_THAT(store_->Pull(pull, {0}), IsOk());      // worker 0 asks: the servers' one segment
  ASSERT_THAT(store_->Pull(pull, {0}), IsOk());
  ASSERT_GT(store_->stats().calls_shared, 0u);
  worker::GrpcStoreOptions options = Options();
  options.worker_id = 1;
  options.shared_memory_reask = absl::Milliseconds(20);
  auto other = worker::GrpcParameterStore::CreateWithChannels(config_, options, channels_);
  ASSERT_THAT(other.status(), IsOk());
  for (int i = 0; i < 3; ++i) ASSERT_THAT((*other)->Pull(pull, {0}), IsOk());  // declined
  EXPECT_EQ((*other)->stats().calls_shared, 0u);
  EXPECT_EQ((*other)->stats().bytes_shared, 0u);
  ASSERT_THAT(store_->Finish(), IsOk());  // worker 0's segments go
  // Asked again (at least 20 ms after the last decline, then 40 ms, ...) until granted.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while ((*other)->stats().calls_shared == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_THAT((*other)->Pull(pull, {0}), IsOk());
  }
  EXPECT_GT((*other)->stats().calls_shared, 0u);
  EXPECT_GT((*other)->stats().bytes_shared, 0u);
}

// Calls through the segments hand their bytes with streamed stores and with plain ones, each
// link trying both first (common/rpc/handoff_chooser.h), and land alike.
TEST_F(DataPathOverSharedMemoryTest, CallsHandTheirBytesBothWaysAndLandAlike) {
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  Steps(store_.get(), local->get(), 1, 6);
  const worker::GrpcStoreStats stats = store_->stats();
  ASSERT_GT(stats.calls_shared, 0u);
  EXPECT_GE(stats.handoffs_streamed, 2u);  // each server's link: the first call
  EXPECT_GE(stats.handoffs_plain, 2u);     // and the second
  EXPECT_EQ(stats.handoffs_streamed + stats.handoffs_plain, stats.calls_shared);
  // Weighed by the CPU both sides spent on them, which the servers said: every call until
  // its link's window is full, one in weigh_every after (HandoffChooser::Options).
  EXPECT_GT(stats.handoffs_served_cpu, 0u);
  EXPECT_LE(stats.handoffs_served_cpu, stats.calls_shared);
}

// rpc.handoff PLAIN or STREAMED: every call through the segments hands its bytes that way,
// and they land as the in-process store's.
class HandoffTest : public DataPathOverSharedMemoryTest,
                    public ::testing::WithParamInterface<RpcConfig::Handoff> {};

TEST_P(HandoffTest, EveryCallHandsItsBytesTheWayConfigured) {
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  worker::GrpcStoreOptions options = Options();
  options.handoff = GetParam();
  common::metrics::Registry registry;
  auto store =
      worker::GrpcParameterStore::CreateWithChannels(config_, options, channels_, &registry);
  ASSERT_THAT(store.status(), IsOk());
  Steps(store->get(), local->get(), 1, 6);
  const worker::GrpcStoreStats stats = (*store)->stats();
  ASSERT_GT(stats.calls_shared, 0u);
  const bool streamed = GetParam() == RpcConfig::HANDOFF_STREAMED;
  EXPECT_EQ(streamed ? stats.handoffs_streamed : stats.handoffs_plain, stats.calls_shared);
  EXPECT_EQ(streamed ? stats.handoffs_plain : stats.handoffs_streamed, 0u);
  EXPECT_EQ(stats.handoffs_served_cpu, 0u);  // nothing to weigh: not asked
  // The same counts in the worker's metrics.
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr(absl::StrCat("ps_worker_handoffs_total{way=\"",
                                           streamed ? "streamed" : "plain", "\"} ",
                                           stats.calls_shared, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("ps_worker_handoffs_total{way=\"",
                                           streamed ? "plain" : "streamed", "\"} 0\n")));
}

INSTANTIATE_TEST_SUITE_P(PlainAndStreamed, HandoffTest,
                         ::testing::Values(RpcConfig::HANDOFF_PLAIN, RpcConfig::HANDOFF_STREAMED));

// A push copied into the segment by two threads (chunks claimed as they go) lands as the
// one-thread copy does: bitwise the in-process store's parameters.
TEST_F(DataPathOverSharedMemoryTest, PushesCopiedInByTwoThreadsApplyLikeTheInProcessStore) {
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  worker::GrpcStoreOptions options = Options();
  options.parallel_copy_in_bytes = 1;
  auto store = worker::GrpcParameterStore::CreateWithChannels(config_, options, channels_);
  ASSERT_THAT(store.status(), IsOk());
  Steps(store->get(), local->get(), 1, 4);
  EXPECT_GT(Sum(&common::DataPathCounters::bytes_shared_in), 0u);
}

// rpc.overlap_push_copy: a push through a channel is posted before its payload is copied, and
// each server checks the bytes as they come (common/rpc/following_payload.h). Each server's
// part of "m" (about 1 MB) follows its first call through the channel; these servers' channel
// threads never poll (ServiceOptions::channel_busy_poll 0), so their answers say the next
// payload must come whole (PushPullResponse.push_may_follow), and the later ones do. The
// parameters land bitwise as the in-process store's either way, and with the option off no
// payload follows.
class FollowingPayloadTest : public DataPathOverSharedMemoryTest,
                             public ::testing::WithParamInterface<bool> {};

TEST_P(FollowingPayloadTest, PushesThatFollowTheirCallsLandLikeTheInProcessStore) {
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  worker::GrpcStoreOptions options = Options();
  options.overlap_push_copy = GetParam();
  options.stream_copy_in_bytes = SIZE_MAX;  // whatever this host's cache: no push streamed for size
  auto store = worker::GrpcParameterStore::CreateWithChannels(config_, options, channels_);
  ASSERT_THAT(store.status(), IsOk());
  Steps(store->get(), local->get(), 1, 1);  // asks for the segments (payloads by the socket)
  constexpr int kSteps = 4;
  Steps(store->get(), local->get(), 2, 1 + kSteps);
  const uint64_t payload = kSteps * 525000 * sizeof(float);
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_shared_in), payload);
  EXPECT_EQ((*store)->stats().calls_shared, 2u * kSteps);
  const worker::GrpcStoreStats stats = (*store)->stats();
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_following),
            GetParam() ? 525000 * sizeof(float) : 0);
  EXPECT_EQ(stats.payloads_following, GetParam() ? 2u : 0u);
  EXPECT_EQ(stats.payloads_whole, GetParam() ? 2u * (kSteps - 1) : 0u);
}

INSTANTIATE_TEST_SUITE_P(OnAndOff, FollowingPayloadTest, ::testing::Bool());

// Payloads streamed (non-temporal stores) into the segment, out of the tables and into the
// caller's buffers, by one thread or by two, land as the plain copies do: bitwise the
// in-process store's parameters.
class StreamedCopyTest : public DataPathOverSharedMemoryTest,
                         public ::testing::WithParamInterface<size_t> {
 protected:
  StreamedCopyTest() { stream_pull_bytes_ = 0; }
};

TEST_P(StreamedCopyTest, PushesAndPullsLandLikeTheInProcessStore) {
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  worker::GrpcStoreOptions options = Options();
  options.parallel_copy_in_bytes = GetParam();
  options.parallel_copy_bytes = GetParam();
  options.stream_copy_in_bytes = 0;
  options.stream_copy_bytes = 0;
  auto store = worker::GrpcParameterStore::CreateWithChannels(config_, options, channels_);
  ASSERT_THAT(store.status(), IsOk());
  Steps(store->get(), local->get(), 1, 4);
  EXPECT_GT(Sum(&common::DataPathCounters::bytes_shared_in), 0u);
  EXPECT_GT(Sum(&common::DataPathCounters::bytes_shared_out), 0u);
}

INSTANTIATE_TEST_SUITE_P(OneThreadAndTwo, StreamedCopyTest,
                         ::testing::Values(size_t{0}, size_t{1}));

// A segment too small for a call's payloads: that call goes by the socket.
TEST_F(DataPathOverSharedMemoryTest, CallsThatDoNotFitGoBySocket) {
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  worker::GrpcStoreOptions small = Options();
  small.shared_memory_bytes = 64 << 10;
  auto store = worker::GrpcParameterStore::CreateWithChannels(config_, small, channels_);
  ASSERT_THAT(store.status(), IsOk());
  Steps(store->get(), local->get(), 1, 3);
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_shared_in), 0u);
}

TEST_F(DataPathTest, PushesGoOnlyToServersHoldingTheirData) {
  const uint32_t owner = store_->partitioner().ServerForBlock(
      *store_->partitioner().FindTable("b"), 0);
  std::vector<float> grad(8, 1.0f);
  common::PushBatch push;
  push.dense.push_back({"b", grad});
  for (int i = 1; i <= 3; ++i) ASSERT_THAT(store_->Push(push, {i, false}), IsOk());
  EXPECT_EQ(Pushes(owner), 3u);
  EXPECT_EQ(Pushes(1 - owner), 0u) << "an asynchronous job sent an empty push";
}

TEST_F(DataPathTest, FusedPushPullMatchesPushThenPullAndTheInProcessStore) {
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  std::vector<float> grad(131072), fused(131072), reference(131072);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 1e-3f * static_cast<float>(i % 97);
  for (int step = 1; step <= 3; ++step) {
    common::PushBatch push;
    push.dense.push_back({"w", grad});
    common::PullBatch pull_fused, pull_reference;
    pull_fused.dense.push_back({"w", absl::MakeSpan(fused)});
    pull_reference.dense.push_back({"w", absl::MakeSpan(reference)});
    ASSERT_THAT(store_->PushPull(push, {step, false}, pull_fused, {step}), IsOk());
    ASSERT_THAT((*local)->Push(push, {step, false}), IsOk());
    ASSERT_THAT((*local)->Pull(pull_reference, {step}), IsOk());
    ASSERT_EQ(fused, reference) << "step " << step;
  }
}

// A large answer's blocks are copied into the caller's buffer by several threads: every
// byte lands where one thread's copy puts it, the same as the one-thread copy's.
TEST_F(DataPathTest, AnswersCopiedByThreadsEqualTheOneThreadCopy) {
  std::vector<float> grad(525000);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 1e-3f * static_cast<float>(i % 89);
  common::PushBatch push;
  push.dense.push_back({"m", grad});
  ASSERT_THAT(store_->Push(push, {1, false}), IsOk());
  worker::GrpcStoreOptions split;
  split.deadline = absl::Seconds(30);
  split.worker_id = -1;          // a reader: no clock of its own
  split.parallel_copy_bytes = 1;  // split every answer
  worker::GrpcStoreOptions whole = split;
  whole.parallel_copy_bytes = 0;
  std::vector<float> by_threads(grad.size(), -7.0f), by_one(grad.size(), 7.0f);
  for (auto [options, out] : {std::pair{&split, &by_threads}, std::pair{&whole, &by_one}}) {
    auto store = worker::GrpcParameterStore::CreateWithChannels(config_, *options, channels_);
    ASSERT_THAT(store.status(), IsOk());
    common::PullBatch pull;
    pull.dense.push_back({"m", absl::MakeSpan(*out)});
    ASSERT_THAT((*store)->Pull(pull, {0}), IsOk());
  }
  EXPECT_EQ(by_threads, by_one);
  EXPECT_NE(by_one[0], 7.0f);
  EXPECT_NE(by_threads.back(), -7.0f);
}

// A large pull asked for in pieces (several frames per server, each answered and copied on its
// own) reads what one frame per server reads, for every table of the call; a call that also
// pushes is never split.
TEST_F(DataPathTest, PullsInPiecesReadWhatOneFramePerServerReads) {
  std::vector<float> grad(525000);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 1e-3f * static_cast<float>(i % 97);
  common::PushBatch push;
  push.dense.push_back({"m", grad});
  ASSERT_THAT(store_->Push(push, {1, false}), IsOk());
  worker::GrpcStoreOptions pieces;
  pieces.deadline = absl::Seconds(30);
  pieces.worker_id = -1;
  pieces.pull_piece_bytes = 256 << 10;  // one block: "m" goes in 4 or 5 pieces per server
  pieces.max_pull_pieces = 3;
  worker::GrpcStoreOptions whole = pieces;
  whole.pull_piece_bytes = 0;
  struct Out {
    std::vector<float> m = std::vector<float>(525000, -7.0f);
    std::vector<float> w = std::vector<float>(131072, -7.0f);
    std::vector<float> b = std::vector<float>(8, -7.0f);
  };
  Out split, one;
  std::vector<uint64_t> frames;  // pulls served by both servers, per store
  for (auto [options, out] : {std::pair{&pieces, &split}, std::pair{&whole, &one}}) {
    auto store = worker::GrpcParameterStore::CreateWithChannels(config_, *options, channels_);
    ASSERT_THAT(store.status(), IsOk());
    common::PullBatch pull;
    pull.dense.push_back({"m", absl::MakeSpan(out->m)});
    pull.dense.push_back({"w", absl::MakeSpan(out->w)});
    pull.dense.push_back({"b", absl::MakeSpan(out->b)});
    const uint64_t before = Pulls(0) + Pulls(1);
    ASSERT_THAT((*store)->Pull(pull, {0}), IsOk());
    frames.push_back(Pulls(0) + Pulls(1) - before);
  }
  EXPECT_EQ(split.m, one.m);
  EXPECT_EQ(split.w, one.w);
  EXPECT_EQ(split.b, one.b);
  EXPECT_EQ(frames[0], 6u);  // at most 3 pieces per server, each a pull of its own
  EXPECT_EQ(frames[1], 2u);
  for (const auto* v : {&one.m, &one.w, &one.b}) {
    EXPECT_EQ(std::count(v->begin(), v->end(), -7.0f), 0);
  }
  // With a push in the call, one frame per server: its pull must see its push.
  worker::GrpcStoreOptions pusher = pieces;
  pusher.worker_id = 0;
  pusher.worker_incarnation = 2;
  auto store = worker::GrpcParameterStore::CreateWithChannels(config_, pusher, channels_);
  ASSERT_THAT(store.status(), IsOk());
  const uint64_t before = Pulls(0) + Pulls(1);
  common::PullBatch pull;
  pull.dense.push_back({"m", absl::MakeSpan(split.m)});
  ASSERT_THAT((*store)->PushPull(push, {1, false}, pull, {0}), IsOk());
  EXPECT_EQ(Pulls(0) + Pulls(1) - before, 2u);
}

// One table of 10,000 blocks of 4 values: a pull of all of it names them in about 30 KB, which
// fits a channel slot's request, but its answer's header (about 8 bytes a block) does not fit
// the slot's 64 KB of answer.
constexpr char kManyBlocksConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 dense_block_floats: 4 }
  default_optimizer { kind: SGD learning_rate: 0.5 }
  tables {
    name: "m"
    kind: TABLE_KIND_DENSE
    shape: 40000
    initializer { kind: UNIFORM low: -1 high: 1 }
  }
  security { plaintext: true }
)pb";

class ManyBlocksTest : public DataPathOverSharedMemoryTest {
 protected:
  ManyBlocksTest() { config_text_ = kManyBlocksConfig; }
};

// Such calls go by the socket with their payloads through the segment, never through the
// channel, whose answer could not hold them: before, each was applied, answered ABORTED by the
// channel and sent again by the socket (a duplicate), and the worker gave up its segment every
// time. Every step lands as the in-process store's.
TEST_F(ManyBlocksTest, CallsWhoseAnswerHeaderIsOverAChannelSlotGoBySocket) {
  std::vector<std::unique_ptr<server::Shard>> owned;
  auto local = LocalStore(&owned);
  ASSERT_THAT(local.status(), IsOk());
  Steps(store_.get(), local->get(), 1, 5, 40000);
  const worker::GrpcStoreStats stats = store_->stats();
  EXPECT_EQ(stats.retries, 0u);
  EXPECT_EQ(stats.duplicate_pushes, 0u);
  EXPECT_EQ(stats.calls_shared, 0u);
  EXPECT_EQ(Pushes(0), 5u);
  // Steps 2-5 had their payloads (pushed and pulled) through the segment.
  EXPECT_EQ(stats.bytes_shared, 4 * 2 * 40000 * sizeof(float));
}

// Lent push buffers (ParameterStore::LendPushBuffer) need a server holding all of the tables:
// one server, "a" in 5 blocks and "c" in one, Adam, shared memory.
constexpr char kOneServerConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 dense_block_floats: 65536 }
  default_optimizer { kind: SGD learning_rate: 0.5 }
  tables {
    name: "a"
    kind: TABLE_KIND_DENSE
    shape: 300000
    initializer { kind: UNIFORM low: -1 high: 1 }
  }
  tables {
    name: "c"
    kind: TABLE_KIND_DENSE
    shape: 10
    initializer { kind: ZEROS }
  }
  security { plaintext: true }
)pb";

class LentBufferTest : public DataPathTest {
 protected:
  LentBufferTest() {
    config_text_ = kOneServerConfig;
    tcp_ = true;
    adam_ = true;
    shared_bytes_ = 16 << 20;
  }

  void SetUp() override {
    DataPathTest::SetUp();
    auto local = LocalStore(&owned_);
    ASSERT_THAT(local.status(), IsOk());
    local_ = *std::move(local);
  }

  // A step of "a" and "c" pushed from `a` and `c` (their values set for `step` first), in
  // that order or the other, then pulled: bitwise the in-process store's.
  void Step(int step, absl::Span<float> a, absl::Span<float> c, bool a_first = true) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = 1e-3f * static_cast<float>((i * 7 + step) % 101);
    for (size_t i = 0; i < c.size(); ++i) c[i] = 0.01f * static_cast<float>(step + i);
    common::PushBatch push;
    push.dense.push_back({"a", a});
    push.dense.push_back({"c", c});
    if (!a_first) std::swap(push.dense[0], push.dense[1]);
    std::vector<float> got_a(a.size()), got_c(c.size()), want_a(a.size()), want_c(c.size());
    common::PullBatch got, want;
    got.dense = {{"a", absl::MakeSpan(got_a)}, {"c", absl::MakeSpan(got_c)}};
    want.dense = {{"a", absl::MakeSpan(want_a)}, {"c", absl::MakeSpan(want_c)}};
    ASSERT_THAT(store_->PushPull(push, {step, false}, got, {step}), IsOk());
    ASSERT_THAT(local_->Push(push, {step, false}), IsOk());
    ASSERT_THAT(local_->Pull(want, {step}), IsOk());
    ASSERT_EQ(got_a, want_a) << "step " << step;
    ASSERT_EQ(got_c, want_c) << "step " << step;
  }

  std::vector<std::unique_ptr<server::Shard>> owned_;
  std::unique_ptr<server::InProcessParameterStore> local_;
  const std::vector<std::string> tables_ = {"a", "c"};
};

// A push whose payload lies in a lent buffer is read by the server where it lies: the store
// copies none of it (bytes_lent), and it lands as the in-process store's. A push naming the
// tables in another order than the lend, or from other memory, is copied into the segment.
TEST_F(LentBufferTest, PushesFromALentBufferAreNotCopiedAndLandLikeTheInProcessStore) {
  EXPECT_EQ(store_->LendPushBuffer(tables_), nullptr) << "lent before the segment was there";
  std::vector<float> a(300000), c(10);
  Step(1, absl::MakeSpan(a), absl::MakeSpan(c));  // asks for the segment
  std::unique_ptr<common::LentBuffer> lent = store_->LendPushBuffer(tables_);
  ASSERT_NE(lent, nullptr);
  ASSERT_EQ(lent->num_tables(), 2u);
  ASSERT_EQ(lent->table(0).size(), 300000u);
  ASSERT_EQ(lent->table(1).size(), 10u);
  EXPECT_EQ(lent->table(1).data(), lent->table(0).data() + 300000);
  EXPECT_EQ(std::count(lent->values().begin(), lent->values().end(), 0.0f), 300010);
  const uint64_t shared_in = Sum(&common::DataPathCounters::bytes_shared_in);
  constexpr int kSteps = 3;
  for (int step = 2; step < 2 + kSteps; ++step) Step(step, lent->table(0), lent->table(1));
  const uint64_t payload = kSteps * 300010 * sizeof(float);
  EXPECT_EQ(store_->stats().bytes_lent, payload);
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_shared_in) - shared_in, payload);
  Step(5, lent->table(0), lent->table(1), /*a_first=*/false);
  Step(6, absl::MakeSpan(a), absl::MakeSpan(c));
  EXPECT_EQ(store_->stats().bytes_lent, payload);
  EXPECT_EQ(Sum(&common::DataPathCounters::bytes_shared_in) - shared_in,
            (kSteps + 2) * 300010 * sizeof(float));
}

// Only what one server holds, in float32, and at most half the segment; nothing without
// shared memory.
TEST_F(LentBufferTest, LendsWhatOneServerHoldsUpToHalfTheSegment) {
  std::vector<float> a(300000), c(10);
  Step(1, absl::MakeSpan(a), absl::MakeSpan(c));
  EXPECT_EQ(store_->LendPushBuffer({}), nullptr);
  EXPECT_EQ(store_->LendPushBuffer({"nope"}), nullptr);
  EXPECT_NE(store_->LendPushBuffer({"c"}), nullptr);
  auto small = [&](size_t bytes) {
    worker::GrpcStoreOptions options = Options();
    options.shared_memory_bytes = bytes;
    options.worker_incarnation = 2;
    auto store = worker::GrpcParameterStore::CreateWithChannels(config_, options, channels_);
    EXPECT_THAT(store.status(), IsOk());
    std::vector<float> out(10);
    common::PullBatch pull;
    pull.dense.push_back({"c", absl::MakeSpan(out)});
    EXPECT_THAT((*store)->Pull(pull, {0}), IsOk());  // asks for a segment
    return *std::move(store);
  };
  auto two_mb = small(2 << 20);  // "a" is 1.2 MB, more than half of it
  EXPECT_EQ(two_mb->LendPushBuffer({"a"}), nullptr);
  auto lent_c = two_mb->LendPushBuffer({"c"});
  EXPECT_NE(lent_c, nullptr);
  EXPECT_EQ(small(0)->LendPushBuffer({"c"}), nullptr);
}

// The buffer stays the caller's memory when its segment goes (another store of the worker
// asked for a new one, as after a server's restart): a push from it goes by the socket,
// applied once, and later ones are copied into the new segment. The failed call revokes it
// (LentBuffer::revoked), and not a buffer lent in the next segment. It outlives the store.
TEST_F(LentBufferTest, ALentBufferOutlivesItsSegmentAndItsStore) {
  std::vector<float> a(300000), c(10);
  Step(1, absl::MakeSpan(a), absl::MakeSpan(c));
  std::unique_ptr<common::LentBuffer> lent = store_->LendPushBuffer(tables_);
  ASSERT_NE(lent, nullptr);
  Step(2, lent->table(0), lent->table(1));
  const uint64_t lent_bytes = store_->stats().bytes_lent;
  ASSERT_GT(lent_bytes, 0u);
  auto other = worker::GrpcParameterStore::CreateWithChannels(config_, Options(), channels_);
  ASSERT_THAT(other.status(), IsOk());
  std::vector<float> out(10);
  common::PullBatch pull;
  pull.dense.push_back({"c", absl::MakeSpan(out)});
  ASSERT_THAT((*other)->Pull(pull, {0}), IsOk());  // replaces store_'s segment
  const uint64_t pushes = Pushes(0);
  EXPECT_FALSE(lent->revoked());
  Step(3, lent->table(0), lent->table(1));  // by the socket
  EXPECT_EQ(Pushes(0) - pushes, 1u) << "a push applied twice or not at all";
  // The call given up through the segment could still be read by its server: the buffer is
  // revoked (its owner writes its own memory from now on), also a buffer lent later there.
  EXPECT_TRUE(lent->revoked());
  Step(4, lent->table(0), lent->table(1));  // asks again
  Step(5, lent->table(0), lent->table(1));  // copied into the new segment
  EXPECT_EQ(store_->stats().bytes_lent, lent_bytes);
  std::unique_ptr<common::LentBuffer> next = store_->LendPushBuffer(tables_);
  ASSERT_NE(next, nullptr);
  EXPECT_FALSE(next->revoked());
  Step(6, next->table(0), next->table(1));
  EXPECT_GT(store_->stats().bytes_lent, lent_bytes);
  store_.reset();
  other->reset();
  std::fill(lent->values().begin(), lent->values().end(), 2.0f);
  EXPECT_EQ(std::count(lent->values().begin(), lent->values().end(), 2.0f), 300010);
}

}  // namespace
}  // namespace ps
