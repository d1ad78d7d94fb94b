// Trainer with and without overlapped steps (prefetch), against an in-memory store.
#include "worker/trainer.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/config/config.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "proto/config.pb.h"
#include "worker/data/in_memory_dataset.h"
#include "worker/data/load.h"
#include "worker/models/fake_parameter_store.h"
#include "worker/models/model_factory.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::HasSubstr;

// A small synthetic CTR job: 16k training examples, batch 64, 2 epochs.
constexpr char kJob[] = R"pb(
  name: "trainer-test"
  cluster { num_servers: 1 num_workers: 1 }
  model { ctr { embedding_table: "emb" embedding_dim: 4 combiner: SUM } }
  data {
    format: SYNTHETIC_CTR
    synthetic {
      num_train: 16000 num_test: 4000 num_fields: 6 vocabulary_per_field: 200
      zipf_exponent: 1.1 weight_stddev: 1.0 seed: 7
    }
  }
  training { batch_size: 64 epochs: 2 device: "cpu" seed: 1 }
  security { plaintext: true }
)pb";

// Wraps a store: records the order of calls (pull clock, push clock; the push and the pull
// of a fused PushPull as two calls marked `fused`, the push first), a fingerprint of each
// push's values, and fails the n-th pull or push when asked to.
class RecordingStore final : public common::ParameterStore {
 public:
  struct Call {
    bool push;
    int64_t clock;
    bool fused = false;
    uint64_t fingerprint = 0;  // pushes: FNV-1a over the bits of every value pushed
    const float* first_values = nullptr;  // pushes: where the first table's values were
  };
  explicit RecordingStore(common::ParameterStore* inner) : inner_(inner) {}
  void FailPushNumber(int n) { fail_push_ = n; }
  void FailPullNumber(int n) { fail_pull_ = n; }

  absl::Status Pull(const common::PullBatch& batch, const common::PullOptions& options) override {
    RETURN_IF_ERROR(RecordPull(options, false));
    return inner_->Pull(batch, options);
  }
  absl::Status Push(const common::PushBatch& batch, const common::PushOptions& options) override {
    RETURN_IF_ERROR(RecordPush(batch, options, false));
    return inner_->Push(batch, options);
  }
  absl::Status PushPull(const common::PushBatch& push, const common::PushOptions& push_options,
                        const common::PullBatch& pull,
                        const common::PullOptions& pull_options) override {
    RETURN_IF_ERROR(RecordPush(push, push_options, true));
    RETURN_IF_ERROR(RecordPull(pull_options, true));
    return inner_->PushPull(push, push_options, pull, pull_options);
  }
  absl::Status Finish() override { return inner_->Finish(); }

  std::vector<Call> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  static uint64_t Fingerprint(const common::PushBatch& batch) {
    uint64_t h = 1469598103934665603ull;
    auto add = [&h](absl::Span<const float> values) {
      for (float v : values) {
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof(bits));
        h = (h ^ bits) * 1099511628211ull;
      }
    };
    for (const common::DensePush& p : batch.dense) add(p.values);
    for (const common::SparsePush& p : batch.sparse) add(p.values);
    return h;
  }
  absl::Status RecordPull(const common::PullOptions& options, bool fused) {
    absl::MutexLock lock(&mu_);
    calls_.push_back({false, options.clock, fused});
    if (++pulls_ == fail_pull_) return absl::UnavailableError("pull refused by the test");
    return absl::OkStatus();
  }
  absl::Status RecordPush(const common::PushBatch& batch, const common::PushOptions& options,
                          bool fused) {
    absl::MutexLock lock(&mu_);
    const float* first = !batch.dense.empty()    ? batch.dense[0].values.data()
                         : !batch.sparse.empty() ? batch.sparse[0].values.data()
                                                 : nullptr;
    calls_.push_back({true, options.clock, fused, Fingerprint(batch), first});
    if (++pushes_ == fail_push_) return absl::UnavailableError("push refused by the test");
    return absl::OkStatus();
  }

  common::ParameterStore* const inner_;
  mutable absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  int pulls_ ABSL_GUARDED_BY(mu_) = 0;
  int pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_push_ = -1;
  int fail_pull_ = -1;
};

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<JobConfig> config = common::ParseJobConfigText(kJob, "job");
    ASSERT_OK(config.status());
    config_ = *std::move(config);
    ASSERT_OK(common::ExpandModelTables(&config_));
    absl::StatusOr<LoadedData> data = LoadData(config_.data(), config_.training());
    ASSERT_OK(data.status());
    data_ = *std::move(data);
    absl::StatusOr<std::unique_ptr<kernels::Backend>> backend =
        kernels::CreateBackend("cpu", kernels::BackendOptions());
    ASSERT_OK(backend.status());
    backend_ = *std::move(backend);
  }

  // A fresh model and store (plain SGD) and a trainer run over them.
  absl::StatusOr<TrainResult> Train(bool prefetch, uint64_t max_steps = 0,
                                    RecordingStore** recorder = nullptr,
                                    int fail_push = -1, int fail_pull = -1,
                                    float learning_rate = 0.05f) {
    const std::vector<TableConfig> tables(config_.tables().begin(), config_.tables().end());
    absl::StatusOr<std::unique_ptr<FakeParameterStore>> fake = FakeParameterStore::ForTables(tables);
    if (!fake.ok()) return fake.status();
    fake_ = *std::move(fake);
    fake_->set_learning_rate(learning_rate);
    store_ = std::make_unique<RecordingStore>(fake_.get());
    store_->FailPushNumber(fail_push);
    store_->FailPullNumber(fail_pull);
    if (recorder != nullptr) *recorder = store_.get();
    absl::StatusOr<std::unique_ptr<Model>> model =
        CreateModel(config_, backend_.get(), config_.training().batch_size());
    if (!model.ok()) return model.status();
    model_ = *std::move(model);
    TrainerOptions options;
    options.batch_size = config_.training().batch_size();
    options.epochs = config_.training().epochs();
    options.max_steps = max_steps;
    options.seed = 1;
    options.binary = binary_;
    options.progress = nullptr;
    options.prefetch = prefetch;
    if (adjust_) adjust_(&options);
    Trainer trainer(model_.get(), store_.get(), data_.train.get(), data_.test.get(), options);
    return trainer.Run();
  }

  bool binary_ = true;  // the CTR job; the MLP fixture below is not
  // Changes the options of the next Train calls (e.g. a resume position).
  std::function<void(TrainerOptions*)> adjust_;
  JobConfig config_;
  LoadedData data_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<FakeParameterStore> fake_;
  std::unique_ptr<RecordingStore> store_;
  std::unique_ptr<Model> model_;
};

TEST_F(TrainerTest, PrefetchTrainsToTheSameAucRange) {
  absl::StatusOr<TrainResult> plain = Train(/*prefetch=*/false);
  ASSERT_OK(plain.status());
  absl::StatusOr<TrainResult> overlapped = Train(/*prefetch=*/true);
  ASSERT_OK(overlapped.status());
  ASSERT_TRUE(plain->final_eval.has_value());
  ASSERT_TRUE(overlapped->final_eval.has_value());
  EXPECT_EQ(plain->steps, overlapped->steps);
  EXPECT_EQ(plain->samples, overlapped->samples);
  // Learning happened, and one step of extra staleness costs (almost) nothing.
  EXPECT_GT(plain->final_eval->auc, 0.75);
  EXPECT_NEAR(overlapped->final_eval->auc, plain->final_eval->auc, 0.01);
  EXPECT_EQ(plain->breakdown.wait, absl::ZeroDuration());
  EXPECT_EQ(fake_->num_pushes(), static_cast<int64_t>(overlapped->steps));
}

// Each pull of clock c (for step c+1) sees this worker's pushes up to clock c-1 at least:
// at most one step more staleness than without prefetch, and pushes keep their order.
TEST_F(TrainerTest, PrefetchedPullIsAtMostOneStepBehindOwnPushes) {
  RecordingStore* recorder = nullptr;
  absl::StatusOr<TrainResult> result = Train(/*prefetch=*/true, 0, &recorder);
  ASSERT_OK(result.status());
  int64_t pushes = 0;
  int64_t ahead = 0;  // pulls issued before the previous step's push
  for (const RecordingStore::Call& call : recorder->calls()) {
    if (call.push) {
      EXPECT_EQ(call.clock, pushes + 1) << "pushes out of order";
      ++pushes;
      continue;
    }
    if (call.clock > static_cast<int64_t>(result->steps)) continue;  // evaluation pulls
    EXPECT_GE(pushes, call.clock - 1) << "pull of clock " << call.clock;
    EXPECT_LE(pushes, call.clock) << "pull of clock " << call.clock;
    if (pushes == call.clock - 1) ++ahead;
  }
  EXPECT_EQ(pushes, static_cast<int64_t>(result->steps));
  // All but the first pull of each epoch overlap the previous step.
  EXPECT_EQ(ahead, static_cast<int64_t>(result->steps) - 2);
}

// With prefetch a step makes one store call: a fused PushPull of the previous step's
// gradients (clock c - 1) and the next step's parameters (clock c), as without prefetch the
// pull of step c + 1 carries clock c. Only the ends of an epoch differ: its first two steps
// pull alone, its last step pushes the step before it and then its own gradients alone.
TEST_F(TrainerTest, PrefetchMakesOneFusedCallPerStep) {
  RecordingStore* recorder = nullptr;
  absl::StatusOr<TrainResult> result = Train(/*prefetch=*/true, 0, &recorder);
  ASSERT_OK(result.status());
  ASSERT_EQ(result->steps, 500u);  // 2 epochs of 250
  int64_t fused = 0, pulls = 0, pushes = 0;
  const std::vector<RecordingStore::Call> calls = recorder->calls();
  for (size_t i = 0; i < calls.size(); ++i) {
    const RecordingStore::Call& call = calls[i];
    if (!call.fused) {
      ++(call.push ? pushes : pulls);
      continue;
    }
    ASSERT_TRUE(call.push) << "a fused call starts with its push";
    ASSERT_LT(i + 1, calls.size());
    EXPECT_FALSE(calls[i + 1].push);
    EXPECT_TRUE(calls[i + 1].fused);
    EXPECT_EQ(calls[i + 1].clock, call.clock + 1) << "pull of the fused call at push " << call.clock;
    ++fused;
    ++i;
  }
  // Evaluation after each epoch pulls once per test batch.
  const int64_t eval_pulls = (data_.test->size() + 63) / 64;
  EXPECT_EQ(fused, 500 - 2 * 2);
  EXPECT_EQ(pulls, 2 * 2 + 2 * eval_pulls);
  EXPECT_EQ(pushes, 2 * 2);
}

// With a learning rate of 0 the parameters never change, so staleness cannot matter: the
// overlapped steps must compute and push exactly what plain steps do, step for step (each
// step given the parameters pulled for its own batch, each gradient pushed once, in order).
TEST_F(TrainerTest, PrefetchPushesTheSameGradientsAsPlainStepsWhenParametersStayPut) {
  RecordingStore* recorder = nullptr;
  absl::StatusOr<TrainResult> plain = Train(/*prefetch=*/false, 0, &recorder, -1, -1, 0.0f);
  ASSERT_OK(plain.status());
  auto pushed = [](const std::vector<RecordingStore::Call>& calls) {
    std::vector<std::pair<int64_t, uint64_t>> out;
    for (const RecordingStore::Call& c : calls) {
      if (c.push) out.emplace_back(c.clock, c.fingerprint);
    }
    return out;
  };
  const std::vector<std::pair<int64_t, uint64_t>> expected = pushed(recorder->calls());
  absl::StatusOr<TrainResult> overlapped = Train(/*prefetch=*/true, 0, &recorder, -1, -1, 0.0f);
  ASSERT_OK(overlapped.status());
  ASSERT_EQ(expected.size(), 500u);
  EXPECT_EQ(pushed(recorder->calls()), expected);
  ASSERT_TRUE(plain->final_eval.has_value() && overlapped->final_eval.has_value());
  EXPECT_EQ(overlapped->final_eval->loss, plain->final_eval->loss);
}

// The breakdown: without prefetch every call blocks the step (calls == exposed == pull +
// push); with prefetch the calls run in the background, and exposed is what the steps spent
// staging and waiting.
// Plain steps of a model whose next pull may change its gradients (the CTR model's sparse
// rows) send a copy of them, never the model's own buffers.
TEST_F(TrainerTest, PlainStepsPushACopyOfGradientsTheNextPullMayChange) {
  adjust_ = [](TrainerOptions* o) { o->evaluate = false; };  // keeps the last gradients
  RecordingStore* recorder = nullptr;
  ASSERT_OK(Train(/*prefetch=*/false, 20, &recorder).status());
  ASSERT_FALSE(model_->PushSurvivesNextPull());
  common::PushBatch own;
  ASSERT_OK(model_->PreparePush(&own));
  int fused = 0;
  for (const RecordingStore::Call& c : recorder->calls()) {
    if (!c.push || !c.fused) continue;
    ++fused;
    for (const common::DensePush& p : own.dense) EXPECT_NE(c.first_values, p.values.data());
    for (const common::SparsePush& p : own.sparse) EXPECT_NE(c.first_values, p.values.data());
  }
  EXPECT_EQ(fused, 19);
}

TEST_F(TrainerTest, CommunicationTimesAddUp) {
  absl::StatusOr<TrainResult> plain = Train(/*prefetch=*/false, /*max_steps=*/50);
  ASSERT_OK(plain.status());
  const StepBreakdown& p = plain->breakdown;
  EXPECT_EQ(p.calls, p.pull + p.push);
  EXPECT_EQ(p.exposed(), p.calls);
  EXPECT_GT(p.calls, absl::ZeroDuration());
  absl::StatusOr<TrainResult> overlapped = Train(/*prefetch=*/true, /*max_steps=*/50);
  ASSERT_OK(overlapped.status());
  const StepBreakdown& o = overlapped->breakdown;
  EXPECT_EQ(o.exposed(), o.pull + o.push + o.wait);
  EXPECT_GT(o.calls, absl::ZeroDuration());
}

// A restarted worker resumes at its position and clock with prefetch as without: the first
// pull carries the saved clock, the pushes go on from the next clock, each once, in order.
TEST_F(TrainerTest, PrefetchResumesAtTheSavedPositionAndClock) {
  adjust_ = [](TrainerOptions* options) {
    options->epochs = 1;
    options->start_offset = 200 * 64;  // 200 of the epoch's 250 steps are done
    options->start_clock = 200;
  };
  RecordingStore* recorder = nullptr;
  absl::StatusOr<TrainResult> result = Train(/*prefetch=*/true, 0, &recorder);
  ASSERT_OK(result.status());
  EXPECT_EQ(result->steps, 50u);
  const std::vector<RecordingStore::Call> calls = recorder->calls();
  ASSERT_FALSE(calls.empty());
  EXPECT_FALSE(calls.front().push);
  EXPECT_EQ(calls.front().clock, 200);
  int64_t next_push = 201;
  for (const RecordingStore::Call& call : calls) {
    if (call.push) {
      EXPECT_EQ(call.clock, next_push++);
    }
  }
  EXPECT_EQ(next_push, 251);
}

// max_steps counts a worker's steps before its restart too (its clock): resumed at clock 8
// with max_steps 10, it takes 2 steps, with prefetch and without (it took 10 more before
// 2026-12-05).
TEST_F(TrainerTest, MaxStepsCountsTheStepsBeforeARestart) {
  // Resumed at `clock` with max_steps 10, with prefetch and without: the steps taken, and the
  // clock of the last push (0: none).
  auto resumed_at = [this](int64_t clock) {
    adjust_ = [clock](TrainerOptions* options) {
      options->epochs = 1;
      options->start_offset = clock * 64;
      options->start_clock = clock;
      options->evaluate = false;
    };
    std::vector<std::pair<uint64_t, int64_t>> out;
    for (bool prefetch : {false, true}) {
      RecordingStore* recorder = nullptr;
      absl::StatusOr<TrainResult> result = Train(prefetch, /*max_steps=*/10, &recorder);
      EXPECT_OK(result.status());
      int64_t last_push = 0;
      for (const RecordingStore::Call& call : recorder->calls()) {
        if (call.push) last_push = call.clock;
      }
      out.emplace_back(result.ok() ? result->steps : ~uint64_t{0}, last_push);
      if (clock >= 10) EXPECT_TRUE(recorder->calls().empty()) << "prefetch " << prefetch;
    }
    return out;
  };
  using Runs = std::vector<std::pair<uint64_t, int64_t>>;
  EXPECT_EQ(resumed_at(8), (Runs{{2, 10}, {2, 10}}));
  // Resumed at its last step (it died after its last push, or a finished job's pods were
  // restarted): no step, no call, whether or not it prefetches.
  EXPECT_EQ(resumed_at(10), (Runs{{0, 0}, {0, 0}}));
}

// With prefetch a step's push is queued as the next step computes: the data position
// reported after a step is that of the latest step whose push was applied, never one whose
// push then failed (found in review, 2026-12-06: step i's own was reported, so a push that
// failed after it, e.g. with retries ended by SIGTERM, left the servers' position past steps
// never applied, and a restart skipped them). The 5th push fails: at most 4 steps' data, 256
// examples, are reported; without prefetch as well.
TEST_F(TrainerTest, APositionIsReportedOnlyOnceItsStepsPushIsApplied) {
  for (bool prefetch : {false, true}) {
    std::vector<uint64_t> reported;
    adjust_ = [&reported](TrainerOptions* options) {
      options->epochs = 1;
      options->evaluate = false;
      options->on_step = [&reported](uint32_t, uint64_t offset) { reported.push_back(offset); };
    };
    EXPECT_FALSE(Train(prefetch, /*max_steps=*/0, nullptr, /*fail_push=*/5).ok());
    ASSERT_FALSE(reported.empty()) << "prefetch " << prefetch;
    EXPECT_LE(*std::max_element(reported.begin(), reported.end()), 4u * 64)
        << "prefetch " << prefetch;
  }
}

// A restarted worker's position comes from the servers: one past what the job can reach (an
// epoch past its last, a clock beyond its steps or negative) fails the run before any call.
// Before, it trained nothing and exited 0, or overflowed the clock.
TEST_F(TrainerTest, AStartPositionPastTheJobFailsTheRun) {
  struct Start {
    uint32_t epoch;
    int64_t clock;
  };
  for (const Start start : {Start{5, 0}, Start{0, -1}, Start{0, 1000000},
                            Start{0, std::numeric_limits<int64_t>::max()}}) {
    adjust_ = [start](TrainerOptions* options) {
      options->epochs = 1;
      options->start_epoch = start.epoch;
      options->start_clock = start.clock;
    };
    RecordingStore* recorder = nullptr;
    EXPECT_THAT(Train(/*prefetch=*/false, /*max_steps=*/5, &recorder).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("past what this job")))
        << start.epoch << " " << start.clock;
    EXPECT_TRUE(recorder->calls().empty());
  }
}

// A log path that cannot be opened fails the run before any step (it trained without its
// records before 2026-12-05).
TEST_F(TrainerTest, ALogThatCannotBeOpenedFailsTheRun) {
  adjust_ = [](TrainerOptions* options) { options->log_path = "/nonexistent-dir/train.jsonl"; };
  RecordingStore* recorder = nullptr;
  EXPECT_THAT(Train(/*prefetch=*/false, /*max_steps=*/5, &recorder).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("training.log_path")));
  EXPECT_TRUE(recorder->calls().empty());
}

TEST_F(TrainerTest, PrefetchStopsAtMaxStepsWithoutExtraCalls) {
  RecordingStore* recorder = nullptr;
  absl::StatusOr<TrainResult> result = Train(/*prefetch=*/true, /*max_steps=*/10, &recorder);
  ASSERT_OK(result.status());
  EXPECT_EQ(result->steps, 10u);
  int64_t pulls = 0, pushes = 0;
  for (const RecordingStore::Call& call : recorder->calls()) {
    if (call.push) ++pushes;
    if (!call.push && call.clock < 10) ++pulls;  // evaluation pulls carry clock 10
  }
  EXPECT_EQ(pulls, 10);
  EXPECT_EQ(pushes, 10);
}

TEST_F(TrainerTest, BackgroundPushErrorFailsTheRun) {
  RecordingStore* recorder = nullptr;
  absl::StatusOr<TrainResult> result =
      Train(/*prefetch=*/true, 0, &recorder, /*fail_push=*/5);
  EXPECT_THAT(result.status(), StatusIs(absl::StatusCode::kUnavailable,
                                        HasSubstr("step 5 push + step 7 pull: push refused by the test")));
  // Nothing queued behind the failed push ran.
  int64_t after = -1;
  for (const RecordingStore::Call& call : recorder->calls()) {
    if (after >= 0) ++after;
    if (call.push && call.clock == 5) after = 0;
  }
  EXPECT_EQ(after, 0);
}

TEST_F(TrainerTest, BackgroundPullErrorFailsTheRun) {
  absl::StatusOr<TrainResult> result =
      Train(/*prefetch=*/true, 0, nullptr, /*fail_push=*/-1, /*fail_pull=*/7);
  EXPECT_THAT(result.status(), StatusIs(absl::StatusCode::kUnavailable,
                                        HasSubstr("step 7 pull: pull refused by the test")));
}

TEST_F(TrainerTest, ErrorOnTheLastStepOfAnEpochSurfacesAtTheDrain) {
  // 16000 / 64 = 250 steps per epoch: push 250 is the last of epoch 1.
  absl::StatusOr<TrainResult> result = Train(/*prefetch=*/true, 0, nullptr, /*fail_push=*/250);
  EXPECT_THAT(result.status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("step 250 push")));
}

// The MLP (dense only) has two buffer sets: with prefetch the store fills one set while the
// model computes on the other, no staging copies. 1600 examples of 8 features in 3 classes
// (deterministic pseudo-random), batch 64: 25 steps per epoch, 2 epochs.
constexpr char kMlpJob[] = R"pb(
  name: "trainer-test-mlp"
  cluster { num_servers: 1 num_workers: 1 }
  model { mlp { input_dim: 8 hidden: [16] num_classes: 3 activation: RELU } }
  data { format: IDX }
  training { batch_size: 64 epochs: 2 device: "cpu" seed: 1 }
  security { plaintext: true }
)pb";

std::unique_ptr<Dataset> MlpData(int64_t n, uint32_t seed) {
  std::vector<float> features(n * 8);
  std::vector<int32_t> labels(n);
  uint32_t x = seed;
  auto next = [&x] { return x = x * 1664525u + 1013904223u; };
  for (int64_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int j = 0; j < 8; ++j) {
      features[i * 8 + j] = static_cast<float>(next() >> 8) / (1 << 24) - 0.5f;
      sum += features[i * 8 + j] * (j + 1);
    }
    labels[i] = sum < -0.5f ? 0 : sum < 0.5f ? 1 : 2;
  }
  return std::make_unique<DenseDataset>(8, 3, std::move(features), std::move(labels));
}

class MlpTrainerTest : public TrainerTest {
 protected:
  void SetUp() override {
    absl::StatusOr<JobConfig> config = common::ParseJobConfigText(kMlpJob, "job");
    ASSERT_OK(config.status());
    config_ = *std::move(config);
    ASSERT_OK(common::ExpandModelTables(&config_));
    data_.train = MlpData(1600, 1);
    data_.test = MlpData(400, 2);
    absl::StatusOr<std::unique_ptr<kernels::Backend>> backend =
        kernels::CreateBackend("cpu", kernels::BackendOptions());
    ASSERT_OK(backend.status());
    backend_ = *std::move(backend);
    binary_ = false;
  }
};

TEST_F(MlpTrainerTest, PrefetchWithBufferSetsPushesWhatPlainStepsPushWhenParametersStayPut) {
  RecordingStore* recorder = nullptr;
  absl::StatusOr<TrainResult> plain = Train(/*prefetch=*/false, 0, &recorder, -1, -1, 0.0f);
  ASSERT_OK(plain.status());
  std::vector<std::pair<int64_t, uint64_t>> expected;
  for (const RecordingStore::Call& c : recorder->calls()) {
    if (c.push) expected.emplace_back(c.clock, c.fingerprint);
  }
  absl::StatusOr<TrainResult> overlapped = Train(/*prefetch=*/true, 0, &recorder, -1, -1, 0.0f);
  ASSERT_OK(overlapped.status());
  std::vector<std::pair<int64_t, uint64_t>> got;
  for (const RecordingStore::Call& c : recorder->calls()) {
    if (c.push) got.emplace_back(c.clock, c.fingerprint);
  }
  ASSERT_EQ(expected.size(), 50u);
  EXPECT_EQ(got, expected);
  ASSERT_TRUE(plain->final_eval.has_value() && overlapped->final_eval.has_value());
  EXPECT_EQ(overlapped->final_eval->loss, plain->final_eval->loss);
}

// Plain steps of the MLP (its pulls leave the gradients alone) push the gradients from the
// buffers the backward pass wrote, without copying them; that they are the same values as
// steps that copy them is checked above (prefetch with buffer sets).
TEST_F(MlpTrainerTest, PlainStepsPushTheModelsGradientBuffersWithoutCopying) {
  adjust_ = [](TrainerOptions* o) { o->evaluate = false; };
  RecordingStore* recorder = nullptr;
  ASSERT_OK(Train(/*prefetch=*/false, 0, &recorder).status());
  ASSERT_TRUE(model_->PushSurvivesNextPull());
  common::PushBatch own;
  ASSERT_OK(model_->PreparePush(&own));
  ASSERT_FALSE(own.dense.empty());
  int pushes = 0;
  for (const RecordingStore::Call& c : recorder->calls()) {
    if (!c.push) continue;
    ++pushes;
    EXPECT_EQ(c.first_values, own.dense[0].values.data()) << "push at clock " << c.clock;
  }
  EXPECT_EQ(pushes, 50);
}

// An evaluation of a model of dense tables pulls them once for the whole test set (7 batches
// here), so that every batch is scored with the same parameters; it pulled once per batch
// before 2026-12-05, and under async or SSP other workers' pushes landed in between.
TEST_F(MlpTrainerTest, AnEvaluationPullsTheDenseTablesOnce) {
  RecordingStore* recorder = nullptr;
  absl::StatusOr<TrainResult> result = Train(/*prefetch=*/false, 0, &recorder);
  ASSERT_OK(result.status());
  ASSERT_TRUE(result->final_eval.has_value());
  EXPECT_EQ(result->final_eval->examples, 400);
  EXPECT_GT(result->final_eval->accuracy, 0.6);
  int64_t plain_pulls = 0;
  for (const RecordingStore::Call& c : recorder->calls()) {
    if (!c.push && !c.fused) ++plain_pulls;
  }
  // Each epoch's first step pulls alone (the others' pulls ride on the pushes), and each of
  // the 2 evaluations (one per epoch) pulls once.
  EXPECT_EQ(plain_pulls, 2 + 2);
}

// With learning, each step's parameters are those of a pull that saw every push of this
// worker but the last one: the model learns as well as without prefetch, and the buffer set
// a step computes on is never the one being filled (a mix-up would break the fused-call count
// or the pushes' order, or fail to learn).
TEST_F(MlpTrainerTest, PrefetchWithBufferSetsLearnsAndFusesEachStep) {
  absl::StatusOr<TrainResult> plain = Train(/*prefetch=*/false);
  ASSERT_OK(plain.status());
  RecordingStore* recorder = nullptr;
  absl::StatusOr<TrainResult> overlapped = Train(/*prefetch=*/true, 0, &recorder);
  ASSERT_OK(overlapped.status());
  ASSERT_TRUE(plain->final_eval.has_value() && overlapped->final_eval.has_value());
  EXPECT_GT(plain->final_eval->accuracy, 0.6);
  EXPECT_NEAR(overlapped->final_eval->accuracy, plain->final_eval->accuracy, 0.05);
  int64_t fused = 0, pushes = 0;
  for (const RecordingStore::Call& c : recorder->calls()) {
    if (c.push) {
      EXPECT_EQ(c.clock, ++pushes);
      if (c.fused) ++fused;
    }
  }
  EXPECT_EQ(pushes, 50);
  EXPECT_EQ(fused, 50 - 2 * 2);
}

}  // namespace
}  // namespace ps::worker
