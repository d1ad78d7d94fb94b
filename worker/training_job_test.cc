#include "worker/training_job.h"

#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/config/config.h"
#include "common/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "worker/models/fake_parameter_store.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;

// 2000 synthetic CTR examples, one epoch of 20 steps of 100.
JobConfig SmallCtrJob() {
  JobConfig config;
  CHECK(google::protobuf::TextFormat::ParseFromString(R"pb(
    name: "training-job-test"
    cluster { num_servers: 1 num_workers: 1 }
    model { ctr { embedding_table: "ctr/embedding" embedding_dim: 4 combiner: SUM } }
    default_optimizer { kind: SGD learning_rate: 0.1 }
    data {
      format: SYNTHETIC_CTR
      shuffle: false
      synthetic {
        num_train: 2000 num_test: 200 num_fields: 4 vocabulary_per_field: 50
        zipf_exponent: 1.1 weight_stddev: 1.0 seed: 3
      }
    }
    training { batch_size: 100 epochs: 1 device: "cpu" seed: 1 }
    security { plaintext: true }
  )pb", &config));
  CHECK(common::ExpandModelTables(&config).ok());
  CHECK(common::ValidateJobConfig(config).ok());
  return config;
}

// A FakeParameterStore that remembers a worker position, as the servers would for a worker
// that restarts, and records the positions reported to it.
class RememberingStore final : public common::ParameterStore {
 public:
  RememberingStore(std::unique_ptr<FakeParameterStore> fake, common::WorkerPosition saved)
      : fake_(std::move(fake)), saved_(saved) {}
  absl::Status Pull(const common::PullBatch& b, const common::PullOptions& o) override {
    {
      absl::MutexLock lock(&mu_);
      pull_threads_.insert(std::this_thread::get_id());
    }
    return fake_->Pull(b, o);
  }
  absl::Status Push(const common::PushBatch& b, const common::PushOptions& o) override {
    return fake_->Push(b, o);
  }
  absl::Status Finish() override {
    absl::MutexLock lock(&mu_);
    ++finished_;
    return absl::OkStatus();
  }
  absl::StatusOr<common::WorkerPosition> ReportPosition(uint32_t epoch,
                                                        uint64_t offset) override {
    absl::MutexLock lock(&mu_);
    reports_.push_back({epoch, offset});
    return saved_;
  }
  int finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  // The threads that have pulled.
  std::set<std::thread::id> pull_threads() {
    absl::MutexLock lock(&mu_);
    return pull_threads_;
  }
  std::vector<std::pair<uint32_t, uint64_t>> reports() {
    absl::MutexLock lock(&mu_);
    return reports_;
  }

 private:
  std::unique_ptr<FakeParameterStore> fake_;
  const common::WorkerPosition saved_;
  absl::Mutex mu_;
  int finished_ = 0;
  std::vector<std::pair<uint32_t, uint64_t>> reports_;
  std::set<std::thread::id> pull_threads_;
};

// Builds a job on a RememberingStore; `*store` points at it afterwards.
absl::StatusOr<std::unique_ptr<TrainingJob>> MakeJob(const TrainingJobOptions& options,
                                                     common::WorkerPosition saved,
                                                     RememberingStore** store) {
  const JobConfig config = SmallCtrJob();
  return TrainingJob::Create(
      config, options,
      [&](const JobConfig& c, common::metrics::Registry*)
          -> absl::StatusOr<std::unique_ptr<common::ParameterStore>> {
        const std::vector<TableConfig> tables(c.tables().begin(), c.tables().end());
        auto fake = FakeParameterStore::ForTables(tables);
        if (!fake.ok()) return fake.status();
        auto s = std::make_unique<RememberingStore>(std::move(*fake), saved);
        *store = s.get();
        return std::unique_ptr<common::ParameterStore>(std::move(s));
      });
}

TEST(TrainingJob, TrainsAnEpochAndFinishesWithTheStore) {
  TrainingJobOptions options;
  options.centralized = true;
  RememberingStore* store = nullptr;
  auto job = MakeJob(options, {}, &store);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<TrainResult> result = (*job)->Run();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 20u);
  ASSERT_TRUE(result->final_eval.has_value());
  EXPECT_EQ(store->finished(), 1);
  ASSERT_FALSE(store->reports().empty());
  EXPECT_EQ(store->reports().front(), std::make_pair(0u, uint64_t{0}));
  EXPECT_THAT((*job)->FinalReport(*result), ::testing::HasSubstr("final test auc"));
}

TEST(TrainingJob, ResumesWhereTheStoreSawTheWorkerLast) {
  TrainingJobOptions options;
  options.centralized = true;
  RememberingStore* store = nullptr;
  common::WorkerPosition saved;
  saved.offset = 1500;  // 15 of the epoch's 20 batches are done
  saved.clock = 15;
  auto job = MakeJob(options, saved, &store);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<TrainResult> result = (*job)->Run();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 5u);
}

TEST(TrainingJob, RefusesAWorkerIndexOutsideTheJob) {
  TrainingJobOptions options;
  options.worker_index = 1;  // the job has one worker
  RememberingStore* store = nullptr;
  EXPECT_THAT(MakeJob(options, {}, &store).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("out of range")));
  EXPECT_EQ(store, nullptr);  // refused before any store was made
}

TEST(TrainingJob, RefusesAnUnknownEvalMode) {
  TrainingJobOptions options;
  options.eval = "sometimes";
  RememberingStore* store = nullptr;
  EXPECT_THAT(MakeJob(options, {}, &store).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("--eval")));
}

TrainingConfig Training(const std::string& text) {
  TrainingConfig training;
  CHECK(google::protobuf::TextFormat::ParseFromString(text, &training));
  return training;
}

TEST(PrefetchSteps, UnsetIsOnOnlyForDistributedAsyncJobsWithoutLocalSgd) {
  EXPECT_TRUE(PrefetchSteps(Training(""), /*centralized=*/false));
  EXPECT_FALSE(PrefetchSteps(Training(""), /*centralized=*/true));
  EXPECT_FALSE(PrefetchSteps(Training("staleness: 2"), false));
  EXPECT_FALSE(PrefetchSteps(Training("staleness: 0"), false));
  EXPECT_FALSE(PrefetchSteps(Training("staleness: 0 deterministic: true"), false));
  EXPECT_FALSE(PrefetchSteps(Training("local_sgd { steps: 4 }"), false));
}

TEST(PrefetchSteps, ASetValueIsKeptEverywhere) {
  EXPECT_FALSE(PrefetchSteps(Training("prefetch: false"), false));
  EXPECT_TRUE(PrefetchSteps(Training("prefetch: true"), true));
  EXPECT_TRUE(PrefetchSteps(Training("prefetch: true staleness: 2"), false));
}

// A distributed asynchronous job without training.prefetch overlaps its steps: its training
// pulls run on the trainer's background thread. A centralized one pulls on its own thread.
TEST(TrainingJob, DistributedAsyncJobOverlapsStepsByDefault) {
  for (const bool centralized : {false, true}) {
    TrainingJobOptions options;  // worker 0; the config leaves prefetch unset
    options.centralized = centralized;
    RememberingStore* store = nullptr;
    auto job = MakeJob(options, {}, &store);
    ASSERT_TRUE(job.ok()) << job.status();
    absl::StatusOr<TrainResult> result = (*job)->Run();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->steps, 20u);
    const std::set<std::thread::id> threads = store->pull_threads();
    if (centralized) {
      EXPECT_EQ(threads.size(), 1u);
    } else {
      EXPECT_GE(threads.size(), 2u);  // the background thread's and evaluation's
    }
    EXPECT_EQ(threads.count(std::this_thread::get_id()), 1u);  // evaluation pulls here
  }
}

}  // namespace
}  // namespace ps::worker
