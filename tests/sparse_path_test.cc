// Sparse pulls and pushes through the data path (two real services on in-process gRPC
// channels, a GrpcParameterStore sending PushPull frames) against the in-process store,
// bitwise. The store asks each server only for the first occurrence of a key and copies the
// repeats itself, writes answers straight into the caller's rows, and sends a gradient as it
// is when every row goes to one server: these tests cover repeated keys, keys spread over both
// servers and keys all on one server, in float32 and in a 16-bit encoding.
#include <memory>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/config/config.h"
#include "common/status_matchers.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/in_process_store.h"
#include "server/rpc/service.h"
#include "server/shard.h"
#include "worker/rpc/grpc_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;

// "e32": float32 on the wire, Adagrad; "e16": bf16 on the wire without error feedback, SGD.
constexpr char kConfig[] = R"pb(
  cluster { num_servers: 2 num_workers: 1 num_virtual_shards: 64 }
  tables {
    name: "e32" kind: TABLE_KIND_SPARSE dim: 3
    initializer { kind: NORMAL stddev: 0.1 }
    optimizer { kind: ADAGRAD learning_rate: 0.1 }
  }
  tables {
    name: "e16" kind: TABLE_KIND_SPARSE dim: 16 wire_encoding: ENCODING_BF16
    wire_error_feedback: false
    initializer { kind: UNIFORM low: -1 high: 1 }
    optimizer { kind: SGD learning_rate: 0.5 }
  }
  security { plaintext: true }
)pb";

class SparsePathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = common::ParseJobConfigText(kConfig, "test");
    ASSERT_THAT(config.status(), IsOk());
    config_ = *config;
    for (int s = 0; s < 2; ++s) config_.mutable_cluster()->add_servers("in-process");
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    std::vector<server::Shard*> local_shards;
    for (uint32_t s = 0; s < 2; ++s) {
      server::ShardOptions options;
      options.server_index = s;
      auto shard = server::Shard::Create(config_, options);
      ASSERT_THAT(shard.status(), IsOk());
      shards_.push_back(*std::move(shard));
      auto local = server::Shard::Create(config_, options);
      ASSERT_THAT(local.status(), IsOk());
      local_shards_.push_back(*std::move(local));
      local_shards.push_back(local_shards_.back().get());
      server::ServiceOptions service_options;
      service_options.auth.check_identities = false;  // plaintext, in-process
      services_.push_back(std::make_unique<server::ParameterServerService>(
          shards_.back().get(), service_options, server::ServiceHooks{}));
      grpc::ServerBuilder builder;
      builder.RegisterService(services_.back().get());
      servers_.push_back(builder.BuildAndStart());
      ASSERT_NE(servers_.back(), nullptr);
      channels.push_back(servers_.back()->InProcessChannel(grpc::ChannelArguments()));
    }
    worker::GrpcStoreOptions options;
    options.deadline = absl::Seconds(30);
    auto store = worker::GrpcParameterStore::CreateWithChannels(config_, options, channels);
    ASSERT_THAT(store.status(), IsOk());
    store_ = *std::move(store);
    auto local = server::InProcessParameterStore::Create(local_shards, {});
    ASSERT_THAT(local.status(), IsOk());
    local_ = *std::move(local);
  }

  void TearDown() override {
    store_.reset();
    for (auto& s : servers_) s->Shutdown();
  }

  // Keys of [0, 1000) that live on server `s`, the first `n` of them.
  std::vector<uint64_t> KeysOn(uint32_t s, size_t n) const {
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < 1000 && keys.size() < n; ++k) {
      if (store_->partitioner().ServerForKey(k) == s) keys.push_back(k);
    }
    return keys;
  }

  // Pulls `keys` of `table` from both stores: the rows must be equal bitwise.
  void ExpectSamePull(const std::string& table, const std::vector<uint64_t>& keys,
                      const std::string& what) {
    const size_t dim = store_->partitioner().FindTable(table)->dim;
    std::vector<float> got(keys.size() * dim, -7.0f), want(keys.size() * dim);
    common::PullBatch pull_got, pull_want;
    pull_got.sparse.push_back({table, keys, absl::MakeSpan(got)});
    pull_want.sparse.push_back({table, keys, absl::MakeSpan(want)});
    ASSERT_THAT(store_->Pull(pull_got, {}), IsOk()) << what;
    ASSERT_THAT(local_->Pull(pull_want, {}), IsOk()) << what;
    if (store_->partitioner().FindTable(table)->config->wire_encoding() == ENCODING_BF16) {
      // The in-process store reads float32: round what it read as the wire does.
      for (float& v : want) v = common::Bfloat16ToFloat(common::FloatToBfloat16(v));
    }
    ASSERT_EQ(got, want) << table << ": " << what;
  }

  // Pushes the same gradient for `keys` of `table` to both stores. Its values are multiples
  // of 1/64 below 1, exact in bf16, so both stores apply the same numbers.
  void PushBoth(const std::string& table, const std::vector<uint64_t>& keys, int step) {
    const size_t dim = store_->partitioner().FindTable(table)->dim;
    std::vector<float> grad(keys.size() * dim);
    for (size_t i = 0; i < grad.size(); ++i) {
      grad[i] = static_cast<float>(static_cast<int>((i * 7 + step * 13) % 23) - 11) / 64.0f;
    }
    common::PushBatch push;
    push.sparse.push_back({table, keys, grad});
    ASSERT_THAT(store_->Push(push, {step, false}), IsOk());
    ASSERT_THAT(local_->Push(push, {step, false}), IsOk());
  }

  JobConfig config_;
  std::vector<std::unique_ptr<server::Shard>> shards_, local_shards_;
  std::vector<std::unique_ptr<server::ParameterServerService>> services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::unique_ptr<worker::GrpcParameterStore> store_;
  std::unique_ptr<common::ParameterStore> local_;
};

TEST_F(SparsePathTest, PullsMatchTheInProcessStoreWithRepeatsAndEitherServer) {
  const std::vector<uint64_t> on0 = KeysOn(0, 6), on1 = KeysOn(1, 6);
  ASSERT_EQ(on0.size(), 6u);
  ASSERT_EQ(on1.size(), 6u);
  // Both servers, interleaved, with repeats (also of a key's first position's neighbours).
  const std::vector<uint64_t> mixed = {on0[0], on1[0], on0[0], on1[1], on0[1], on1[0],
                                       on1[0], on0[2], ~uint64_t{0}, ~uint64_t{0}, 0};
  for (const std::string table : {"e32", "e16"}) {
    ExpectSamePull(table, mixed, "both servers, repeated keys");
    ExpectSamePull(table, on0, "every key on server 0, in order");
    ExpectSamePull(table, {on1[3], on1[2], on1[3], on1[3]}, "one server, repeats");
    ExpectSamePull(table, {on0[4]}, "one key");
  }
}

TEST_F(SparsePathTest, PushesMatchTheInProcessStoreWithRepeatsAndEitherServer) {
  const std::vector<uint64_t> on0 = KeysOn(0, 5), on1 = KeysOn(1, 5);
  const std::vector<std::vector<uint64_t>> pushes = {
      {on0[0], on1[0], on0[0], on1[1], on0[1]},  // both servers, a repeat
      on1,                                       // every row to one server, in order
      {on0[2], on0[2], on0[3]},                  // one server, a repeat
  };
  int step = 0;
  for (int round = 0; round < 2; ++round) {
    for (const auto& keys : pushes) {
      ++step;
      for (const std::string table : {"e32", "e16"}) PushBoth(table, keys, step);
    }
  }
  std::vector<uint64_t> all = on0;
  all.insert(all.end(), on1.begin(), on1.end());
  for (const std::string table : {"e32", "e16"}) ExpectSamePull(table, all, "after pushes");
}

}  // namespace
}  // namespace ps
