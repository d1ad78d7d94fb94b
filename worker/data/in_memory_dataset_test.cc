#include "worker/data/in_memory_dataset.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/batch.h"

namespace ps::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// 3 examples of 2 features: example i is (10i, 10i + 1), label i.
DenseDataset SmallDense() { return DenseDataset(2, 3, {0, 1, 10, 11, 20, 21}, {0, 1, 2}); }

// 3 examples: {1:0.5, 2:1.5}, {}, {7:2}; labels 1, 0, 1.
SparseDataset SmallSparse(int num_classes) {
  return SparseDataset(num_classes, {0, 2, 2, 3}, {1, 2, 7}, {0.5f, 1.5f, 2.0f}, {1, 0, 1});
}

TEST(DenseDataset, DescribesItself) {
  const DenseDataset d = SmallDense();
  EXPECT_EQ(d.size(), 3);
  EXPECT_FALSE(d.is_sparse());
  EXPECT_EQ(d.feature_dim(), 2);
  EXPECT_EQ(d.num_classes(), 3);
  EXPECT_THAT(d.features(1), ElementsAre(10, 11));
  EXPECT_EQ(d.label(2), 2);
}

TEST(DenseDataset, FillBatchCopiesRowsInIndexOrder) {
  const DenseDataset d = SmallDense();
  Batch batch;
  const std::vector<int64_t> indices = {2, 0, 2};
  d.FillBatch(indices, &batch);
  EXPECT_EQ(batch.size, 3);
  EXPECT_EQ(batch.feature_dim, 2);
  EXPECT_THAT(batch.dense, ElementsAre(20, 21, 0, 1, 20, 21));
  EXPECT_THAT(batch.class_labels, ElementsAre(2, 0, 2));
  EXPECT_THAT(batch.binary_labels, IsEmpty());
  EXPECT_THAT(batch.offsets, IsEmpty());
}

TEST(DenseDataset, FillBatchReplacesPreviousContents) {
  const DenseDataset d = SmallDense();
  Batch batch;
  SmallSparse(2).FillBatch(std::vector<int64_t>{0, 1}, &batch);
  d.FillBatch(std::vector<int64_t>{1}, &batch);
  EXPECT_EQ(batch.size, 1);
  EXPECT_THAT(batch.dense, ElementsAre(10, 11));
  EXPECT_THAT(batch.class_labels, ElementsAre(1));
  EXPECT_THAT(batch.binary_labels, IsEmpty());
  EXPECT_THAT(batch.offsets, IsEmpty());
  EXPECT_THAT(batch.feature_ids, IsEmpty());
}

TEST(DenseDatasetDeathTest, FillBatchRejectsOutOfRangeIndex) {
  const DenseDataset d = SmallDense();
  Batch batch;
  EXPECT_DEATH(d.FillBatch(std::vector<int64_t>{3}, &batch), "out of range");
}

TEST(SparseDataset, BinaryFillsCsrAndBinaryLabels) {
  const SparseDataset d = SmallSparse(2);
  EXPECT_TRUE(d.is_sparse());
  EXPECT_EQ(d.feature_dim(), 0);
  EXPECT_EQ(d.num_entries(), 3u);
  Batch batch;
  d.FillBatch(std::vector<int64_t>{2, 1, 0}, &batch);
  EXPECT_EQ(batch.size, 3);
  EXPECT_EQ(batch.feature_dim, 0);
  EXPECT_THAT(batch.offsets, ElementsAre(0, 1, 1, 3));
  EXPECT_THAT(batch.feature_ids, ElementsAre(7, 1, 2));
  EXPECT_THAT(batch.feature_values, ElementsAre(2.0f, 0.5f, 1.5f));
  EXPECT_THAT(batch.binary_labels, ElementsAre(1.0f, 0.0f, 1.0f));
  EXPECT_THAT(batch.class_labels, IsEmpty());
  EXPECT_THAT(batch.dense, IsEmpty());
}

TEST(SparseDataset, MultiClassFillsClassLabels) {
  const SparseDataset d = SmallSparse(5);
  EXPECT_EQ(d.num_classes(), 5);
  Batch batch;
  d.FillBatch(std::vector<int64_t>{0, 2}, &batch);
  EXPECT_THAT(batch.class_labels, ElementsAre(1, 1));
  EXPECT_THAT(batch.binary_labels, IsEmpty());
  EXPECT_THAT(batch.offsets, ElementsAre(0, 2, 3));
}

TEST(SparseDataset, EmptyBatch) {
  Batch batch;
  SmallSparse(2).FillBatch({}, &batch);
  EXPECT_EQ(batch.size, 0);
  EXPECT_THAT(batch.offsets, ElementsAre(0));
}

}  // namespace
}  // namespace ps::worker
