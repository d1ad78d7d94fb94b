#include "worker/models/fake_parameter_store.h"

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/parameter_store.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::ElementsAre;
using ::testing::Pair;

ps::InitializerConfig Constant(float value) {
  ps::InitializerConfig init;
  init.set_kind(ps::InitializerConfig::CONSTANT);
  init.set_value(value);
  return init;
}

TEST(FakeParameterStore, PullsDenseTablesAndCreatesSparseRowsOnFirstTouch) {
  FakeParameterStore store;
  store.AddDenseTable("d", {1, 2, 3});
  store.AddSparseTable("s", 2, Constant(0.5f));
  std::vector<float> dense(3), rows(6);
  const std::vector<uint64_t> keys = {7, 9, 7};
  common::PullBatch pull;
  pull.dense.push_back({"d", absl::MakeSpan(dense)});
  pull.sparse.push_back({"s", keys, absl::MakeSpan(rows)});
  ASSERT_OK(store.Pull(pull, {}));
  EXPECT_THAT(dense, ElementsAre(1, 2, 3));
  EXPECT_THAT(rows, ElementsAre(0.5, 0.5, 0.5, 0.5, 0.5, 0.5));
  EXPECT_THAT(store.last_pulled_keys("s"), ElementsAre(7, 9, 7));
}

TEST(FakeParameterStore, PushRecordsAndAppliesSgd) {
  FakeParameterStore store;
  store.AddDenseTable("d", {1, 2});
  store.AddSparseTable("s", 1, Constant(1.f));
  store.set_learning_rate(0.5f);
  const std::vector<float> dense_grad = {2, 4}, sparse_grad = {-2};
  const std::vector<uint64_t> keys = {3};
  common::PushBatch push;
  push.dense.push_back({"d", dense_grad});
  push.sparse.push_back({"s", keys, sparse_grad});
  ASSERT_OK(store.Push(push, {}));
  EXPECT_THAT(*store.MutableDenseForTest("d"), ElementsAre(0, 0));
  EXPECT_EQ(*store.MutableRowForTest("s", 3), 2.f);
  const FakeParameterStore::RecordedPush record = store.last_push();
  EXPECT_THAT(record.dense.at("d"), ElementsAre(2, 4));
  EXPECT_THAT(record.sparse.at("s"), ElementsAre(Pair(3, ElementsAre(-2))));
  EXPECT_EQ(store.num_pushes(), 1);
}

TEST(FakeParameterStore, RejectsUnknownTablesAndWrongSizesWithoutApplying) {
  FakeParameterStore store;
  store.AddDenseTable("d", {1, 2});
  store.set_learning_rate(1.f);
  std::vector<float> small(1);
  const std::vector<float> grad = {1, 1};
  common::PullBatch unknown;
  unknown.dense.push_back({"x", absl::MakeSpan(small)});
  EXPECT_THAT(store.Pull(unknown, {}), StatusIs(absl::StatusCode::kNotFound));
  common::PullBatch wrong_size;
  wrong_size.dense.push_back({"d", absl::MakeSpan(small)});
  EXPECT_THAT(store.Pull(wrong_size, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  common::PushBatch half_bad;
  half_bad.dense.push_back({"d", grad});
  half_bad.dense.push_back({"x", grad});
  EXPECT_THAT(store.Push(half_bad, {}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(*store.MutableDenseForTest("d"), ElementsAre(1, 2));
  EXPECT_EQ(store.num_pushes(), 0);
}

TEST(FakeParameterStore, ForTablesInitializesDenseTablesWithTheirInitializer) {
  ps::TableConfig table;
  table.set_name("t");
  table.set_kind(ps::TABLE_KIND_DENSE);
  table.add_shape(2);
  table.add_shape(3);
  *table.mutable_initializer() = Constant(0.25f);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FakeParameterStore> store,
                       FakeParameterStore::ForTables({table}));
  EXPECT_THAT(*store->MutableDenseForTest("t"), ElementsAre(0.25, 0.25, 0.25, 0.25, 0.25, 0.25));
}

}  // namespace
}  // namespace ps::worker
