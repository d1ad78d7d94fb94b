// Two real ps_server processes on 127.0.0.1 (port 0). A client pushes a fixed sequence of
// dense and sparse gradients and pulls them back; the values must equal an independent
// in-test reference. Then both servers get SIGTERM, are restarted on the same data dirs, and
// must serve bitwise-identical values, Adam slots included.
#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"
#include "worker/rpc/grpc_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::ps::testing::Subprocess;

constexpr char kConfig[] = R"pb(
  cluster { num_servers: 2 num_workers: 1 dense_block_floats: 256 num_virtual_shards: 128 }
  tables {
    name: "w" kind: TABLE_KIND_DENSE shape: [ 40, 25 ]
    initializer { kind: UNIFORM low: -1 high: 1 seed: 3 }
    optimizer { kind: SGD learning_rate: 0.1 }
  }
  tables {
    name: "emb" kind: TABLE_KIND_SPARSE dim: 8
    initializer { kind: NORMAL stddev: 0.1 }
    optimizer { kind: SGD learning_rate: 0.05 }
  }
  tables {
    name: "a" kind: TABLE_KIND_DENSE shape: 600
    initializer { kind: UNIFORM low: -1 high: 1 }
    optimizer { kind: ADAM learning_rate: 0.01 }
  }
  checkpoint { interval_s: 0 }
  security { plaintext: true }
)pb";

constexpr int kW = 1000, kA = 600, kDim = 8;

// Deterministic gradient values for step s, element i.
float Grad(int step, size_t i) { return std::sin(0.37f * i + 1.3f * step) * (1 + step % 3); }

class ServerE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("e2e");
    config_path_ = dir_ + "/job.textproto";
    std::ofstream(config_path_) << kConfig;
    auto config = common::ParseJobConfigText(kConfig, "job");
    ASSERT_THAT(config.status(), IsOk());
    config_ = *config;
    for (int i = 0; i < 2; ++i) data_dirs_.push_back(absl::StrCat(dir_, "/data", i));
  }

  // Starts both servers and points config_ at them.
  void StartServers() {
    config_.mutable_cluster()->clear_servers();
    servers_.clear();
    for (int i = 0; i < 2; ++i) {
      const std::string port_file = absl::StrCat(dir_, "/port", i, "_", ++starts_);
      auto p = Subprocess::Start(
          {testing::RunfilePath("server/ps_server"), "--config=" + config_path_,
           absl::StrCat("--server_index=", i), "--host=127.0.0.1", "--port=0",
           "--port_file=" + port_file, "--data_dir=" + data_dirs_[i], "--threads=2"},
          absl::StrCat(dir_, "/server", i, ".log"));
      ASSERT_THAT(p.status(), IsOk());
      servers_.push_back(*std::move(p));
      auto port = testing::WaitForFileLine(port_file, absl::Seconds(60), servers_.back().get());
      ASSERT_THAT(port.status(), IsOk());
      config_.mutable_cluster()->add_servers(absl::StrCat("127.0.0.1:", *port));
    }
    worker::GrpcStoreOptions options;
    options.worker_id = 0;
    options.worker_incarnation = ++incarnation_;
    options.deadline = absl::Seconds(30);
    auto store = worker::GrpcParameterStore::Create(config_, options);
    ASSERT_THAT(store.status(), IsOk());
    store_ = *std::move(store);
    ASSERT_THAT(store_->WaitForServers(absl::Seconds(30)), IsOk());
  }

  void StopServers() {
    for (auto& s : servers_) s->Signal(SIGTERM);
    for (auto& s : servers_) {
      auto status = s->Wait(absl::Seconds(30));
      ASSERT_THAT(status.status(), IsOk()) << s->ReadLog();
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << s->ReadLog();
    }
    store_.reset();
  }

  struct Snapshot {
    std::vector<float> w, a, emb;
  };
  Snapshot PullAll() {
    Snapshot s;
    s.w.resize(kW);
    s.a.resize(kA);
    s.emb.resize(keys_.size() * kDim);
    common::PullBatch batch;
    batch.dense.push_back({"w", absl::MakeSpan(s.w)});
    batch.dense.push_back({"a", absl::MakeSpan(s.a)});
    batch.sparse.push_back({"emb", keys_, absl::MakeSpan(s.emb)});
    EXPECT_THAT(store_->Pull(batch, {}), IsOk());
    return s;
  }

  void PushStep(int step) {
    std::vector<float> gw(kW), ga(kA), ge(keys_.size() * kDim);
    for (int i = 0; i < kW; ++i) gw[i] = Grad(step, i);
    for (int i = 0; i < kA; ++i) ga[i] = Grad(step + 100, i);
    for (size_t i = 0; i < ge.size(); ++i) ge[i] = Grad(step + 200, i);
    common::PushBatch batch;
    batch.dense.push_back({"w", gw});
    batch.dense.push_back({"a", ga});
    batch.sparse.push_back({"emb", keys_, ge});
    ASSERT_THAT(store_->Push(batch, {step, false}), IsOk());
  }

  std::string dir_, config_path_;
  std::vector<std::string> data_dirs_;
  JobConfig config_;
  std::vector<std::unique_ptr<Subprocess>> servers_;
  std::unique_ptr<worker::GrpcParameterStore> store_;
  int starts_ = 0;
  uint64_t incarnation_ = 100;
  std::vector<uint64_t> keys_ = {3, 17, 1ull << 40, 99999, 5, 123456789};
};

// Adam on one value, in double precision, from w0 through gradients gs.
double AdamReference(double w, const std::vector<float>& gs) {
  double m = 0, v = 0;
  for (size_t t = 1; t <= gs.size(); ++t) {
    const double g = gs[t - 1];
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    w -= 0.01 * (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8);
  }
  return w;
}

TEST_F(ServerE2eTest, PushesMatchReferenceAndSurviveRestartBitwise) {
  StartServers();
  const Snapshot initial = PullAll();
  const int kSteps = 5;
  for (int step = 1; step <= kSteps; ++step) PushStep(step);
  const Snapshot trained = PullAll();

  // SGD reference: w = w0 - lr * sum of gradients.
  for (int i = 0; i < kW; ++i) {
    double want = initial.w[i];
    for (int s = 1; s <= kSteps; ++s) want -= 0.1 * Grad(s, i);
    ASSERT_NEAR(trained.w[i], want, 1e-4) << "w[" << i << "]";
  }
  for (size_t i = 0; i < trained.emb.size(); ++i) {
    double want = initial.emb[i];
    for (int s = 1; s <= kSteps; ++s) want -= 0.05 * Grad(s + 200, i);
    ASSERT_NEAR(trained.emb[i], want, 1e-4) << "emb[" << i << "]";
  }
  for (int i = 0; i < kA; ++i) {
    std::vector<float> gs;
    for (int s = 1; s <= kSteps; ++s) gs.push_back(Grad(s + 100, i));
    ASSERT_NEAR(trained.a[i], AdamReference(initial.a[i], gs), 1e-5) << "a[" << i << "]";
  }

  StopServers();  // SIGTERM: final checkpoint
  StartServers();
  const Snapshot restored = PullAll();
  EXPECT_EQ(0, std::memcmp(restored.w.data(), trained.w.data(), kW * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(restored.a.data(), trained.a.data(), kA * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(restored.emb.data(), trained.emb.data(),
                           trained.emb.size() * sizeof(float)));

  // Adam's slots and step counts came back too: the next step continues the same run.
  PushStep(kSteps + 1);
  const Snapshot after = PullAll();
  for (int i = 0; i < kA; ++i) {
    std::vector<float> gs;
    for (int s = 1; s <= kSteps + 1; ++s) gs.push_back(Grad(s + 100, i));
    ASSERT_NEAR(after.a[i], AdamReference(initial.a[i], gs), 1e-5) << "a[" << i << "]";
  }
  StopServers();
}

TEST_F(ServerE2eTest, OversizedMessageIsResourceExhaustedAndServerKeepsServing) {
  // Servers accept at most 64 KiB per message; the client may send more.
  std::ofstream(config_path_) << kConfig << "server { max_message_bytes: 65536 }\n";
  StartServers();
  const Snapshot before = PullAll();
  std::vector<float> huge(40000, 1.0f);
  std::vector<uint64_t> keys(40000 / kDim);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  common::PushBatch batch;
  batch.sparse.push_back({"emb", keys, absl::MakeSpan(huge).subspan(0, keys.size() * kDim)});
  EXPECT_THAT(store_->Push(batch, {1, false}), StatusIs(absl::StatusCode::kResourceExhausted));
  const Snapshot after = PullAll();
  EXPECT_EQ(after.w, before.w);
  EXPECT_EQ(after.emb, before.emb);
  StopServers();
}

}  // namespace
}  // namespace ps
