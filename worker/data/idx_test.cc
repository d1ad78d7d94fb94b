#include "worker/data/idx.h"

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/batch.h"
#include "worker/data/dataset.h"
#include "worker/data/test_files.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using test_files::IdxBytes;
using test_files::TempPath;
using test_files::WriteFile;
using test_files::WriteGzipFile;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint8_t kUbyte = 0x08;
constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist/";

// Three 2x2 images with pixels (0, 51, 102, 255) + i, labels 0, 4, 2.
std::string Images() {
  return IdxBytes(kUbyte, {3, 2, 2},
                  std::string("\0\x33\x66\xff"
                              "\1\x34\x67\xff"
                              "\2\x35\x68\xff",
                              12));
}
std::string Labels() { return IdxBytes(kUbyte, {3}, std::string("\0\4\2", 3)); }

struct Files {
  std::string images;
  std::string labels;
};

Files WritePlain(const std::string& prefix, const std::string& images, const std::string& labels) {
  return {WriteFile(TempPath(prefix + "-images-idx3-ubyte"), images),
          WriteFile(TempPath(prefix + "-labels-idx1-ubyte"), labels)};
}

void ExpectSmallDataset(const Dataset& d) {
  EXPECT_EQ(d.size(), 3);
  EXPECT_FALSE(d.is_sparse());
  EXPECT_EQ(d.feature_dim(), 4);
  EXPECT_EQ(d.num_classes(), 5);  // inferred: largest label 4, + 1
  Batch batch;
  d.FillBatch(std::vector<int64_t>{0, 1, 2}, &batch);
  EXPECT_THAT(batch.class_labels, ElementsAre(0, 4, 2));
  EXPECT_THAT(batch.dense, ElementsAre(0.0f, 0.2f, 0.4f, 1.0f,                       //
                                       1 / 255.0f, 52 / 255.0f, 103 / 255.0f, 1.0f,  //
                                       2 / 255.0f, 53 / 255.0f, 104 / 255.0f, 1.0f));
}

TEST(LoadIdxDataset, LoadsPlainFiles) {
  const Files f = WritePlain("plain", Images(), Labels());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadIdxDataset(f.images, f.labels, 255));
  ExpectSmallDataset(*d);
}

TEST(LoadIdxDataset, LoadsGzipFiles) {
  const std::string images = WriteGzipFile(TempPath("gz-images-idx3-ubyte.gz"), Images());
  const std::string labels = WriteGzipFile(TempPath("gz-labels-idx1-ubyte.gz"), Labels());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadIdxDataset(images, labels, 255));
  ExpectSmallDataset(*d);
}

TEST(LoadIdxDataset, ScalesPixels) {
  const Files f = WritePlain("scale", Images(), Labels());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadIdxDataset(f.images, f.labels, 0.5f));
  Batch batch;
  d->FillBatch(std::vector<int64_t>{0}, &batch);
  EXPECT_THAT(batch.dense, ElementsAre(0, 102, 204, 510));
}

TEST(LoadIdxDataset, AcceptsTwoDimensionalImages) {
  const Files f = WritePlain("flat", IdxBytes(kUbyte, {3, 4}, std::string(12, '\x10')), Labels());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadIdxDataset(f.images, f.labels, 16));
  EXPECT_EQ(d->feature_dim(), 4);
}

TEST(LoadIdxDataset, GivenNumClassesIsReported) {
  const Files f = WritePlain("classes", Images(), Labels());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadIdxDataset(f.images, f.labels, 255, 10));
  EXPECT_EQ(d->num_classes(), 10);
}

TEST(LoadIdxDataset, LabelOutOfRangeNamesFileAndByte) {
  const Files f = WritePlain("range", Images(), Labels());
  // Label 4 is the second label: byte 8 (header) + 1.
  EXPECT_THAT(
      LoadIdxDataset(f.images, f.labels, 255, 4),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(f.labels), HasSubstr("byte 9: label 4 is out of range [0, 4)"))));
}

TEST(LoadIdxDataset, MissingFilesAreNotFound) {
  const Files f = WritePlain("missing", Images(), Labels());
  EXPECT_THAT(LoadIdxDataset(TempPath("nope-images"), f.labels, 255),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope-images")));
  EXPECT_THAT(LoadIdxDataset(f.images, TempPath("nope-labels"), 255),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope-labels")));
}

TEST(LoadIdxDataset, BadMagic) {
  std::string images = Images();
  images[0] = 0x1f;
  const Files f = WritePlain("magic", images, Labels());
  EXPECT_THAT(LoadIdxDataset(f.images, f.labels, 255),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(f.images), HasSubstr("byte 0: bad magic 0x1f000803"))));
}

TEST(LoadIdxDataset, UnsupportedTypeCode) {
  const Files f = WritePlain("type", Images(), IdxBytes(0x0D, {3}, std::string(12, '\0')));
  EXPECT_THAT(
      LoadIdxDataset(f.images, f.labels, 255),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(f.labels), HasSubstr("byte 2: element type 0x0d (float32)"))));
}

TEST(LoadIdxDataset, WrongNumberOfDimensions) {
  const Files labels2d = WritePlain("dims-labels", Images(), IdxBytes(kUbyte, {3, 1}, "\0\4\2"));
  EXPECT_THAT(
      LoadIdxDataset(labels2d.images, labels2d.labels, 255),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(labels2d.labels), HasSubstr("byte 3: 2 dimensions, want 1"))));
  const Files images1d =
      WritePlain("dims-images", IdxBytes(kUbyte, {3}, std::string(3, '\0')), Labels());
  EXPECT_THAT(
      LoadIdxDataset(images1d.images, images1d.labels, 255),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(images1d.images), HasSubstr("1 dimensions, want 2 to 255"))));
}

TEST(LoadIdxDataset, ZeroSizedImageDimension) {
  const Files f = WritePlain("zero", IdxBytes(kUbyte, {3, 0, 2}, ""), Labels());
  EXPECT_THAT(LoadIdxDataset(f.images, f.labels, 255),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("byte 8: dimension 1 is 0")));
}

TEST(LoadIdxDataset, TruncatedDataIsDataLoss) {
  const std::string images = Images();
  const Files f = WritePlain("trunc", images.substr(0, images.size() - 1), Labels());
  EXPECT_THAT(LoadIdxDataset(f.images, f.labels, 255),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(f.images), HasSubstr("byte 16: truncated pixels"),
                             HasSubstr("ends at byte 27"))));
  const Files gz = {WriteGzipFile(TempPath("trunc-images.gz"), images.substr(0, 10)), f.labels};
  EXPECT_THAT(
      LoadIdxDataset(gz.images, gz.labels, 255),
      StatusIs(absl::StatusCode::kDataLoss,
               AllOf(HasSubstr("byte 4: truncated IDX dimensions"), HasSubstr("ends at byte 10"))));
}

// A header is untrusted: one declaring more data than memory holds, in a small gzip file
// that decompresses to as much of it as asked, grew the arrays until the OOM killer came.
// Refused from the header, before a byte of data is read (so not DATA_LOSS for the missing
// data either).
TEST(LoadIdxDataset, DataDeclaredBeyondMemoryIsRefusedBeforeItIsRead) {
  constexpr uint64_t kLimit = 1 << 20;
  // 2^19 labels (2 MiB as int32), no data behind them.
  const Files labels = WritePlain("big-labels", Images(), IdxBytes(kUbyte, {1u << 19}, ""));
  EXPECT_THAT(LoadIdxDataset(labels.images, labels.labels, 255, 0, kLimit),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr(labels.labels), HasSubstr("524288 labels"),
                             HasSubstr("GiB of memory"))));
  // 3 labels but images of 1000 x 1000 pixels (12 MB as floats), pixels absent.
  const Files images = WritePlain("big-images", IdxBytes(kUbyte, {3, 1000, 1000}, ""), Labels());
  EXPECT_THAT(LoadIdxDataset(images.images, images.labels, 255, 0, kLimit),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr(images.images), HasSubstr("3 images of 1000000 pixels"))));
  // Within the limit, the same files are read (and found truncated).
  EXPECT_THAT(LoadIdxDataset(images.images, images.labels, 255, 0, 64 << 20),
              StatusIs(absl::StatusCode::kDataLoss));
  // The default limit is this machine's memory: the small set loads.
  const Files small = WritePlain("small-default-limit", Images(), Labels());
  EXPECT_TRUE(LoadIdxDataset(small.images, small.labels, 255).ok());
}

TEST(LoadIdxDataset, EmptyFileIsDataLoss) {
  const Files f = WritePlain("empty", Images(), "");
  EXPECT_THAT(LoadIdxDataset(f.images, f.labels, 255),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("byte 0: truncated IDX magic")));
}

TEST(LoadIdxDataset, CountMismatchNamesBothFiles) {
  const Files f = WritePlain("count", Images(), IdxBytes(kUbyte, {2}, std::string("\0\1", 2)));
  EXPECT_THAT(LoadIdxDataset(f.images, f.labels, 255),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(f.images), HasSubstr(f.labels), HasSubstr("3 images, but"),
                             HasSubstr("has 2 labels"))));
}

TEST(LoadIdxDataset, TrailingBytesAreInvalid) {
  const Files f = WritePlain("trailing", Images() + "x", Labels());
  EXPECT_THAT(LoadIdxDataset(f.images, f.labels, 255),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(f.images), HasSubstr("byte 28: unexpected data"))));
}

TEST(LoadIdxDataset, RejectsBadPixelScale) {
  const Files f = WritePlain("pixel", Images(), Labels());
  EXPECT_THAT(LoadIdxDataset(f.images, f.labels, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pixel_scale")));
  EXPECT_THAT(LoadIdxDataset(f.images, f.labels, -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pixel_scale")));
  // So small that a lit pixel over it overflows float32 (every one was +inf before 2026-12-05).
  EXPECT_THAT(LoadIdxDataset(f.images, f.labels, 1e-38f),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pixel_scale")));
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

TEST(LoadIdxDataset, LoadsFashionMnistTestSet) {
  const std::string images = std::string(kFashionMnistDir) + "t10k-images-idx3-ubyte.gz";
  const std::string labels = std::string(kFashionMnistDir) + "t10k-labels-idx1-ubyte.gz";
  if (!Exists(images) || !Exists(labels)) GTEST_SKIP() << "Fashion-MNIST is not installed";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadIdxDataset(images, labels, 255));
  EXPECT_EQ(d->size(), 10000);
  EXPECT_EQ(d->feature_dim(), 784);
  EXPECT_EQ(d->num_classes(), 10);
  std::vector<int64_t> all(d->size());
  for (int64_t i = 0; i < d->size(); ++i) all[i] = i;
  Batch batch;
  d->FillBatch(all, &batch);
  std::map<int32_t, int> per_class;
  for (int32_t label : batch.class_labels) ++per_class[label];
  ASSERT_EQ(per_class.size(), 10u);
  for (const auto& [label, count] : per_class) EXPECT_EQ(count, 1000) << "class " << label;
  float lo = 1, hi = 0;
  for (float v : batch.dense) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
}

TEST(LoadIdxDataset, LoadsFashionMnistTrainSet) {
  const std::string images = std::string(kFashionMnistDir) + "train-images-idx3-ubyte.gz";
  const std::string labels = std::string(kFashionMnistDir) + "train-labels-idx1-ubyte.gz";
  if (!Exists(images) || !Exists(labels)) GTEST_SKIP() << "Fashion-MNIST is not installed";
  const absl::Time start = absl::Now();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadIdxDataset(images, labels, 255));
  std::cout << "Fashion-MNIST train set (60000) loaded in " << absl::Now() - start << "\n";
  EXPECT_EQ(d->size(), 60000);
  EXPECT_EQ(d->feature_dim(), 784);
  EXPECT_EQ(d->num_classes(), 10);
}

}  // namespace
}  // namespace ps::worker
