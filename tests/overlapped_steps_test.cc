// Overlapped steps (training.prefetch) through real services: two ParameterServerServices on
// in-process gRPC channels (no sockets) and whole TrainingJobs (synthetic CTR model: sparse
// embedding and dense layers). With prefetch each step makes one PushPull round trip per
// server (the previous step's push and the next step's pull in one frame); two workers under
// SSP get no pull answered beyond the bound and every push is applied once; one worker trains
// to bitwise the same parameters through the gRPC store, with every third reply lost (retried
// fused calls count once), as through the in-process store that centralized mode uses; also
// the MLP, whose two buffer sets the store fills directly (skipped without Fashion-MNIST).
#include <sys/stat.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"
#include "gtest/gtest.h"
#include "kernels/separate_memory_backend.h"
#include "server/in_process_store.h"
#include "server/rpc/service.h"
#include "server/shard.h"
#include "worker/rpc/grpc_store.h"
#include "worker/training_job.h"

namespace ps {
namespace {

using ::ps::common::IsOk;

// 4000 examples, batch 50: 40 steps per worker of 2 (80 for one worker). Dense blocks of 64
// floats, so that every dense table has blocks on both servers and every pull reaches both.
constexpr char kJob[] = R"pb(
  name: "overlapped-steps-test"
  cluster { num_servers: 2 num_workers: 2 dense_block_floats: 64 }
  model { ctr { embedding_table: "emb" embedding_dim: 4 combiner: SUM } }
  default_optimizer { kind: ADAM learning_rate: 0.01 }
  data {
    format: SYNTHETIC_CTR
    shuffle: false
    synthetic {
      num_train: 4000 num_test: 400 num_fields: 6 vocabulary_per_field: 100
      zipf_exponent: 1.1 weight_stddev: 1.0 seed: 7
    }
  }
  training { batch_size: 50 epochs: 1 device: "cpu" seed: 1 prefetch: true }
  checkpoint { interval_s: 0 }
  security { plaintext: true }
)pb";

constexpr char kPushPull[] = "/ps.ParameterServer/PushPull";

// Counts a channel's PushPull calls; with `lose` set, replaces the status of every third
// PushPull reply with UNAVAILABLE after the server answered (the store retries the frame).
class CountCalls final : public grpc::experimental::Interceptor {
 public:
  CountCalls(grpc::experimental::ClientRpcInfo* info, std::atomic<int>* calls,
             std::atomic<int>* lost, bool lose)
      : data_path_(std::string(info->method()) == kPushPull), calls_(calls), lost_(lost),
        lose_(lose) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (data_path_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      ++*calls_;
    }
    if (data_path_ && lose_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_STATUS)) {
      grpc::Status* status = methods->GetRecvStatus();
      if (status->ok() && *calls_ % 3 == 0) {
        ++*lost_;
        *status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "reply lost (injected)");
      }
    }
    methods->Proceed();
  }

 private:
  const bool data_path_;
  std::atomic<int>* const calls_;
  std::atomic<int>* const lost_;
  const bool lose_;
};

class CountCallsFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit CountCallsFactory(bool lose) : lose_(lose) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new CountCalls(info, &calls, &lost, lose_);
  }
  std::atomic<int> calls{0}, lost{0};

 private:
  const bool lose_;
};

// The Fashion-MNIST MLP (two buffer sets: the store fills the model's spare set directly),
// 100 steps of one worker.
constexpr char kMlpJob[] = R"pb(
  name: "overlapped-steps-mlp"
  cluster { num_servers: 2 num_workers: 1 dense_block_floats: 16384 }
  model { mlp { input_dim: 784 hidden: [64] num_classes: 10 activation: RELU } }
  default_optimizer { kind: ADAM learning_rate: 0.001 }
  data {
    format: IDX
    train_images: "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
    train_labels: "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"
    test_images: "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
    test_labels: "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
  }
  training { batch_size: 64 epochs: 1 max_steps: 100 device: "cpu" seed: 1 prefetch: true }
  checkpoint { interval_s: 0 }
  security { plaintext: true }
)pb";

JobConfig Job(int workers, std::optional<int> staleness, const char* text = kJob) {
  absl::StatusOr<JobConfig> config = common::ParseJobConfigText(text, "job");
  CHECK(config.ok()) << config.status();
  config->mutable_cluster()->set_num_workers(workers);
  if (staleness.has_value()) config->mutable_training()->set_staleness(*staleness);
  CHECK(common::ExpandModelTables(&*config).ok());
  CHECK(common::ValidateJobConfig(*config).ok());
  for (uint32_t s = 0; s < config->cluster().num_servers(); ++s) {
    config->mutable_cluster()->add_servers("in-process");
  }
  return *std::move(config);
}

// Two services over shards of `config`, each reached through one counting channel.
class Cluster {
  // Real sockets on 127.0.0.1 instead of in-process channels under ThreadSanitizer, which sees
  // no ordering where an in-process channel hands the server's answer buffers to the client
  // (inside the uninstrumented libgrpc) and reports the client reading them.
#if defined(__SANITIZE_THREAD__)
  static constexpr bool kTcp = true;
#else
  static constexpr bool kTcp = false;
#endif

 public:
  // With `shared` the services grant shared memory (and the job's stores ask for it).
  Cluster(const JobConfig& config, bool lose_replies, bool shared = false) {
    for (uint32_t s = 0; s < config.cluster().num_servers(); ++s) {
      server::ShardOptions options;
      options.server_index = s;
      absl::StatusOr<std::unique_ptr<server::Shard>> shard = server::Shard::Create(config, options);
      CHECK(shard.ok()) << shard.status();
      shards_.push_back(*std::move(shard));
      server::ServiceOptions service_options;
      service_options.auth.check_identities = false;  // plaintext, in-process
      if (shared) service_options.max_shared_bytes_per_worker = 64 << 20;
      services_.push_back(std::make_unique<server::ParameterServerService>(
          shards_.back().get(), service_options, server::ServiceHooks{}));
      grpc::ServerBuilder builder;
      builder.RegisterService(services_.back().get());
      int port = 0;
      if (kTcp) builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      servers_.push_back(builder.BuildAndStart());
      CHECK(servers_.back() != nullptr);
      auto factory = std::make_unique<CountCallsFactory>(lose_replies);
      counters_.push_back(factory.get());  // owned by the channel
      std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> f;
      f.push_back(std::move(factory));
      if (kTcp) {
        CHECK_NE(port, 0);
        channels_.push_back(grpc::experimental::CreateCustomChannelWithInterceptors(
            absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(),
            grpc::ChannelArguments(), std::move(f)));
      } else {
        channels_.push_back(servers_.back()->experimental().InProcessChannelWithInterceptors(
            grpc::ChannelArguments(), std::move(f)));
      }
    }
  }
  ~Cluster() {
    kept_.clear();
    for (auto& s : servers_) s->Shutdown();
  }

  worker::StoreFactory StoreFor(int worker) {
    return [this, worker](const JobConfig& config, common::metrics::Registry*)
               -> absl::StatusOr<std::unique_ptr<common::ParameterStore>> {
      worker::GrpcStoreOptions options = worker::JobStoreOptions(config, worker, 1);
      options.initial_backoff = absl::Milliseconds(1);
      // Replies are lost in gRPC: the calls go by the socket, the payloads through the segment
      // (a call through the segment's channel has no gRPC reply to lose).
      options.shared_memory_calls = false;
      ASSIGN_OR_RETURN(auto store,
                       worker::GrpcParameterStore::CreateWithChannels(config, options, channels_));
      return std::unique_ptr<common::ParameterStore>(std::move(store));
    };
  }
  // StoreFor's store, kept here after the job is done with it (its stats stay readable).
  worker::StoreFactory KeptStoreFor(int worker) {
    return [this, worker](const JobConfig& config, common::metrics::Registry* metrics)
               -> absl::StatusOr<std::unique_ptr<common::ParameterStore>> {
      ASSIGN_OR_RETURN(std::unique_ptr<common::ParameterStore> store,
                       StoreFor(worker)(config, metrics));
      kept_.push_back(std::move(store));
      return std::unique_ptr<common::ParameterStore>(
          std::make_unique<Forwarding>(kept_.back().get()));
    };
  }
  // Push bytes the kept stores' servers read where they lay in lent buffers.
  uint64_t bytes_lent() const {
    uint64_t n = 0;
    for (const auto& store : kept_) {
      n += static_cast<const worker::GrpcParameterStore*>(store.get())->stats().bytes_lent;
    }
    return n;
  }
  int calls(int s) const { return counters_[s]->calls.load(); }
  int lost() const {
    int n = 0;
    for (const CountCallsFactory* c : counters_) n += c->lost.load();
    return n;
  }
  // Push payload bytes that came through shared memory.
  uint64_t shared_in() const {
    uint64_t n = 0;
    for (const auto& service : services_) n += service->data_path_counters().bytes_shared_in.load();
    return n;
  }
  StatsResponse Stats(int s) const {
    StatsResponse stats;
    shards_[s]->FillStats(&stats);
    return stats;
  }
  std::vector<server::Shard*> shards() const {
    std::vector<server::Shard*> out;
    for (const auto& shard : shards_) out.push_back(shard.get());
    return out;
  }

 private:
  // A store that passes every call on to one it does not own.
  class Forwarding final : public common::ParameterStore {
   public:
    explicit Forwarding(common::ParameterStore* to) : to_(to) {}
    absl::Status Pull(const common::PullBatch& b, const common::PullOptions& o) override {
      return to_->Pull(b, o);
    }
    absl::Status Push(const common::PushBatch& b, const common::PushOptions& o) override {
      return to_->Push(b, o);
    }
    absl::Status PushPull(const common::PushBatch& push, const common::PushOptions& push_options,
                          const common::PullBatch& pull,
                          const common::PullOptions& pull_options) override {
      return to_->PushPull(push, push_options, pull, pull_options);
    }
    absl::Status Finish() override { return to_->Finish(); }
    absl::StatusOr<common::WorkerPosition> ReportPosition(uint32_t epoch,
                                                          uint64_t offset) override {
      return to_->ReportPosition(epoch, offset);
    }
    std::unique_ptr<common::LentBuffer> LendPushBuffer(
        absl::Span<const std::string> tables) override {
      return to_->LendPushBuffer(tables);
    }

   private:
    common::ParameterStore* const to_;
  };

  std::vector<std::unique_ptr<common::ParameterStore>> kept_;  // GrpcParameterStores
  std::vector<std::unique_ptr<server::Shard>> shards_;
  std::vector<std::unique_ptr<server::ParameterServerService>> services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<CountCallsFactory*> counters_;  // owned by channels_
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
};

absl::StatusOr<worker::TrainResult> Train(const JobConfig& config, int worker,
                                          const std::string& eval,
                                          const worker::StoreFactory& store,
                                          kernels::Backend* backend = nullptr) {
  worker::TrainingJobOptions options;
  options.worker_index = worker;
  options.eval = eval;
  options.backend = backend;
  ASSIGN_OR_RETURN(std::unique_ptr<worker::TrainingJob> job,
                   worker::TrainingJob::Create(config, options, store));
  return job->Run();
}

// Every dense table of `config`, read through an in-process store over `shards`.
std::vector<std::vector<float>> DenseTables(const JobConfig& config,
                                            std::vector<server::Shard*> shards) {
  server::InProcessStoreOptions options;
  options.worker_id = -1;
  auto reader = server::InProcessParameterStore::Create(std::move(shards), options);
  CHECK(reader.ok()) << reader.status();
  std::vector<std::vector<float>> out;
  common::PullBatch pull;
  out.reserve(config.tables_size());
  for (const TableConfig& t : config.tables()) {
    if (t.kind() != TABLE_KIND_DENSE) continue;
    int64_t n = 1;
    for (int64_t d : t.shape()) n *= d;
    out.emplace_back(n);
    pull.dense.push_back({t.name(), absl::MakeSpan(out.back())});
  }
  CHECK((*reader)->Pull(pull, {}).ok());
  return out;
}

TEST(OverlappedSteps, EachStepIsOnePushPullPerServerWithinTheSspBound) {
  const JobConfig config = Job(/*workers=*/2, /*staleness=*/1);
  Cluster cluster(config, /*lose_replies=*/false);
  absl::StatusOr<worker::TrainResult> results[2];
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] { results[w] = Train(config, w, "never", cluster.StoreFor(w)); });
  }
  for (std::thread& t : workers) t.join();
  for (int w = 0; w < 2; ++w) {
    ASSERT_THAT(results[w].status(), IsOk());
    ASSERT_EQ(results[w]->steps, 40u);
  }
  for (int s = 0; s < 2; ++s) {
    // Per worker: 40 steps, 38 fused calls, the first two steps' pulls and the last two
    // steps' pushes alone (without prefetch's fusion it would be 80).
    EXPECT_EQ(cluster.calls(s), 2 * (40 + 2)) << "server " << s;
    const StatsResponse stats = cluster.Stats(s);
    EXPECT_EQ(stats.pushes(), 80u) << "server " << s;  // under SSP every server hears each
    EXPECT_EQ(stats.duplicate_pushes(), 0u);
    EXPECT_LE(stats.max_staleness_seen(), 1) << "server " << s;
  }
}

// One worker trained again through an in-process store over shards of its own: the same
// steps as `remote` took through `cluster`, so bitwise the same parameters and test metrics.
// `local_pushes`: the pushes the in-process shards applied.
void ExpectLikeTheInProcessStore(const JobConfig& config, const worker::TrainResult& remote,
                                 const Cluster& cluster, bool binary,
                                 uint64_t* local_pushes = nullptr) {
  std::vector<std::unique_ptr<server::Shard>> local;
  std::vector<server::Shard*> local_shards;
  for (uint32_t s = 0; s < config.cluster().num_servers(); ++s) {
    server::ShardOptions options;
    options.server_index = s;
    local.push_back(*server::Shard::Create(config, options));
    local_shards.push_back(local.back().get());
  }
  auto in_process =
      [&](const JobConfig&,
          common::metrics::Registry*) -> absl::StatusOr<std::unique_ptr<common::ParameterStore>> {
    ASSIGN_OR_RETURN(auto store, server::InProcessParameterStore::Create(local_shards, {}));
    return std::unique_ptr<common::ParameterStore>(std::move(store));
  };
  absl::StatusOr<worker::TrainResult> centralized = Train(config, 0, "always", in_process);
  ASSERT_THAT(centralized.status(), IsOk());
  ASSERT_TRUE(remote.final_eval.has_value() && centralized->final_eval.has_value());
  EXPECT_EQ(remote.final_eval->loss, centralized->final_eval->loss);
  if (binary) {
    EXPECT_EQ(remote.final_eval->auc, centralized->final_eval->auc);
  } else {
    EXPECT_EQ(remote.final_eval->accuracy, centralized->final_eval->accuracy);
  }
  EXPECT_EQ(DenseTables(config, cluster.shards()), DenseTables(config, local_shards));
  for (const auto& shard : local) {
    StatsResponse stats;
    shard->FillStats(&stats);
    if (local_pushes != nullptr) *local_pushes += stats.pushes();
  }
}

// One worker through the gRPC store, every third reply lost, and through the in-process
// store: the same steps, so bitwise the same parameters and test metrics.
void ExpectGrpcWithLostRepliesMatchesInProcess(const JobConfig& config, uint64_t steps, bool binary,
                                               bool shared = false) {
  Cluster cluster(config, /*lose_replies=*/true, shared);
  absl::StatusOr<worker::TrainResult> remote = Train(config, 0, "always", cluster.StoreFor(0));
  ASSERT_THAT(remote.status(), IsOk());
  EXPECT_EQ(remote->steps, steps);
  EXPECT_GT(cluster.lost(), 0);
  uint64_t pushes = 0, duplicates = 0;
  for (uint32_t s = 0; s < config.cluster().num_servers(); ++s) {
    pushes += cluster.Stats(s).pushes();
    duplicates += cluster.Stats(s).duplicate_pushes();
  }
  EXPECT_GT(duplicates, 0u) << "no lost reply was a push's";
  if (shared) {
    EXPECT_GT(cluster.shared_in(), 0u);
  } else {
    EXPECT_EQ(cluster.shared_in(), 0u);
  }

  uint64_t local_pushes = 0;
  ExpectLikeTheInProcessStore(config, *remote, cluster, binary, &local_pushes);
  EXPECT_EQ(pushes, local_pushes) << "a retried push was applied twice";
}

TEST(OverlappedSteps, GrpcWithLostRepliesMatchesTheInProcessStoreBitwise) {
  ExpectGrpcWithLostRepliesMatchesInProcess(Job(/*workers=*/1, std::nullopt), 80, true);
}

// The same through shared memory: a lost reply gives the segment up (the server may still
// write the abandoned attempt's answer), the retry goes by the socket, the store asks anew.
TEST(OverlappedSteps, GrpcOverSharedMemoryWithLostRepliesMatchesTheInProcessStoreBitwise) {
  ExpectGrpcWithLostRepliesMatchesInProcess(Job(/*workers=*/1, std::nullopt), 80, true,
                                            /*shared=*/true);
}

TEST(OverlappedSteps, MlpBufferSetsOverGrpcMatchTheInProcessStoreBitwise) {
  struct stat st;
  if (stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", &st) != 0) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  ExpectGrpcWithLostRepliesMatchesInProcess(Job(/*workers=*/1, std::nullopt, kMlpJob), 100,
                                            false);
}

// The MLP on one server with shared memory and lent push buffers, with prefetch's two buffer
// sets and without, on `device` (null: the CPU backend): 100 steps, the gradients of all but
// the steps before the first answer mapped the segment (at most two) pushed from lent memory,
// which the server reads where it lies; bitwise the in-process store's.
void ExpectLentMlpLikeTheInProcessStore(kernels::SeparateMemoryBackend* device) {
  for (bool prefetch : {true, false}) {
    SCOPED_TRACE(absl::StrCat("prefetch ", prefetch));
    JobConfig config = Job(/*workers=*/1, std::nullopt, kMlpJob);
    config.mutable_cluster()->set_num_servers(1);
    config.mutable_cluster()->clear_servers();
    config.mutable_cluster()->add_servers("in-process");
    config.mutable_training()->set_prefetch(prefetch);
    config.mutable_rpc()->set_lend_push_buffers(true);
    Cluster cluster(config, /*lose_replies=*/false, /*shared=*/true);
    const int copies = device != nullptr ? device->copies_to_registered : 0;
    const int async_copies = device != nullptr ? device->async_copies_to_device : 0;
    absl::StatusOr<worker::TrainResult> remote =
        Train(config, 0, "always", cluster.KeptStoreFor(0), device);
    ASSERT_THAT(remote.status(), IsOk());
    EXPECT_EQ(remote->steps, 100u);
    // The MLP's 784 x 64 + 64 + 64 x 10 + 10 floats a push.
    const uint64_t push_bytes = (784 * 64 + 64 + 64 * 10 + 10) * sizeof(float);
    EXPECT_GE(cluster.bytes_lent(), 98 * push_bytes);
    EXPECT_EQ(cluster.bytes_lent() % push_bytes, 0u);
    if (device != nullptr) {
      // Those steps' gradients reached the lent memory by the device's copy, one a step; the
      // job has unregistered the memory since.
      EXPECT_GE(device->copies_to_registered - copies, 98);
      EXPECT_TRUE(device->registered().empty());
      // Each step's parameters, features and labels went to the device without a wait, and
      // no source changed before the device had waited: not the set a prefetched pull fills
      // while the other computes, nor a batch read ahead. None was in flight at the end.
      EXPECT_GE(device->async_copies_to_device - async_copies, 3 * 100);
      EXPECT_EQ(device->async_sources_changed, 0);
      EXPECT_EQ(device->pending_async_copies(), 0u);
    }
    ExpectLikeTheInProcessStore(config, *remote, cluster, /*binary=*/false);
  }
}

bool HasFashionMnist() {
  struct stat st;
  return stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", &st) == 0;
}

// The CPU backend's GEMMs write the gradients straight into the lent memory.
TEST(OverlappedSteps, MlpLentGradientsOverSharedMemoryMatchTheInProcessStoreBitwise) {
  if (!HasFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  ExpectLentMlpLikeTheInProcessStore(nullptr);
}

// On a device with its own memory (as a GPU: a test backend whose copies are memcpy), the
// device copies the gradients straight into the lent memory, registered with the backend.
TEST(OverlappedSteps, MlpLentGradientsFromASeparateDeviceMatchTheInProcessStoreBitwise) {
  if (!HasFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  kernels::SeparateMemoryBackend device;
  ExpectLentMlpLikeTheInProcessStore(&device);
}

}  // namespace
}  // namespace ps
