#include "worker/data/load.h"

#include <memory>
#include <string>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "worker/data/dataset.h"
#include "worker/data/test_files.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using test_files::IdxBytes;
using test_files::TempPath;
using test_files::WriteFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint8_t kUbyte = 0x08;

// IDX files of `n` 1x2 images with labels i % classes.
struct IdxPair {
  std::string images, labels;
};
IdxPair WriteIdx(const std::string& prefix, int n, int classes) {
  std::string pixels(2 * n, '\x80'), labels(n, '\0');
  for (int i = 0; i < n; ++i) labels[i] = static_cast<char>(i % classes);
  return {WriteFile(TempPath(prefix + "-images"), IdxBytes(kUbyte, {uint32_t(n), 1, 2}, pixels)),
          WriteFile(TempPath(prefix + "-labels"), IdxBytes(kUbyte, {uint32_t(n)}, labels))};
}

ps::DataConfig IdxConfig() {
  const IdxPair train = WriteIdx("train", 6, 3);
  const IdxPair test = WriteIdx("test", 4, 3);
  ps::DataConfig c;
  c.set_format(ps::DataConfig::IDX);
  c.set_train_images(train.images);
  c.set_train_labels(train.labels);
  c.set_test_images(test.images);
  c.set_test_labels(test.labels);
  return c;
}

const ps::TrainingConfig kTraining;

TEST(LoadData, UnspecifiedFormat) {
  EXPECT_THAT(LoadData(ps::DataConfig(), kTraining),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.format")));
}

TEST(LoadData, LoadsIdxTrainAndTest) {
  ASSERT_OK_AND_ASSIGN(LoadedData data, LoadData(IdxConfig(), kTraining));
  EXPECT_EQ(data.train->size(), 6);
  EXPECT_EQ(data.train->feature_dim(), 2);
  EXPECT_EQ(data.train->num_classes(), 3);
  ASSERT_NE(data.test, nullptr);
  EXPECT_EQ(data.test->size(), 4);
  EXPECT_EQ(data.test->num_classes(), 3);
  EXPECT_EQ(data.ground_truth_auc, 0);
}

TEST(LoadData, IdxTestSetIsOptional) {
  ps::DataConfig c = IdxConfig();
  c.clear_test_images();
  c.clear_test_labels();
  ASSERT_OK_AND_ASSIGN(LoadedData data, LoadData(c, kTraining));
  EXPECT_EQ(data.test, nullptr);
}

TEST(LoadData, IdxRequiredFields) {
  ps::DataConfig c = IdxConfig();
  c.clear_train_images();
  EXPECT_THAT(LoadData(c, kTraining), StatusIs(absl::StatusCode::kInvalidArgument,
                                               "data.train_images is required for format IDX"));
  c = IdxConfig();
  c.clear_train_labels();
  EXPECT_THAT(LoadData(c, kTraining), StatusIs(absl::StatusCode::kInvalidArgument,
                                               "data.train_labels is required for format IDX"));
  c = IdxConfig();
  c.clear_test_labels();
  EXPECT_THAT(LoadData(c, kTraining),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "data.test_labels is required with data.test_images"));
  c = IdxConfig();
  c.set_pixel_scale(0);
  EXPECT_THAT(LoadData(c, kTraining),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.pixel_scale")));
}

TEST(LoadData, IdxTestLabelsMustBeTrainingClasses) {
  ps::DataConfig c = IdxConfig();
  const IdxPair test = WriteIdx("test-wide", 4, 4);  // has label 3; training has 0..2
  c.set_test_images(test.images);
  c.set_test_labels(test.labels);
  EXPECT_THAT(LoadData(c, kTraining), StatusIs(absl::StatusCode::kInvalidArgument,
                                               AllOf(HasSubstr("test set: "),
                                                     HasSubstr("label 3 is out of range [0, 3)"))));
}

TEST(LoadData, IdxFeatureDimensionsMustAgree) {
  ps::DataConfig c = IdxConfig();
  c.set_test_images(
      WriteFile(TempPath("test-3px"), IdxBytes(kUbyte, {4, 1, 3}, std::string(12, '\0'))));
  EXPECT_THAT(LoadData(c, kTraining),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("data.test_images"), HasSubstr("3 features"))));
}

TEST(LoadData, MissingFileNamesTheSet) {
  ps::DataConfig c = IdxConfig();
  c.set_train_images(TempPath("gone"));
  EXPECT_THAT(
      LoadData(c, kTraining),
      StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr("training set: "), HasSubstr("gone"))));
}

TEST(LoadData, EmptyTrainingSetIsInvalid) {
  ps::DataConfig c = IdxConfig();
  const IdxPair empty = WriteIdx("empty", 0, 1);
  c.set_train_images(empty.images);
  c.set_train_labels(empty.labels);
  EXPECT_THAT(LoadData(c, kTraining),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has no examples")));
}

// A test set named but empty is refused as an empty training set is: its evaluation reported
// NaN AUC or 0 accuracy as the model's before 2026-12-05.
TEST(LoadData, EmptyTestSetIsInvalid) {
  ps::DataConfig c = IdxConfig();
  const IdxPair empty = WriteIdx("empty-test", 0, 1);
  c.set_test_images(empty.images);
  c.set_test_labels(empty.labels);
  EXPECT_THAT(LoadData(c, kTraining),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("data.test_images"), HasSubstr("test set"),
                             HasSubstr("has no examples"))));
  ps::DataConfig l;
  l.set_format(ps::DataConfig::LIBSVM);
  l.set_train_file(WriteFile(TempPath("train-for-empty.svm"), "1 1:1\n"));
  l.set_test_file(WriteFile(TempPath("empty-test.svm"), "# nothing\n"));
  EXPECT_THAT(LoadData(l, kTraining),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.test_file")));
}

TEST(LoadData, LoadsLibsvm) {
  ps::DataConfig c;
  c.set_format(ps::DataConfig::LIBSVM);
  c.set_train_file(WriteFile(TempPath("train.svm"), "1 1:1\n-1 2:1\n+1 3:1\n"));
  ASSERT_OK_AND_ASSIGN(LoadedData data, LoadData(c, kTraining));
  EXPECT_EQ(data.train->size(), 3);
  EXPECT_TRUE(data.train->is_sparse());
  EXPECT_EQ(data.train->num_classes(), 2);
  EXPECT_EQ(data.test, nullptr);

  c.set_test_file(WriteFile(TempPath("test.svm"), "0 1:1\n"));
  ASSERT_OK_AND_ASSIGN(data, LoadData(c, kTraining));
  ASSERT_NE(data.test, nullptr);
  EXPECT_EQ(data.test->size(), 1);
}

TEST(LoadData, LibsvmErrors) {
  ps::DataConfig c;
  c.set_format(ps::DataConfig::LIBSVM);
  EXPECT_THAT(LoadData(c, kTraining), StatusIs(absl::StatusCode::kInvalidArgument,
                                               "data.train_file is required for format LIBSVM"));
  c.set_train_file(WriteFile(TempPath("good.svm"), "1 1:1\n"));
  const std::string bad = WriteFile(TempPath("bad-test.svm"), "1 1:1\n1 2\n");
  c.set_test_file(bad);
  EXPECT_THAT(LoadData(c, kTraining),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("test set: " + bad + ":2:3: missing ':'"))));
}

TEST(LoadData, GeneratesSyntheticCtr) {
  ps::DataConfig c;
  c.set_format(ps::DataConfig::SYNTHETIC_CTR);
  c.mutable_synthetic()->set_num_train(3000);
  c.mutable_synthetic()->set_num_test(2000);
  ASSERT_OK_AND_ASSIGN(LoadedData data, LoadData(c, kTraining));
  EXPECT_EQ(data.train->size(), 3000);
  ASSERT_NE(data.test, nullptr);
  EXPECT_EQ(data.test->size(), 2000);
  EXPECT_TRUE(data.train->is_sparse());
  EXPECT_GT(data.ground_truth_auc, 0.7);
  EXPECT_LT(data.ground_truth_auc, 1.0);
  EXPECT_GT(data.ground_truth_log_loss, 0);
}

TEST(LoadData, SyntheticWithoutTestSet) {
  ps::DataConfig c;
  c.set_format(ps::DataConfig::SYNTHETIC_CTR);
  c.mutable_synthetic()->set_num_train(100);
  c.mutable_synthetic()->set_num_test(0);
  ASSERT_OK_AND_ASSIGN(LoadedData data, LoadData(c, kTraining));
  EXPECT_EQ(data.test, nullptr);
  EXPECT_EQ(data.ground_truth_auc, 0);
}

TEST(LoadData, SyntheticErrorsNameTheField) {
  ps::DataConfig c;
  c.set_format(ps::DataConfig::SYNTHETIC_CTR);
  c.mutable_synthetic()->set_num_fields(0);
  EXPECT_THAT(LoadData(c, kTraining), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("data.synthetic: num_fields must be")));
  c.mutable_synthetic()->set_num_fields(2);
  c.mutable_synthetic()->set_num_train(0);
  EXPECT_THAT(LoadData(c, kTraining),
              StatusIs(absl::StatusCode::kInvalidArgument, "data.synthetic.num_train must be > 0"));
}

}  // namespace
}  // namespace ps::worker
