#include "worker/models/ctr_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/config.h"
#include "common/hash.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "proto/config.pb.h"
#include "worker/data/batch.h"
#include "worker/models/fake_parameter_store.h"
#include "worker/models/model.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

constexpr int64_t kMaxBatch = 8;
constexpr char kEmbedding[] = "ctr/emb";

ps::CtrConfig SmallConfig(ps::CtrConfig::Combiner combiner, uint64_t hash_buckets) {
  ps::CtrConfig config;
  config.set_embedding_table(kEmbedding);
  config.set_embedding_dim(3);
  config.add_hidden(4);
  config.set_combiner(combiner);
  config.set_hash_buckets(hash_buckets);
  config.set_dense_prefix("ctr/d");
  return config;
}

std::unique_ptr<kernels::Backend> MakeBackend(const std::string& device) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend =
      kernels::CreateBackend(device, kernels::BackendOptions());
  return backend.ok() ? *std::move(backend) : nullptr;
}

// The config's tables as the servers would initialize them; with `large_init`, embeddings
// of stddev 0.5 and random biases so that every term of the gradient is visible.
std::unique_ptr<FakeParameterStore> MakeStore(const ps::CtrConfig& config, bool large_init) {
  ps::ModelConfig model;
  *model.mutable_ctr() = config;
  absl::StatusOr<std::vector<ps::TableConfig>> tables = common::ModelTables(model);
  CHECK(tables.ok()) << tables.status();
  if (large_init) {
    for (ps::TableConfig& table : *tables) {
      if (table.name() == kEmbedding) table.mutable_initializer()->set_stddev(0.5f);
    }
  }
  absl::StatusOr<std::unique_ptr<FakeParameterStore>> store =
      FakeParameterStore::ForTables(*tables);
  CHECK(store.ok()) << store.status();
  if (large_init) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
    for (int i = 0; i < common::CtrNumDenseLayers(config); ++i) {
      for (float& b : *(*store)->MutableDenseForTest(common::CtrBiasTable(config, i))) {
        b = uniform(rng);
      }
    }
  }
  return *std::move(store);
}

// One example per entry: (ids, values).
Batch MakeBatch(const std::vector<std::pair<std::vector<uint64_t>, std::vector<float>>>& examples,
                const std::vector<float>& labels) {
  Batch batch;
  batch.size = static_cast<int64_t>(examples.size());
  batch.offsets.push_back(0);
  for (const auto& [ids, values] : examples) {
    batch.feature_ids.insert(batch.feature_ids.end(), ids.begin(), ids.end());
    batch.feature_values.insert(batch.feature_values.end(), values.begin(), values.end());
    batch.offsets.push_back(static_cast<uint32_t>(batch.feature_ids.size()));
  }
  batch.binary_labels = labels;
  return batch;
}

// Duplicate ids within example 0 and across examples 0, 1 and 3; example 2 is empty.
Batch DuplicatesBatch() {
  return MakeBatch({{{1, 2, 1}, {1.f, 0.5f, 2.f}},
                    {{2, 3}, {1.f, -1.f}},
                    {{}, {}},
                    {{3, 7, 1}, {0.5f, 1.f, 1.5f}}},
                   {1.f, 0.f, 1.f, 0.f});
}

absl::StatusOr<StepResult> Step(Model& model, common::ParameterStore& store, const Batch& batch) {
  common::PullBatch pull;
  RETURN_IF_ERROR(model.PreparePull(batch, &pull));
  RETURN_IF_ERROR(store.Pull(pull, {}));
  ASSIGN_OR_RETURN(StepResult result, model.ForwardBackward(batch));
  common::PushBatch push;
  RETURN_IF_ERROR(model.PreparePush(&push));
  RETURN_IF_ERROR(store.Push(push, {}));
  return result;
}

absl::Status Eval(Model& model, common::ParameterStore& store, const Batch& batch,
                  EvalAccumulator* acc) {
  common::PullBatch pull;
  RETURN_IF_ERROR(model.PreparePull(batch, &pull));
  RETURN_IF_ERROR(store.Pull(pull, {}));
  return model.Evaluate(batch, acc);
}

// The model's definition in double precision on the host: the mean log-loss; the
// per-example probabilities go to `probabilities` if not null.
double ReferenceLoss(const ps::CtrConfig& config, FakeParameterStore& store, const Batch& batch,
                     std::vector<double>* probabilities = nullptr) {
  const std::vector<uint32_t> widths = common::CtrLayerWidths(config);
  const int64_t dim = widths[0];
  double loss_sum = 0;
  for (int64_t e = 0; e < batch.size; ++e) {
    std::vector<double> a(dim, 0.0);
    const uint32_t begin = batch.offsets[e], end = batch.offsets[e + 1];
    for (uint32_t f = begin; f < end; ++f) {
      const uint64_t id = batch.feature_ids[f];
      const uint64_t key =
          config.hash_buckets() > 0 ? common::Mix64(id) % config.hash_buckets() : id;
      const float* row = store.MutableRowForTest(config.embedding_table(), key);
      double scale = batch.feature_values[f];
      if (config.combiner() == ps::CtrConfig::MEAN) scale /= end - begin;
      for (int64_t j = 0; j < dim; ++j) a[j] += scale * row[j];
    }
    for (int i = 0; i + 1 < static_cast<int>(widths.size()); ++i) {
      const std::vector<float>& w = *store.MutableDenseForTest(common::CtrWeightTable(config, i));
      const std::vector<float>& b = *store.MutableDenseForTest(common::CtrBiasTable(config, i));
      std::vector<double> z(widths[i + 1]);
      for (uint32_t o = 0; o < widths[i + 1]; ++o) {
        z[o] = b[o];
        for (uint32_t j = 0; j < widths[i]; ++j) z[o] += a[j] * w[j * widths[i + 1] + o];
        if (i + 2 < static_cast<int>(widths.size())) z[o] = std::max(z[o], 0.0);
      }
      a = z;
    }
    const double x = a[0], y = batch.binary_labels[e];
    loss_sum += std::max(x, 0.0) - x * y + std::log1p(std::exp(-std::abs(x)));
    if (probabilities != nullptr) probabilities->push_back(1 / (1 + std::exp(-x)));
  }
  return loss_sum / batch.size;
}

// Probability that a random positive scores above a random negative (ties count half).
double Auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  double wins = 0;
  int64_t pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[i] < 0.5f || labels[j] >= 0.5f) continue;
      ++pairs;
      wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
    }
  }
  return wins / pairs;
}

using Param = std::tuple<std::string, ps::CtrConfig::Combiner, uint64_t>;

class CtrModelTest : public testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    backend_ = MakeBackend(std::get<0>(GetParam()));
    if (backend_ == nullptr) GTEST_SKIP() << "no " << std::get<0>(GetParam()) << " backend";
    config_ = SmallConfig(std::get<1>(GetParam()), std::get<2>(GetParam()));
    ASSERT_OK_AND_ASSIGN(model_, CtrModel::Create(config_, backend_.get(), kMaxBatch));
  }

  std::unique_ptr<kernels::Backend> backend_;
  ps::CtrConfig config_;
  std::unique_ptr<CtrModel> model_;
};

TEST_P(CtrModelTest, LossIsTheMeanLogLossOfTheNetwork) {
  std::unique_ptr<FakeParameterStore> store = MakeStore(config_, /*large_init=*/true);
  const Batch batch = DuplicatesBatch();
  ASSERT_OK_AND_ASSIGN(StepResult result, Step(*model_, *store, batch));
  EXPECT_NEAR(result.loss, ReferenceLoss(config_, *store, batch), 1e-5);
}

TEST_P(CtrModelTest, GradientsMatchFiniteDifferences) {
  std::unique_ptr<FakeParameterStore> store = MakeStore(config_, /*large_init=*/true);
  const Batch batch = DuplicatesBatch();
  ASSERT_OK(Step(*model_, *store, batch).status());
  const FakeParameterStore::RecordedPush push = store->last_push();
  constexpr float kEps = 1e-3f;
  // Central difference of the loss in one parameter.
  auto numeric = [&](float* value) -> double {
    const float saved = *value;
    *value = saved + kEps;
    absl::StatusOr<StepResult> plus = Step(*model_, *store, batch);
    *value = saved - kEps;
    absl::StatusOr<StepResult> minus = Step(*model_, *store, batch);
    *value = saved;
    CHECK(plus.ok() && minus.ok());
    return (plus->loss - minus->loss) / (2 * kEps);
  };
  ASSERT_EQ(push.dense.size(), 4u);
  for (const auto& [table, grad] : push.dense) {
    std::vector<float>& values = *store->MutableDenseForTest(table);
    ASSERT_EQ(grad.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const double expected = numeric(&values[i]);
      EXPECT_NEAR(grad[i], expected, 5e-4 + 2e-2 * std::abs(expected)) << table << "[" << i << "]";
    }
  }
  ASSERT_EQ(push.sparse.count(kEmbedding), 1u);
  for (const auto& [key, grad] : push.sparse.at(kEmbedding)) {
    ASSERT_EQ(grad.size(), 3u);
    float* row = store->MutableRowForTest(kEmbedding, key);
    for (int j = 0; j < 3; ++j) {
      const double expected = numeric(&row[j]);
      EXPECT_NEAR(grad[j], expected, 5e-4 + 2e-2 * std::abs(expected))
          << "key " << key << "[" << j << "]";
    }
  }
}

TEST_P(CtrModelTest, PullsAndPushesEachKeyOnceInFirstSeenOrder) {
  std::unique_ptr<FakeParameterStore> store = MakeStore(config_, /*large_init=*/true);
  const Batch batch = DuplicatesBatch();
  std::vector<uint64_t> expected;
  for (uint64_t id : batch.feature_ids) {
    const uint64_t key = model_->KeyOf(id);
    if (std::find(expected.begin(), expected.end(), key) == expected.end()) {
      expected.push_back(key);
    }
  }
  ASSERT_OK(Step(*model_, *store, batch).status());
  EXPECT_THAT(store->last_pulled_keys(kEmbedding), ElementsAreArray(expected));
  const FakeParameterStore::RecordedPush push = store->last_push();
  std::vector<uint64_t> pushed;
  for (const auto& [key, grad] : push.sparse.at(kEmbedding)) pushed.push_back(key);
  EXPECT_THAT(pushed, ElementsAreArray(expected));
}

TEST_P(CtrModelTest, EvaluateCollectsScoresLabelsAndLossSum) {
  std::unique_ptr<FakeParameterStore> store = MakeStore(config_, /*large_init=*/true);
  const Batch batch = DuplicatesBatch();
  EvalAccumulator acc;
  ASSERT_OK(Eval(*model_, *store, batch, &acc));
  std::vector<double> probabilities;
  const double loss = ReferenceLoss(config_, *store, batch, &probabilities);
  EXPECT_EQ(acc.examples, 4);
  EXPECT_NEAR(acc.loss_sum, 4 * loss, 1e-4);
  ASSERT_EQ(acc.scores.size(), 4u);
  int64_t correct = 0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(acc.scores[i], probabilities[i], 1e-5);
    correct += (probabilities[i] >= 0.5) == (batch.binary_labels[i] >= 0.5f);
  }
  EXPECT_THAT(acc.labels, ElementsAre(1.f, 0.f, 1.f, 0.f));
  EXPECT_EQ(acc.correct, correct);
}

// Ids 0-9 occur only in clicks, 10-19 only in non-clicks, 20-24 in both.
TEST_P(CtrModelTest, SgdLearnsSeparableClicks) {
  if (config_.hash_buckets() > 0) {
    // Enough buckets that the 25 ids stay apart (3 would merge the classes).
    config_.set_hash_buckets(uint64_t{1} << 20);
    ASSERT_OK_AND_ASSIGN(model_, CtrModel::Create(config_, backend_.get(), kMaxBatch));
  }
  std::unique_ptr<FakeParameterStore> store = MakeStore(config_, /*large_init=*/false);
  std::mt19937 rng(3);
  auto make_batch = [&](int64_t size) {
    std::vector<std::pair<std::vector<uint64_t>, std::vector<float>>> examples;
    std::vector<float> labels;
    for (int64_t e = 0; e < size; ++e) {
      const bool click = rng() % 2 == 0;
      std::vector<uint64_t> ids = {(click ? 0 : 10) + rng() % 10, (click ? 0 : 10) + rng() % 10,
                                   20 + rng() % 5};
      examples.push_back({ids, {1.f, 1.f, 1.f}});
      labels.push_back(click ? 1.f : 0.f);
    }
    return MakeBatch(examples, labels);
  };
  std::vector<Batch> test;
  for (int i = 0; i < 4; ++i) test.push_back(make_batch(kMaxBatch));
  EvalAccumulator before;
  for (const Batch& batch : test) ASSERT_OK(Eval(*model_, *store, batch, &before));

  store->set_learning_rate(0.5f);
  for (int step = 0; step < 300; ++step) {
    ASSERT_OK(Step(*model_, *store, make_batch(kMaxBatch)).status());
  }
  EvalAccumulator after;
  for (const Batch& batch : test) ASSERT_OK(Eval(*model_, *store, batch, &after));
  EXPECT_GT(Auc(after.scores, after.labels), 0.99);
  EXPECT_LT(after.loss_sum / after.examples, 0.3);
  EXPECT_LT(after.loss_sum, before.loss_sum / 2);
}

TEST_P(CtrModelTest, RejectsLabelsOutsideZeroOne) {
  for (float label : {-0.5f, 2.f, NAN}) {
    Batch batch = DuplicatesBatch();
    batch.binary_labels[1] = label;
    common::PullBatch pull;
    EXPECT_THAT(model_->PreparePull(batch, &pull), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(model_->ForwardBackward(batch), StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST_P(CtrModelTest, RejectsBatchLargerThanMaxBatchOrEmpty) {
  for (int64_t size : {kMaxBatch + 1, int64_t{0}}) {
    std::vector<std::pair<std::vector<uint64_t>, std::vector<float>>> examples(size, {{1}, {1.f}});
    const Batch batch = MakeBatch(examples, std::vector<float>(size, 1.f));
    common::PullBatch pull;
    EXPECT_THAT(model_->PreparePull(batch, &pull), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(model_->ForwardBackward(batch), StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST_P(CtrModelTest, RejectsInconsistentCsr) {
  std::vector<Batch> bad(4, DuplicatesBatch());
  bad[0].offsets.pop_back();         // size + 1 entries wanted
  bad[1].offsets[2] = 1;             // decreasing
  bad[2].offsets.back() -= 1;        // does not cover every feature
  bad[3].feature_values.pop_back();  // values and ids differ in length
  for (const Batch& batch : bad) {
    common::PullBatch pull;
    EXPECT_THAT(model_->PreparePull(batch, &pull), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(pull.sparse, IsEmpty());
  }
}

TEST_P(CtrModelTest, ForwardBackwardOfAnotherBatchThanPreparedFails) {
  std::unique_ptr<FakeParameterStore> store = MakeStore(config_, /*large_init=*/true);
  const Batch batch = DuplicatesBatch();
  common::PullBatch pull;
  ASSERT_OK(model_->PreparePull(batch, &pull));
  ASSERT_OK(store->Pull(pull, {}));
  const Batch other = MakeBatch({{{1}, {1.f}}}, {1.f});
  EXPECT_THAT(model_->ForwardBackward(other), StatusIs(absl::StatusCode::kFailedPrecondition));
  common::PushBatch push;
  EXPECT_THAT(model_->PreparePush(&push), StatusIs(absl::StatusCode::kFailedPrecondition));
}

INSTANTIATE_TEST_SUITE_P(Devices, CtrModelTest,
                         testing::Combine(testing::Values("cpu", "cuda"),
                                          testing::Values(ps::CtrConfig::SUM, ps::CtrConfig::MEAN),
                                          testing::Values(uint64_t{0}, uint64_t{3})),
                         [](const testing::TestParamInfo<Param>& info) {
                           return std::get<0>(info.param) + "_" +
                                  ps::CtrConfig::Combiner_Name(std::get<1>(info.param)) +
                                  "_buckets" + std::to_string(std::get<2>(info.param));
                         });

// Renaming the second use of a key to a fresh key with the same row leaves the loss
// unchanged, so the deduplicated gradient must be the sum of the two renamed gradients.
TEST(CtrModelDedup, GradientOfARepeatedKeyIsTheSumOverItsUses) {
  std::unique_ptr<kernels::Backend> backend = MakeBackend("cpu");
  const ps::CtrConfig config = SmallConfig(ps::CtrConfig::MEAN, 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CtrModel> model,
                       CtrModel::Create(config, backend.get(), kMaxBatch));
  // Key 10 twice in example 0 and once in example 1; the renamed batch uses 20 and 30.
  const Batch shared =
      MakeBatch({{{10, 11, 10}, {1.f, 1.f, 0.5f}}, {{12, 10}, {1.f, 2.f}}}, {1.f, 0.f});
  const Batch renamed =
      MakeBatch({{{10, 11, 20}, {1.f, 1.f, 0.5f}}, {{12, 30}, {1.f, 2.f}}}, {1.f, 0.f});
  std::unique_ptr<FakeParameterStore> store = MakeStore(config, /*large_init=*/true);
  const float* row10 = store->MutableRowForTest(kEmbedding, 10);
  std::copy_n(row10, 3, store->MutableRowForTest(kEmbedding, 20));
  std::copy_n(row10, 3, store->MutableRowForTest(kEmbedding, 30));

  // Gradient row per key of one step on `batch`.
  auto step = [&](const Batch& batch, StepResult* result) {
    absl::StatusOr<StepResult> step_result = Step(*model, *store, batch);
    CHECK(step_result.ok()) << step_result.status();
    *result = *step_result;
    std::map<uint64_t, std::vector<float>> grads;
    const FakeParameterStore::RecordedPush push = store->last_push();
    for (const auto& [key, grad] : push.sparse.at(kEmbedding)) grads[key] = grad;
    return grads;
  };
  StepResult shared_result, renamed_result;
  std::map<uint64_t, std::vector<float>> shared_grads = step(shared, &shared_result);
  std::map<uint64_t, std::vector<float>> renamed_grads = step(renamed, &renamed_result);

  EXPECT_FLOAT_EQ(shared_result.loss, renamed_result.loss);
  ASSERT_EQ(shared_grads.size(), 3u);  // 10, 11, 12
  for (int j = 0; j < 3; ++j) {
    EXPECT_NEAR(shared_grads[10][j],
                renamed_grads[10][j] + renamed_grads[20][j] + renamed_grads[30][j], 1e-6);
    EXPECT_FLOAT_EQ(shared_grads[11][j], renamed_grads[11][j]);
  }
}

TEST(CtrModelCreate, RejectsBadArguments) {
  std::unique_ptr<kernels::Backend> backend = MakeBackend("cpu");
  const ps::CtrConfig config = SmallConfig(ps::CtrConfig::SUM, 0);
  EXPECT_THAT(CtrModel::Create(config, nullptr, 4), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CtrModel::Create(config, backend.get(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ps::CtrConfig zero_dim = config;
  zero_dim.set_embedding_dim(0);
  EXPECT_THAT(CtrModel::Create(zero_dim, backend.get(), 4),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ps::CtrConfig no_table = config;
  no_table.set_embedding_table("");
  EXPECT_THAT(CtrModel::Create(no_table, backend.get(), 4),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CtrModelCreate, LogisticRegressionWithoutHiddenLayersHasOneDenseLayer) {
  std::unique_ptr<kernels::Backend> backend = MakeBackend("cpu");
  ps::CtrConfig config = SmallConfig(ps::CtrConfig::SUM, 0);
  config.clear_hidden();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CtrModel> model,
                       CtrModel::Create(config, backend.get(), kMaxBatch));
  std::unique_ptr<FakeParameterStore> store = MakeStore(config, /*large_init=*/true);
  const Batch batch = DuplicatesBatch();
  common::PullBatch pull;
  ASSERT_OK(model->PreparePull(batch, &pull));
  ASSERT_EQ(pull.dense.size(), 2u);
  EXPECT_EQ(pull.dense[0].table, "ctr/d0.w");
  EXPECT_EQ(pull.dense[0].out.size(), 3u);
  EXPECT_EQ(pull.dense[1].table, "ctr/d0.b");
  ASSERT_OK_AND_ASSIGN(StepResult result, Step(*model, *store, batch));
  EXPECT_NEAR(result.loss, ReferenceLoss(config, *store, batch), 1e-5);
}

}  // namespace
}  // namespace ps::worker
