#include "worker/models/mlp_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/config.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/optimizer.h"
#include "proto/config.pb.h"
#include "worker/data/batch.h"
#include "worker/models/fake_parameter_store.h"
#include "worker/models/model.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::FloatNear;
using ::testing::Pointwise;

constexpr int64_t kMaxBatch = 8;

ps::MlpConfig SmallConfig(ps::MlpConfig::Activation activation) {
  ps::MlpConfig config;
  config.set_input_dim(5);
  config.add_hidden(4);
  config.set_num_classes(3);
  config.set_activation(activation);
  config.set_table_prefix("mlp/l");
  return config;
}

// "cpu" always; "cuda" where compiled in and a GPU is present (skipped otherwise).
std::unique_ptr<kernels::Backend> MakeBackend(const std::string& device) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend =
      kernels::CreateBackend(device, kernels::BackendOptions());
  return backend.ok() ? *std::move(backend) : nullptr;
}

// The config's tables, initialized as the servers would, with random biases (the real
// initializer zeroes them, which would hide bias mistakes in the forward pass).
std::unique_ptr<FakeParameterStore> MakeStore(const ps::MlpConfig& config, uint32_t seed) {
  ps::ModelConfig model;
  *model.mutable_mlp() = config;
  absl::StatusOr<std::vector<ps::TableConfig>> tables = common::ModelTables(model);
  CHECK(tables.ok()) << tables.status();
  absl::StatusOr<std::unique_ptr<FakeParameterStore>> store =
      FakeParameterStore::ForTables(*tables);
  CHECK(store.ok()) << store.status();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
  for (int i = 0; i < common::MlpNumLayers(config); ++i) {
    for (float& b : *(*store)->MutableDenseForTest(common::MlpBiasTable(config, i))) {
      b = uniform(rng);
    }
  }
  return *std::move(store);
}

Batch RandomBatch(int64_t size, int64_t dim, int32_t classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Batch batch;
  batch.size = size;
  batch.feature_dim = dim;
  for (int64_t i = 0; i < size * dim; ++i) batch.dense.push_back(normal(rng));
  for (int64_t i = 0; i < size; ++i) batch.class_labels.push_back(rng() % classes);
  return batch;
}

// PreparePull, Pull, ForwardBackward, PreparePush, Push.
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

double Activate(ps::MlpConfig::Activation activation, double x) {
  switch (activation) {
    case ps::MlpConfig::RELU:
      return std::max(x, 0.0);
    case ps::MlpConfig::TANH:
      return std::tanh(x);
    case ps::MlpConfig::SIGMOID:
      return 1 / (1 + std::exp(-x));
  }
  return x;
}

// The model's definition, in double precision on the host: mean softmax cross-entropy,
// and the number of examples whose argmax is the label.
double ReferenceLoss(const ps::MlpConfig& config, FakeParameterStore& store, const Batch& batch,
                     int64_t* correct) {
  const std::vector<uint32_t> widths = common::MlpLayerWidths(config);
  double loss_sum = 0;
  *correct = 0;
  for (int64_t e = 0; e < batch.size; ++e) {
    std::vector<double> a(batch.dense.begin() + e * widths[0],
                          batch.dense.begin() + (e + 1) * widths[0]);
    for (int i = 0; i + 1 < static_cast<int>(widths.size()); ++i) {
      const std::vector<float>& w = *store.MutableDenseForTest(common::MlpWeightTable(config, i));
      const std::vector<float>& b = *store.MutableDenseForTest(common::MlpBiasTable(config, i));
      std::vector<double> z(widths[i + 1]);
      for (uint32_t o = 0; o < widths[i + 1]; ++o) {
        z[o] = b[o];
        for (uint32_t j = 0; j < widths[i]; ++j) z[o] += a[j] * w[j * widths[i + 1] + o];
        if (i + 2 < static_cast<int>(widths.size())) z[o] = Activate(config.activation(), z[o]);
      }
      a = z;
    }
    const double max = *std::max_element(a.begin(), a.end());
    double sum = 0;
    for (double v : a) sum += std::exp(v - max);
    loss_sum += max + std::log(sum) - a[batch.class_labels[e]];
    *correct += std::max_element(a.begin(), a.end()) - a.begin() == batch.class_labels[e];
  }
  return loss_sum / batch.size;
}

class MlpModelTest
    : public testing::TestWithParam<std::tuple<std::string, ps::MlpConfig::Activation>> {
 protected:
  void SetUp() override {
    backend_ = MakeBackend(std::get<0>(GetParam()));
    if (backend_ == nullptr) GTEST_SKIP() << "no " << std::get<0>(GetParam()) << " backend";
    config_ = SmallConfig(std::get<1>(GetParam()));
    store_ = MakeStore(config_, /*seed=*/1);
    ASSERT_OK_AND_ASSIGN(model_, MlpModel::Create(config_, backend_.get(), kMaxBatch));
  }

  std::unique_ptr<kernels::Backend> backend_;
  ps::MlpConfig config_;
  std::unique_ptr<FakeParameterStore> store_;
  std::unique_ptr<MlpModel> model_;
};

TEST_P(MlpModelTest, PullsEveryTableWithItsShape) {
  const Batch batch = RandomBatch(6, 5, 3, /*seed=*/2);
  common::PullBatch pull;
  ASSERT_OK(model_->PreparePull(batch, &pull));
  auto dense = [](const std::string& table, size_t size) {
    return testing::AllOf(Field(&common::DensePull::table, table),
                          Field(&common::DensePull::out, testing::SizeIs(size)));
  };
  EXPECT_THAT(pull.dense, ElementsAre(dense("mlp/l0.w", 20), dense("mlp/l0.b", 4),
                                      dense("mlp/l1.w", 12), dense("mlp/l1.b", 3)));
  EXPECT_TRUE(pull.sparse.empty());
}

TEST_P(MlpModelTest, LossIsTheMeanCrossEntropyOfTheNetwork) {
  const Batch batch = RandomBatch(6, 5, 3, /*seed=*/2);
  ASSERT_OK_AND_ASSIGN(StepResult result, Step(*model_, *store_, batch));
  int64_t correct;
  EXPECT_NEAR(result.loss, ReferenceLoss(config_, *store_, batch, &correct), 1e-5);
}

TEST_P(MlpModelTest, GradientsMatchFiniteDifferences) {
  const Batch batch = RandomBatch(6, 5, 3, /*seed=*/3);
  ASSERT_OK(Step(*model_, *store_, batch).status());
  const FakeParameterStore::RecordedPush push = store_->last_push();
  ASSERT_EQ(push.dense.size(), 4u);
  constexpr float kEps = 1e-3f;
  for (const auto& [table, grad] : push.dense) {
    std::vector<float>& values = *store_->MutableDenseForTest(table);
    ASSERT_EQ(grad.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const float saved = values[i];
      values[i] = saved + kEps;
      ASSERT_OK_AND_ASSIGN(StepResult plus, Step(*model_, *store_, batch));
      values[i] = saved - kEps;
      ASSERT_OK_AND_ASSIGN(StepResult minus, Step(*model_, *store_, batch));
      values[i] = saved;
      const double numeric = (plus.loss - minus.loss) / (2 * kEps);
      EXPECT_NEAR(grad[i], numeric, 5e-4 + 2e-2 * std::abs(numeric)) << table << "[" << i << "]";
    }
  }
}

TEST_P(MlpModelTest, EvaluateAccumulatesLossSumAndCorrectCount) {
  const Batch first = RandomBatch(6, 5, 3, /*seed=*/4);
  const Batch second = RandomBatch(3, 5, 3, /*seed=*/5);
  EvalAccumulator acc;
  ASSERT_OK(Eval(*model_, *store_, first, &acc));
  ASSERT_OK(Eval(*model_, *store_, second, &acc));
  int64_t correct_first, correct_second;
  const double loss_first = ReferenceLoss(config_, *store_, first, &correct_first);
  const double loss_second = ReferenceLoss(config_, *store_, second, &correct_second);
  EXPECT_EQ(acc.examples, 9);
  EXPECT_NEAR(acc.loss_sum, 6 * loss_first + 3 * loss_second, 1e-4);
  EXPECT_EQ(acc.correct, correct_first + correct_second);
}

// Three classes, each a cluster around its own corner in 5-D; a few hundred SGD steps
// must separate them.
TEST_P(MlpModelTest, SgdLearnsSeparableClasses) {
  std::mt19937 rng(6);
  std::normal_distribution<float> noise(0.f, 0.3f);
  auto make_batch = [&](int64_t size) {
    Batch batch;
    batch.size = size;
    batch.feature_dim = 5;
    for (int64_t e = 0; e < size; ++e) {
      const int32_t label = rng() % 3;
      batch.class_labels.push_back(label);
      for (int j = 0; j < 5; ++j) batch.dense.push_back((j == label ? 2.f : 0.f) + noise(rng));
    }
    return batch;
  };
  const Batch test = make_batch(kMaxBatch);
  EvalAccumulator before;
  ASSERT_OK(Eval(*model_, *store_, test, &before));

  store_->set_learning_rate(0.2f);
  for (int step = 0; step < 300; ++step) {
    ASSERT_OK(Step(*model_, *store_, make_batch(kMaxBatch)).status());
  }
  EvalAccumulator after;
  ASSERT_OK(Eval(*model_, *store_, test, &after));
  EXPECT_LT(after.loss_sum / after.examples, 0.2);
  EXPECT_LT(after.loss_sum, before.loss_sum / 3);
  EXPECT_EQ(after.correct, kMaxBatch);
}

// With its tables on the device the model trains as through a store that applies SGD: the
// same tables after 50 steps (to rounding: the store's update is its own loop), the same
// evaluation, and no gradient reaches its store.
TEST_P(MlpModelTest, TablesOnTheDeviceTrainAsThroughTheStore) {
  constexpr float kRate = 0.1f;
  std::unique_ptr<FakeParameterStore> device_store = MakeStore(config_, /*seed=*/1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<MlpModel> on_device,
                       MlpModel::Create(config_, backend_.get(), kMaxBatch));
  DeviceTableOptions options;
  kernels::OptimizerParams sgd;
  sgd.learning_rate = kRate;
  for (int i = 0; i < common::MlpNumLayers(config_); ++i) {
    options.optimizers[common::MlpWeightTable(config_, i)] = sgd;
    options.optimizers[common::MlpBiasTable(config_, i)] = sgd;
  }
  options.block_floats = 7;
  ASSERT_OK_AND_ASSIGN(const bool kept, on_device->KeepTablesOnDevice(options, device_store.get()));
  ASSERT_TRUE(kept);
  EXPECT_THAT(on_device->AddSecondBufferSet(), StatusIs(absl::StatusCode::kFailedPrecondition));

  store_->set_learning_rate(kRate);
  device_store->set_learning_rate(kRate);
  for (int step = 0; step < 50; ++step) {
    const Batch batch = RandomBatch(kMaxBatch, 5, 3, /*seed=*/100 + step);
    ASSERT_OK(Step(*model_, *store_, batch).status());
    ASSERT_OK(Step(*on_device, *device_store, batch).status());
  }
  const Batch test = RandomBatch(kMaxBatch, 5, 3, /*seed=*/7);
  EvalAccumulator through_store, device;
  ASSERT_OK(Eval(*model_, *store_, test, &through_store));
  ASSERT_OK(Eval(*on_device, *device_store, test, &device));
  EXPECT_NEAR(device.loss_sum, through_store.loss_sum, 1e-4 * through_store.loss_sum);
  EXPECT_EQ(device.correct, through_store.correct);

  ASSERT_OK(on_device->stack()->CopyParametersToHost());
  std::unique_ptr<FakeParameterStore> initial = MakeStore(config_, /*seed=*/1);
  for (int i = 0; i < common::MlpNumLayers(config_); ++i) {
    const std::string w = common::MlpWeightTable(config_, i);
    const std::vector<float>& trained = *store_->MutableDenseForTest(w);
    EXPECT_THAT(on_device->stack()->weight(i), Pointwise(FloatNear(1e-5f), trained)) << w;
    EXPECT_NE(trained, *initial->MutableDenseForTest(w)) << w;
    EXPECT_EQ(*device_store->MutableDenseForTest(w), *initial->MutableDenseForTest(w)) << w;
    const std::string b = common::MlpBiasTable(config_, i);
    EXPECT_THAT(on_device->stack()->bias(i),
                Pointwise(FloatNear(1e-5f), *store_->MutableDenseForTest(b)))
        << b;
  }
}

TEST_P(MlpModelTest, RejectsWrongFeatureDim) {
  const Batch batch = RandomBatch(4, 6, 3, /*seed=*/7);
  common::PullBatch pull;
  EXPECT_THAT(model_->PreparePull(batch, &pull), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(model_->ForwardBackward(batch), StatusIs(absl::StatusCode::kInvalidArgument));
  EvalAccumulator acc;
  EXPECT_THAT(model_->Evaluate(batch, &acc), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(MlpModelTest, RejectsLabelsOutOfRange) {
  for (int32_t label : {-1, 3}) {
    Batch batch = RandomBatch(4, 5, 3, /*seed=*/8);
    batch.class_labels[2] = label;
    common::PullBatch pull;
    EXPECT_THAT(model_->PreparePull(batch, &pull), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(model_->ForwardBackward(batch), StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST_P(MlpModelTest, RejectsBatchLargerThanMaxBatchOrEmpty) {
  for (int64_t size : {kMaxBatch + 1, int64_t{0}}) {
    const Batch batch = RandomBatch(size, 5, 3, /*seed=*/9);
    common::PullBatch pull;
    EXPECT_THAT(model_->PreparePull(batch, &pull), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(model_->ForwardBackward(batch), StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST_P(MlpModelTest, RejectsInconsistentArrays) {
  Batch batch = RandomBatch(4, 5, 3, /*seed=*/10);
  batch.dense.pop_back();
  EXPECT_THAT(model_->ForwardBackward(batch), StatusIs(absl::StatusCode::kInvalidArgument));
  batch = RandomBatch(4, 5, 3, /*seed=*/10);
  batch.class_labels.pop_back();
  EXPECT_THAT(model_->ForwardBackward(batch), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(MlpModelTest, PreparePushBeforeForwardBackwardFails) {
  common::PushBatch push;
  EXPECT_THAT(model_->PreparePush(&push), StatusIs(absl::StatusCode::kFailedPrecondition));
}

INSTANTIATE_TEST_SUITE_P(Devices, MlpModelTest,
                         testing::Combine(testing::Values("cpu", "cuda"),
                                          testing::Values(ps::MlpConfig::RELU, ps::MlpConfig::TANH,
                                                          ps::MlpConfig::SIGMOID)),
                         [](const testing::TestParamInfo<MlpModelTest::ParamType>& info) {
                           return std::get<0>(info.param) + "_" +
                                  ps::MlpConfig::Activation_Name(std::get<1>(info.param));
                         });

TEST(MlpModelCreate, RejectsBadArguments) {
  std::unique_ptr<kernels::Backend> backend = MakeBackend("cpu");
  const ps::MlpConfig config = SmallConfig(ps::MlpConfig::RELU);
  EXPECT_THAT(MlpModel::Create(config, nullptr, 4), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MlpModel::Create(config, backend.get(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ps::MlpConfig zero_width = config;
  zero_width.set_hidden(0, 0);
  EXPECT_THAT(MlpModel::Create(zero_width, backend.get(), 4),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ps::MlpConfig no_prefix = config;
  no_prefix.set_table_prefix("");
  EXPECT_THAT(MlpModel::Create(no_prefix, backend.get(), 4),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ps::worker
