// A busy server's refusal end to end: a worker's GrpcParameterStore pushes to a GrpcServer
// whose pool already holds as many large requests as it may (max_pool_requests). The push is
// refused with RESOURCE_EXHAUSTED ("server_busy"), changes nothing, and the store sends it
// again after its back-off: every push is applied exactly once.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/codec.h"
#include "common/config/config.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/rpc/grpc_server.h"
#include "server/rpc/service.h"
#include "server/shard.h"
#include "worker/rpc/grpc_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;

constexpr int kFloats = 1200000;  // a push of "w" is about 4.8 MB: served on the pool

constexpr char kConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 2 dense_block_floats: 2097152 num_virtual_shards: 8 }
  security { plaintext: true }
  tables {
    name: "w" kind: TABLE_KIND_DENSE shape: 1200000
    initializer { kind: CONSTANT value: 1 }
    optimizer { kind: SGD learning_rate: 1 }
  }
)pb";

TEST(ServerBusyTest, ARefusedPushIsSentAgainAndAppliedOnce) {
  auto parsed = common::ParseJobConfigText(kConfig, "test");
  ASSERT_THAT(parsed.status(), IsOk());
  JobConfig config = *parsed;
  auto shard = server::Shard::Create(config, server::ShardOptions{});
  ASSERT_THAT(shard.status(), IsOk());
  server::ServiceOptions service_options;
  service_options.num_threads = 1;
  service_options.max_pool_requests = 1;
  service_options.auth.check_identities = false;
  auto service = std::make_unique<server::ParameterServerService>(
      shard->get(), service_options, server::ServiceHooks{});
  server::GrpcServerOptions server_options;
  server_options.address = "127.0.0.1:0";
  auto grpc_server = server::GrpcServer::Start(server_options, config.security(), service.get());
  ASSERT_THAT(grpc_server.status(), IsOk());
  config.mutable_cluster()->add_servers(absl::StrCat("127.0.0.1:", (*grpc_server)->port()));

  // The pool's one thread is held until worker 1's store is about to retry.
  absl::Notification release;
  service->RunOnPoolForTest([&release] { release.WaitForNotification(); });
  auto make_store = [&](int32_t worker) {
    worker::GrpcStoreOptions options;
    options.worker_id = worker;
    options.deadline = absl::Seconds(60);
    options.initial_backoff = absl::Milliseconds(10);
    options.max_backoff = absl::Milliseconds(100);
    options.on_retry = [&release](uint32_t, uint32_t, const absl::Status& status) {
      EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
      if (!release.HasBeenNotified()) release.Notify();
    };
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::vector<std::shared_ptr<grpc::Channel>> channels = {grpc::CreateCustomChannel(
        config.cluster().servers(0), grpc::InsecureChannelCredentials(), args)};
    return worker::GrpcParameterStore::CreateWithChannels(config, options, channels);
  };
  auto store0 = make_store(0);
  auto store1 = make_store(1);
  ASSERT_THAT(store0.status(), IsOk());
  ASSERT_THAT(store1.status(), IsOk());
  auto push = [](worker::GrpcParameterStore* store, float g) {
    common::PushBatch batch;
    const std::vector<float> grad(kFloats, g);
    batch.dense.push_back({"w", grad});
    return store->Push(batch, common::PushOptions{0, false});
  };

  // Worker 0's push takes the pool's one place and waits for its thread.
  absl::Status first;
  std::thread worker0([&] { first = push(store0->get(), 0.125f); });
  service->WaitForPoolRequestsForTest(1);
  // Worker 1's is refused (nothing changes), then sent again until the pool takes it.
  EXPECT_THAT(push(store1->get(), 0.25f), IsOk());
  worker0.join();
  EXPECT_THAT(first, IsOk());

  StatsResponse stats;
  (*shard)->FillStats(&stats);
  EXPECT_EQ(stats.pushes(), 2u);
  EXPECT_EQ(stats.duplicate_pushes(), 0u);
  const uint64_t retries = (*store1)->stats().retries;
  const auto busy = stats.rejected().find(server::kServerBusyReason);
  const uint64_t refused = busy == stats.rejected().end() ? 0 : busy->second;
  EXPECT_GE(retries, 1u) << "worker 0's retries " << (*store0)->stats().retries << ", refused "
                         << refused << ", rejections " << stats.ShortDebugString();
  EXPECT_EQ(refused, retries);
  EXPECT_EQ((*store0)->stats().retries, 0u);

  PullRequest pull;
  pull.mutable_header()->set_worker_id(-1);
  pull.mutable_header()->set_layout_fingerprint((*shard)->partitioner().layout_fingerprint());
  auto* t = pull.add_tables();
  t->set_table("w");
  t->add_block_ids(0);
  PullResponse response;
  ASSERT_THAT(service->HandlePull(pull, absl::Now() + absl::Seconds(60), &response), IsOk());
  std::vector<float> values(kFloats);
  ASSERT_THAT(common::DecodeFloats(response.tables(0).blocks(0).values(), ENCODING_FLOAT32,
                                   absl::MakeSpan(values)),
              IsOk());
  EXPECT_THAT(values, ::testing::Each(1.0f - 0.125f - 0.25f));

  store0->reset();
  store1->reset();
  grpc_server->reset();
}

}  // namespace
}  // namespace ps
