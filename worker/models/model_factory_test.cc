#include "worker/models/model_factory.h"

#include <memory>

#include "absl/status/status.h"
#include "common/parameter_store.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "proto/config.pb.h"
#include "worker/data/batch.h"
#include "worker/models/model.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::HasSubstr;

class CreateModelTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(backend_, kernels::CreateBackend("cpu", kernels::BackendOptions()));
  }
  std::unique_ptr<kernels::Backend> backend_;
};

TEST_F(CreateModelTest, MlpSectionGivesADenseModelOnItsTables) {
  ps::JobConfig config;
  config.mutable_model()->mutable_mlp()->set_input_dim(4);
  config.mutable_model()->mutable_mlp()->set_num_classes(2);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model,
                       CreateModel(config, backend_.get(), /*max_batch=*/2));
  Batch batch;
  batch.size = 1;
  batch.feature_dim = 4;
  batch.dense = {1, 2, 3, 4};
  batch.class_labels = {1};
  common::PullBatch pull;
  ASSERT_OK(model->PreparePull(batch, &pull));
  ASSERT_EQ(pull.dense.size(), 2u);
  EXPECT_EQ(pull.dense[0].table, "mlp/layer0.w");
  EXPECT_TRUE(pull.sparse.empty());
}

TEST_F(CreateModelTest, CtrSectionGivesASparseModel) {
  ps::JobConfig config;
  config.mutable_model()->mutable_ctr()->set_embedding_dim(4);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model,
                       CreateModel(config, backend_.get(), /*max_batch=*/2));
  Batch batch;
  batch.size = 1;
  batch.offsets = {0, 1};
  batch.feature_ids = {42};
  batch.feature_values = {1};
  batch.binary_labels = {1};
  common::PullBatch pull;
  ASSERT_OK(model->PreparePull(batch, &pull));
  ASSERT_EQ(pull.sparse.size(), 1u);
  EXPECT_EQ(pull.sparse[0].table, "ctr/embedding");
  EXPECT_EQ(pull.sparse[0].out.size(), 4u);
}

TEST_F(CreateModelTest, RejectsAConfigWithoutModel) {
  EXPECT_THAT(CreateModel(ps::JobConfig(), backend_.get(), 2),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CreateModelTest, NamesTheModelSectionInErrors) {
  ps::JobConfig config;
  config.mutable_model()->mutable_mlp()->add_hidden(0);
  EXPECT_THAT(CreateModel(config, backend_.get(), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.mlp")));
}

}  // namespace
}  // namespace ps::worker
