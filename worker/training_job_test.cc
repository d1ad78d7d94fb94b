#include "worker/training_job.h"

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/config/config.h"
#include "common/status_macros.h"
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
    return fake_->Pull(b, o);
  }
  absl::Status Push(const common::PushBatch& b, const common::PushOptions& o) override {
    {
      absl::MutexLock lock(&mu_);
      ++pushes_;
    }
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
    pushes_before_last_report_ = pushes_;
    return saved_;
  }
  // Pushes so far, and before the latest position report.
  int pushes() {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  int pushes_before_last_report() {
    absl::MutexLock lock(&mu_);
    return pushes_before_last_report_;
  }
  int finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
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
  int pushes_ = 0;
  int pushes_before_last_report_ = 0;
  std::vector<std::pair<uint32_t, uint64_t>> reports_;
};

// Builds a job on a RememberingStore; `*store` points at it afterwards. `tweak` (may be
// empty) changes SmallCtrJob first.
absl::StatusOr<std::unique_ptr<TrainingJob>> MakeJob(
    const TrainingJobOptions& options, common::WorkerPosition saved, RememberingStore** store,
    const std::function<void(JobConfig*)>& tweak = nullptr) {
  JobConfig config = SmallCtrJob();
  if (tweak) {
    tweak(&config);
    RETURN_IF_ERROR(common::ValidateJobConfig(config));
  }
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

// With local SGD a step's update reaches the servers only at its period's merge: the position
// a restart resumes from is that of the last merged step, never past it (each local step's
// was reported before 2026-12-05, so a restart skipped up to k - 1 steps of data). At the end
// the unfinished period (steps 5 and 6) is merged, then its last step's position reported
// (before 2026-12-06 the last merge's was, and a restart trained steps 5 and 6 again).
TEST(TrainingJob, WithLocalSgdThePositionMovesOnlyAtMerges) {
  TrainingJobOptions options;
  options.centralized = true;
  options.position_interval = absl::ZeroDuration();  // every report that may go, goes
  RememberingStore* store = nullptr;
  auto job = MakeJob(options, {}, &store, [](JobConfig* c) {
    c->mutable_training()->mutable_local_sgd()->set_steps(4);
    c->mutable_training()->set_max_steps(6);  // steps 5 and 6 are merged only at the end
  });
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<TrainResult> result = (*job)->Run();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 6u);
  const auto reports = store->reports();
  ASSERT_FALSE(reports.empty());
  for (const auto& [epoch, offset] : reports) {
    EXPECT_TRUE(offset == 0 || offset == 400 || offset == 600)
        << "offset " << offset << " (100 a step)";
  }
  EXPECT_EQ(reports.back(), std::make_pair(0u, uint64_t{600}));
  EXPECT_EQ(store->pushes(), 2);  // the two merges, both before the last report
  EXPECT_EQ(store->pushes_before_last_report(), 2);
  EXPECT_EQ(store->finished(), 1);
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

// IDX bytes: images of 1 x 2 pixels, one label each.
std::string IdxImages(int n) {
  std::string b("\0\0\x08\x03", 4);
  for (uint32_t v : {static_cast<uint32_t>(n), 1u, 2u}) {
    for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<char>(v >> shift));
  }
  return b + std::string(2 * n, '\x10');
}
std::string IdxLabels(const std::vector<uint8_t>& labels) {
  std::string b("\0\0\x08\x01", 4);
  for (int shift = 24; shift >= 0; shift -= 8) {
    b.push_back(static_cast<char>(labels.size() >> shift));
  }
  for (uint8_t l : labels) b.push_back(static_cast<char>(l));
  return b;
}

// Labels beyond the model's classes are refused when the job is made, before any step (they
// failed only when their example was drawn before 2026-12-05).
TEST(TrainingJob, RefusesLabelsBeyondTheModelsClasses) {
  const std::string dir = ::testing::TempDir();
  std::ofstream(dir + "/images.idx") << IdxImages(2);
  std::ofstream(dir + "/labels.idx") << IdxLabels({3, 11});
  JobConfig config;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        name: "labels-test"
        cluster { num_servers: 1 num_workers: 1 }
        model { mlp { input_dim: 2 num_classes: 10 } }
        default_optimizer { kind: SGD learning_rate: 0.1 }
        data { format: IDX }
        training { batch_size: 2 epochs: 1 device: "cpu" }
        security { plaintext: true }
      )pb",
      &config));
  config.mutable_data()->set_train_images(dir + "/images.idx");
  config.mutable_data()->set_train_labels(dir + "/labels.idx");
  ASSERT_TRUE(common::ExpandModelTables(&config).ok());
  ASSERT_TRUE(common::ValidateJobConfig(config).ok());
  bool store_made = false;
  auto job = TrainingJob::Create(
      config, TrainingJobOptions{},
      [&](const JobConfig& c,
          common::metrics::Registry*) -> absl::StatusOr<std::unique_ptr<common::ParameterStore>> {
        store_made = true;
        const std::vector<TableConfig> tables(c.tables().begin(), c.tables().end());
        auto fake = FakeParameterStore::ForTables(tables);
        if (!fake.ok()) return fake.status();
        return std::unique_ptr<common::ParameterStore>(std::move(*fake));
      });
  EXPECT_THAT(job.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(::testing::HasSubstr("up to 11"),
                                        ::testing::HasSubstr("model.mlp.num_classes"))));
  EXPECT_FALSE(store_made);
}

TEST(TrainingJob, RefusesAnUnknownEvalMode) {
  TrainingJobOptions options;
  options.eval = "sometimes";
  RememberingStore* store = nullptr;
  EXPECT_THAT(MakeJob(options, {}, &store).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("--eval")));
}

}  // namespace
}  // namespace ps::worker
