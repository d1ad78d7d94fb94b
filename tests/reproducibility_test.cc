// Bitwise reproducibility of BSP with training.deterministic: the servers apply the pushes of
// each clock in worker order, so two runs with the same config and seeds end with identical
// parameters, whatever order the workers' pushes arrive in; and the same holds between
// in-process shards (centralized mode's store) and real ps_server processes over gRPC.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "gtest/gtest.h"
#include "server/in_process_store.h"
#include "server/shard.h"
#include "tests/subprocess.h"
#include "worker/rpc/grpc_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::ps::testing::Subprocess;

constexpr int kServers = 2;
constexpr int kSteps = 16;
constexpr int kW = 600, kDim = 4, kKeys = 40;

std::string ConfigText(int workers) {
  return absl::StrCat(
      "cluster { num_servers: 2 num_workers: ", workers,
      " dense_block_floats: 256 num_virtual_shards: 64 }\n", R"pb(
        tables {
          name: "w" kind: TABLE_KIND_DENSE shape: [ 30, 20 ]
          initializer { kind: UNIFORM low: -1 high: 1 seed: 3 }
          optimizer { kind: ADAM learning_rate: 0.01 }
        }
        tables {
          name: "emb" kind: TABLE_KIND_SPARSE dim: 4
          initializer { kind: NORMAL stddev: 0.1 seed: 5 }
          optimizer { kind: ADAGRAD learning_rate: 0.1 }
        }
        training { staleness: 0 deterministic: true }
        checkpoint { interval_s: 0 }
        security { plaintext: true }
      )pb");
}

// One step of worker `worker`: pull, a gradient that depends on the values pulled (so any
// difference in what was pulled changes what is pushed), push. Random delays scramble the
// order in which the workers' pulls and pushes reach the servers.
absl::Status Step(common::ParameterStore* store, int worker, int step, std::mt19937* rng) {
  std::vector<uint64_t> keys;
  for (int j = 0; j < 5; ++j) keys.push_back((worker * 7 + step * 3 + j * 11) % kKeys);
  std::vector<float> w(kW), rows(keys.size() * kDim);
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(w)});
  pull.sparse.push_back({"emb", keys, absl::MakeSpan(rows)});
  RETURN_IF_ERROR(store->Pull(pull, {step}));
  absl::SleepFor(absl::Microseconds(std::uniform_int_distribution<int>(0, 2000)(*rng)));
  for (float& v : w) v = 0.1f * std::sin(3.0f * v + step + worker);
  for (float& v : rows) v = 0.1f * std::cos(5.0f * v + step - worker);
  common::PushBatch push;
  push.dense.push_back({"w", w});
  push.sparse.push_back({"emb", keys, rows});
  return store->Push(push, {step + 1, false});
}

// Runs `workers` threads of kSteps steps, each on the store make_store(worker) returns.
template <typename MakeStore>
void Train(int workers, MakeStore make_store) {
  std::random_device seed;
  std::vector<std::thread> threads;
  for (int worker = 0; worker < workers; ++worker) {
    threads.emplace_back([&, worker, s = seed()] {
      std::mt19937 rng(s);
      std::unique_ptr<common::ParameterStore> store = make_store(worker);
      for (int step = 0; step < kSteps; ++step) {
        ASSERT_THAT(Step(store.get(), worker, step, &rng), IsOk()) << "worker " << worker;
      }
      ASSERT_THAT(store->Finish(), IsOk());
    });
  }
  for (std::thread& t : threads) t.join();
}

// Every parameter the job can have touched, read without a worker identity.
std::vector<float> State(common::ParameterStore* reader) {
  std::vector<uint64_t> keys;
  for (int k = 0; k < kKeys; ++k) keys.push_back(k);
  std::vector<float> w(kW), rows(kKeys * kDim);
  common::PullBatch pull;
  pull.dense.push_back({"w", absl::MakeSpan(w)});
  pull.sparse.push_back({"emb", keys, absl::MakeSpan(rows)});
  EXPECT_THAT(reader->Pull(pull, {0}), IsOk());
  w.insert(w.end(), rows.begin(), rows.end());
  return w;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Two workers on in-process shards (the servers' core, no sockets).
std::vector<float> InProcessRun(int workers) {
  auto config = common::ParseJobConfigText(ConfigText(workers), "job");
  EXPECT_THAT(config.status(), IsOk());
  std::vector<std::unique_ptr<server::Shard>> shards;
  std::vector<server::Shard*> raw;
  for (int s = 0; s < kServers; ++s) {
    server::ShardOptions options;
    options.server_index = s;
    shards.push_back(*server::Shard::Create(*config, options));
    raw.push_back(shards.back().get());
  }
  auto store_for = [&raw](int worker) -> std::unique_ptr<common::ParameterStore> {
    server::InProcessStoreOptions options;
    options.worker_id = worker;
    options.worker_incarnation = 1;
    options.pull_timeout = absl::Seconds(60);
    return *server::InProcessParameterStore::Create(raw, options);
  };
  Train(workers, store_for);
  return State(store_for(-1).get());
}

// A worker's GrpcParameterStore that adds its bytes through shared memory to `total`, and its
// calls through the segments' channels to `calls`, when done.
class CountShared final : public common::ParameterStore {
 public:
  CountShared(std::unique_ptr<worker::GrpcParameterStore> store, std::atomic<uint64_t>* total,
              std::atomic<uint64_t>* calls)
      : store_(std::move(store)), total_(total), calls_(calls) {}
  ~CountShared() override {
    *total_ += store_->stats().bytes_shared;
    *calls_ += store_->stats().calls_shared;
  }
  absl::Status Pull(const common::PullBatch& batch, const common::PullOptions& options) override {
    return store_->Pull(batch, options);
  }
  absl::Status Push(const common::PushBatch& batch, const common::PushOptions& options) override {
    return store_->Push(batch, options);
  }
  absl::Status Finish() override { return store_->Finish(); }

 private:
  std::unique_ptr<worker::GrpcParameterStore> store_;
  std::atomic<uint64_t>* const total_;
  std::atomic<uint64_t>* const calls_;
};

// The same on two real ps_server processes, over gRPC; with `shared`, payloads and calls
// through shared memory (the servers grant it by default), which must then have carried some
// (deterministic BSP: the servers serve the channels' pushes on their pools).
std::vector<float> GrpcRun(int workers, bool shared = false) {
  const std::string dir = testing::MakeTempDir("repro");
  const std::string config_path = dir + "/job.textproto";
  std::ofstream(config_path) << ConfigText(workers);
  auto config = common::ParseJobConfigText(ConfigText(workers), "job");
  EXPECT_THAT(config.status(), IsOk());
  std::vector<std::unique_ptr<Subprocess>> servers;
  for (int i = 0; i < kServers; ++i) {
    const std::string port_file = absl::StrCat(dir, "/port", i);
    auto p =
        Subprocess::Start({testing::RunfilePath("server/ps_server"), "--config=" + config_path,
                           absl::StrCat("--server_index=", i), "--cluster_from=flags",
                           "--host=127.0.0.1", "--port=0", "--port_file=" + port_file,
                           absl::StrCat("--data_dir=", dir, "/data", i), "--exit_when_done=false"},
                          absl::StrCat(dir, "/server", i, ".log"));
    EXPECT_THAT(p.status(), IsOk());
    if (!p.ok()) return {};
    servers.push_back(*std::move(p));
    auto port = testing::WaitForFileLine(port_file, absl::Seconds(60), servers.back().get());
    EXPECT_THAT(port.status(), IsOk());
    if (!port.ok()) return {};
    config->mutable_cluster()->add_servers(absl::StrCat("127.0.0.1:", *port));
  }
  std::atomic<uint64_t> shared_bytes{0}, shared_calls{0};
  auto store_for = [&](int worker) -> std::unique_ptr<common::ParameterStore> {
    worker::GrpcStoreOptions options;
    options.worker_id = worker;
    options.worker_incarnation = 1;
    options.deadline = absl::Seconds(60);
    if (shared) options.shared_memory_bytes = 16 << 20;
    auto store = worker::GrpcParameterStore::Create(*config, options);
    EXPECT_THAT(store.status(), IsOk());
    EXPECT_THAT((*store)->WaitForServers(absl::Seconds(30)), IsOk());
    return std::make_unique<CountShared>(*std::move(store), &shared_bytes, &shared_calls);
  };
  Train(workers, store_for);
  if (shared) {
    EXPECT_GT(shared_bytes.load(), 0u);
    EXPECT_GT(shared_calls.load(), 0u);
  } else {
    EXPECT_EQ(shared_bytes.load(), 0u);
    EXPECT_EQ(shared_calls.load(), 0u);
  }
  std::vector<float> state = State(store_for(-1).get());
  for (auto& s : servers) s->Signal(SIGTERM);
  for (auto& s : servers) EXPECT_THAT(s->Wait(absl::Seconds(30)).status(), IsOk());
  return state;
}

TEST(Reproducibility, DeterministicBspRunsAreBitwiseIdentical) {
  const std::vector<float> first = InProcessRun(3);
  const std::vector<float> second = InProcessRun(3);
  ASSERT_EQ(first.size(), static_cast<size_t>(kW + kKeys * kDim));
  EXPECT_TRUE(BitwiseEqual(first, second));
}

TEST(Reproducibility, ServersOverGrpcMatchInProcessShardsBitwise) {
  const std::vector<float> in_process = InProcessRun(2);
  const std::vector<float> grpc = GrpcRun(2);
  EXPECT_TRUE(BitwiseEqual(in_process, grpc));
}

TEST(Reproducibility, ServersOverSharedMemoryMatchInProcessShardsBitwise) {
  const std::vector<float> in_process = InProcessRun(2);
  const std::vector<float> shared = GrpcRun(2, /*shared=*/true);
  EXPECT_TRUE(BitwiseEqual(in_process, shared));
}

// Centralized mode is one worker on in-process shards: the same as BSP with one worker on
// real servers.
TEST(Reproducibility, CentralizedEqualsOneWorkerOnServersBitwise) {
  const std::vector<float> centralized = InProcessRun(1);
  const std::vector<float> distributed = GrpcRun(1);
  EXPECT_TRUE(BitwiseEqual(centralized, distributed));
}

}  // namespace
}  // namespace ps
