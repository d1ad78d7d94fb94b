// Exactly-once pushes against a real ps_server: a client interceptor "loses" the reply of
// every third push after the server applied it (the client sees UNAVAILABLE and retries the
// same (worker, incarnation, sequence)), and raw duplicates of pushes are sent on top. The
// parameters must equal an in-test reference in which every push counts once.
#include <atomic>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/config/config.h"
#include "common/rpc/credentials.h"
#include "common/status_matchers.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "tests/subprocess.h"
#include "worker/rpc/grpc_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::ps::testing::Subprocess;

constexpr char kConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 dense_block_floats: 64 }
  tables {
    name: "w" kind: TABLE_KIND_DENSE shape: 200
    initializer { kind: UNIFORM low: -1 high: 1 }
    optimizer { kind: SGD learning_rate: 0.1 }
  }
  checkpoint { interval_s: 0 }
  security { plaintext: true }
)pb";

// Replaces the status of every third data-path reply (Push, or the PushPull frames the store
// sends) with UNAVAILABLE: the server applied the push, the client never hears so.
class LoseReplies final : public grpc::experimental::Interceptor {
 public:
  LoseReplies(grpc::experimental::ClientRpcInfo* info, std::atomic<int>* pushes,
              std::atomic<int>* lost)
      : is_push_(std::string(info->method()) == "/ps.ParameterServer/Push" ||
                 std::string(info->method()) == "/ps.ParameterServer/PushPull"),
        pushes_(pushes),
        lost_(lost) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (is_push_ && methods->QueryInterceptionHookPoint(
                        grpc::experimental::InterceptionHookPoints::POST_RECV_STATUS)) {
      grpc::Status* status = methods->GetRecvStatus();
      if (status->ok() && ++*pushes_ % 3 == 0) {
        ++*lost_;
        *status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "reply lost (injected)");
      }
    }
    methods->Proceed();
  }

 private:
  const bool is_push_;
  std::atomic<int>* pushes_;
  std::atomic<int>* lost_;
};

class LoseRepliesFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new LoseReplies(info, &pushes, &lost);
  }
  std::atomic<int> pushes{0}, lost{0};
};

float Grad(int step, int i) { return std::cos(0.1f * i + step); }

TEST(ExactlyOnce, RetriedAndDuplicatedPushesCountOnce) {
  const std::string dir = testing::MakeTempDir("once");
  std::ofstream(dir + "/job.textproto") << kConfig;
  auto server = Subprocess::Start(
      {testing::RunfilePath("server/ps_server"), "--config=" + dir + "/job.textproto",
       "--server_index=0", "--host=127.0.0.1", "--port=0", "--port_file=" + dir + "/port"},
      dir + "/server.log");
  ASSERT_THAT(server.status(), IsOk());
  auto port = testing::WaitForFileLine(dir + "/port", absl::Seconds(60), server->get());
  ASSERT_THAT(port.status(), IsOk());
  JobConfig config = *common::ParseJobConfigText(kConfig, "job");
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  config.mutable_cluster()->add_servers(address);

  auto factory = new LoseRepliesFactory;  // owned by the channel below
  LoseRepliesFactory* injector = factory;
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.emplace_back(factory);
  auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      address, grpc::InsecureChannelCredentials(), common::MakeChannelArguments(config.rpc()),
      std::move(factories));
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  channels.push_back(channel);
  worker::GrpcStoreOptions options;
  options.worker_id = 0;
  options.worker_incarnation = 7;
  options.initial_backoff = absl::Milliseconds(1);
  options.on_retry = [](uint32_t server, uint32_t attempt, const absl::Status& status) {
    std::cerr << "retry " << attempt << " of a call to server " << server << ": " << status << "\n";
  };
  auto store = *worker::GrpcParameterStore::CreateWithChannels(config, options, std::move(channels));
  ASSERT_THAT(store->WaitForServers(absl::Seconds(30)), IsOk());

  std::vector<float> initial(200);
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(initial)});
  ASSERT_THAT(store->Pull(pull, {}), IsOk());

  const int kSteps = 30;
  for (int s = 1; s <= kSteps; ++s) {
    std::vector<float> g(200);
    for (int i = 0; i < 200; ++i) g[i] = Grad(s, i);
    common::PushBatch push;
    push.dense.push_back({"w", g});
    ASSERT_THAT(store->Push(push, {s, false}), IsOk()) << "step " << s;
  }
  // Every third reply is lost, retries included, so about a third of the pushes needed a
  // retry (a retry's own reply may be lost too). Each push whose reply was lost ends with a
  // reply saying "duplicate": the server had applied it.
  const uint64_t lost = injector->lost.load();
  EXPECT_GE(lost, static_cast<uint64_t>(kSteps / 3 - 1));
  EXPECT_EQ(store->stats().retries, lost);
  EXPECT_GE(store->stats().duplicate_pushes, lost / 2);
  EXPECT_LE(store->stats().duplicate_pushes, lost);

  // Raw duplicates on the wire: the same push (a new worker incarnation) delivered three times.
  auto raw = ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  PushRequest request;
  request.mutable_header()->set_worker_id(0);
  request.mutable_header()->set_worker_incarnation(8);
  request.mutable_header()->set_sequence(1);
  request.mutable_header()->set_clock(kSteps + 1);
  request.mutable_header()->set_layout_fingerprint(store->partitioner().layout_fingerprint());
  TableValues* t = request.add_tables();
  t->set_table("w");
  std::vector<float> extra(200);
  for (int i = 0; i < 200; ++i) extra[i] = Grad(kSteps + 1, i);
  const auto* info = store->partitioner().FindTable("w");
  for (uint32_t b = 0; b < info->num_blocks; ++b) {
    auto [begin, end] = store->partitioner().BlockRange(*info, b);
    DenseBlock* block = t->add_blocks();
    block->set_block_id(b);
    common::EncodeFloats(absl::MakeSpan(extra).subspan(begin, end - begin), ENCODING_FLOAT32,
                         block->mutable_values());
  }
  int duplicates = 0;
  for (int copy = 0; copy < 3; ++copy) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    PushResponse response;
    ASSERT_TRUE(raw->Push(&context, request, &response).ok());
    duplicates += response.duplicate();
  }
  EXPECT_EQ(duplicates, 2);

  // Reference: every push once.
  std::vector<float> now(200);
  pull.dense[0].out = absl::MakeSpan(now);
  options.worker_incarnation = 9;
  auto reader = *worker::GrpcParameterStore::Create(config, options);
  ASSERT_THAT(reader->Pull(pull, {}), IsOk());
  for (int i = 0; i < 200; ++i) {
    double want = initial[i];
    for (int s = 1; s <= kSteps + 1; ++s) want -= 0.1 * Grad(s, i);
    ASSERT_NEAR(now[i], want, 1e-4) << "w[" << i << "]";
  }
}

}  // namespace
}  // namespace ps
