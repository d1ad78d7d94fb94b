// Centralized training with the model's dense tables on the compute device
// (training.dense_tables): each step updates the tables where the model computes, with the
// optimizer's slots there, instead of copying parameters in and gradients out through the
// in-process store. On the CPU backend (DENSE_TABLES_DEVICE) whole TrainingJobs give bit for
// bit the evaluation of the same job through the store's shards, for every optimizer rule
// and with clip_norm over blocks; a step with non-finite gradients fails both ways; the mode
// is refused where the tables cannot live on the device. Data: a small generated IDX set.
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/config/config.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "server/in_process_store.h"
#include "worker/data/test_files.h"
#include "worker/training_job.h"

namespace ps {
namespace {

using ::ps::common::StatusIs;

// 640 training and 160 test images of 4 x 4 pixels in 3 classes: noise plus a bright
// quadrant that names the class.
struct IdxFiles {
  std::string train_images, train_labels, test_images, test_labels;
};

const IdxFiles& Files() {
  static const IdxFiles* files = [] {
    auto* f = new IdxFiles;
    std::mt19937 rng(11);
    auto make = [&](int n, const std::string& name, std::string* images, std::string* labels) {
      std::string pixels, classes;
      for (int i = 0; i < n; ++i) {
        const int c = static_cast<int>(rng() % 3);
        classes.push_back(static_cast<char>(c));
        for (int p = 0; p < 16; ++p) {
          const int quadrant = (p / 8) * 2 + (p % 4) / 2;
          int value = static_cast<int>(rng() % 100);
          if (quadrant == c) value += 120;
          pixels.push_back(static_cast<char>(value));
        }
      }
      *images = worker::test_files::WriteFile(
          worker::test_files::TempPath(name + "-images"),
          worker::test_files::IdxBytes(0x08, {static_cast<uint32_t>(n), 4, 4}, pixels));
      *labels = worker::test_files::WriteFile(
          worker::test_files::TempPath(name + "-labels"),
          worker::test_files::IdxBytes(0x08, {static_cast<uint32_t>(n)}, classes));
    };
    make(640, "train", &f->train_images, &f->train_labels);
    make(160, "test", &f->test_images, &f->test_labels);
    return f;
  }();
  return *files;
}

// Two servers' worth of shards, dense blocks of 20 floats (the 16 x 12 weight has 10), two
// epochs of 20 steps of 32.
JobConfig MlpJob(const std::string& optimizer, TrainingConfig::DenseTables place,
                 const std::string& more = "") {
  absl::StatusOr<JobConfig> config =
      common::ParseJobConfigText(R"pb(
                                   name: "dense-tables-on-device-test"
                                   cluster { num_servers: 2 num_workers: 1 dense_block_floats: 20 }
                                   model {
                                     mlp {
                                       input_dim: 16
                                       hidden: [ 12, 8 ]
                                       num_classes: 3
                                       activation: TANH
                                     }
                                   }
                                   data { format: IDX shuffle: true }
                                   training { batch_size: 32 epochs: 2 device: "cpu" seed: 5 }
                                   checkpoint { interval_s: 0 }
                                   security { plaintext: true }
                                 )pb",
                                 "job");
  CHECK(config.ok()) << config.status();
  CHECK(google::protobuf::TextFormat::MergeFromString(optimizer,
                                                      config->mutable_default_optimizer()));
  DataConfig* data = config->mutable_data();
  data->set_train_images(Files().train_images);
  data->set_train_labels(Files().train_labels);
  data->set_test_images(Files().test_images);
  data->set_test_labels(Files().test_labels);
  config->mutable_training()->set_dense_tables(place);
  CHECK(google::protobuf::TextFormat::MergeFromString(more, &*config));
  CHECK(common::ExpandModelTables(&*config).ok());
  CHECK(common::ValidateJobConfig(*config).ok());
  return *std::move(config);
}

// A centralized job on the in-process store (as ps_worker --centralized builds it).
absl::StatusOr<std::unique_ptr<worker::TrainingJob>> Centralized(const JobConfig& config) {
  worker::TrainingJobOptions options;
  options.centralized = true;
  options.eval = "always";
  return worker::TrainingJob::Create(
      config, options,
      [](const JobConfig& c,
         common::metrics::Registry*) -> absl::StatusOr<std::unique_ptr<common::ParameterStore>> {
        ASSIGN_OR_RETURN(auto store, server::InProcessParameterStore::CreateCentralized(
                                         c, server::InProcessStoreOptions{}));
        return std::unique_ptr<common::ParameterStore>(std::move(store));
      });
}

// The values of every dense table of `config` in `store`.
std::vector<std::vector<float>> DenseTables(const JobConfig& config,
                                            common::ParameterStore* store) {
  std::vector<std::vector<float>> values;
  common::PullBatch pull;
  for (const TableConfig& table : config.tables()) {
    int64_t n = 1;
    for (int64_t d : table.shape()) n *= d;
    values.emplace_back(n);
  }
  for (int i = 0; i < config.tables_size(); ++i) {
    pull.dense.push_back({config.tables(i).name(), absl::MakeSpan(values[i])});
  }
  const absl::Status s = store->Pull(pull, common::PullOptions{});
  EXPECT_TRUE(s.ok()) << s;
  return values;
}

class DenseTablesOnDevice : public ::testing::TestWithParam<std::string> {};

TEST_P(DenseTablesOnDevice, TrainsBitForBitAsThroughTheStore) {
  const JobConfig store_config = MlpJob(GetParam(), TrainingConfig::DENSE_TABLES_STORE);
  const JobConfig device_config = MlpJob(GetParam(), TrainingConfig::DENSE_TABLES_DEVICE);
  ASSERT_OK_AND_ASSIGN(auto through_store, Centralized(store_config));
  ASSERT_OK_AND_ASSIGN(auto on_device, Centralized(device_config));
  EXPECT_FALSE(through_store->tables_on_device());
  EXPECT_TRUE(on_device->tables_on_device());
  const std::vector<std::vector<float>> initial = DenseTables(store_config, through_store->store());

  ASSERT_OK_AND_ASSIGN(const worker::TrainResult a, through_store->Run());
  ASSERT_OK_AND_ASSIGN(const worker::TrainResult b, on_device->Run());
  EXPECT_EQ(a.steps, 40u);
  EXPECT_EQ(b.steps, a.steps);
  ASSERT_TRUE(a.final_eval.has_value() && b.final_eval.has_value());
  // Bitwise: the loss is a sum over every test example through every parameter.
  EXPECT_EQ(b.final_eval->loss, a.final_eval->loss);
  EXPECT_EQ(b.final_eval->accuracy, a.final_eval->accuracy);
  EXPECT_GT(a.final_eval->accuracy, 0.6) << "the model should learn the quadrants";
  // The store path trained its tables; the device path never sent them a gradient.
  EXPECT_NE(DenseTables(store_config, through_store->store()), initial);
  EXPECT_EQ(DenseTables(device_config, on_device->store()), initial);
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, DenseTablesOnDevice,
    ::testing::Values("kind: SGD learning_rate: 0.1",
                      "kind: MOMENTUM learning_rate: 0.05 momentum: 0.9 nesterov: true",
                      "kind: ADAGRAD learning_rate: 0.1 weight_decay: 0.001",
                      // clip_norm: each 20-float block's norm, as on a server
                      "kind: ADAM learning_rate: 0.01 clip_norm: 0.05",
                      "kind: FTRL learning_rate: 1 l1: 0.0001 l2: 0.001 clip_value: 0.5"));

// A learning rate that drives the logits to infinity through unbounded (ReLU) layers: the
// step whose gradients are not finite fails with INVALID_ARGUMENT either way
// (server.reject_nonfinite).
TEST(DenseTablesOnDeviceTest, NonFiniteGradientsFailTheRunAsThroughTheStore) {
  for (auto place : {TrainingConfig::DENSE_TABLES_STORE, TrainingConfig::DENSE_TABLES_DEVICE}) {
    ASSERT_OK_AND_ASSIGN(auto job, Centralized(MlpJob("kind: SGD learning_rate: 1e30", place,
                                                      "model { mlp { activation: RELU } }")));
    EXPECT_THAT(job->Run(),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("non-finite")))
        << TrainingConfig::DenseTables_Name(place);
  }
}

TEST(DenseTablesOnDeviceTest, RefusedWhereTheTablesCannotLiveOnTheDevice) {
  JobConfig config = MlpJob("kind: SGD", TrainingConfig::DENSE_TABLES_DEVICE);
  // Distributed: the tables are the servers'.
  worker::TrainingJobOptions distributed;
  EXPECT_THAT(worker::TrainingJob::Create(
                  config, distributed,
                  [](const JobConfig& c, common::metrics::Registry*)
                      -> absl::StatusOr<std::unique_ptr<common::ParameterStore>> {
                    ASSIGN_OR_RETURN(auto store, server::InProcessParameterStore::CreateCentralized(
                                                     c, server::InProcessStoreOptions{}));
                    return std::unique_ptr<common::ParameterStore>(std::move(store));
                  }),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("centralized")));
  // Local SGD: the worker's own copy.
  JobConfig local = config;
  local.mutable_training()->mutable_local_sgd()->set_steps(4);
  EXPECT_THAT(Centralized(local),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("local_sgd")));
  // The CTR model keeps its tables in the store.
  absl::StatusOr<JobConfig> ctr = common::ParseJobConfigText(
      R"pb(
        name: "dense-tables-ctr"
        cluster { num_servers: 1 num_workers: 1 }
        model { ctr { embedding_table: "emb" embedding_dim: 4 combiner: SUM } }
        data {
          format: SYNTHETIC_CTR
          synthetic { num_train: 200 num_test: 50 num_fields: 3 vocabulary_per_field: 20 }
        }
        training { device: "cpu" dense_tables: DENSE_TABLES_DEVICE }
        security { plaintext: true }
      )pb",
      "ctr");
  ASSERT_OK(ctr.status());
  ASSERT_OK(common::ExpandModelTables(&*ctr));
  EXPECT_THAT(Centralized(*ctr),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("the MLP can")));
  // AUTO on the CPU keeps them in the store.
  JobConfig automatic = MlpJob("kind: SGD", TrainingConfig::DENSE_TABLES_AUTO);
  ASSERT_OK_AND_ASSIGN(auto job, Centralized(automatic));
  EXPECT_FALSE(job->tables_on_device());
}

}  // namespace
}  // namespace ps
