#include "worker/data/libsvm.h"

#include <memory>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/batch.h"
#include "worker/data/dataset.h"
#include "worker/data/test_files.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using test_files::TempPath;
using test_files::WriteFile;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

Batch All(const Dataset& d) {
  std::vector<int64_t> indices(d.size());
  for (int64_t i = 0; i < d.size(); ++i) indices[i] = i;
  Batch batch;
  d.FillBatch(indices, &batch);
  return batch;
}

constexpr char kBinary[] =
    "# a comment line\n"
    "+1 1:0.5 3:-2\n"
    "\n"
    "-1\t7:1e3   # trailing comment\n"
    "   \r\n"
    "0 qid:4 18446744073709551615:1\r\n"
    "1.0 2:.25 2:1\n"
    "1 5:3";  // no final newline

void ExpectBinary(const Dataset& d) {
  EXPECT_TRUE(d.is_sparse());
  EXPECT_EQ(d.num_classes(), 2);
  EXPECT_EQ(d.feature_dim(), 0);
  ASSERT_EQ(d.size(), 5);
  const Batch b = All(d);
  EXPECT_THAT(b.binary_labels, ElementsAre(1, 0, 0, 1, 1));
  EXPECT_THAT(b.class_labels, IsEmpty());
  EXPECT_THAT(b.offsets, ElementsAre(0, 2, 3, 4, 6, 7));
  EXPECT_THAT(b.feature_ids, ElementsAre(1, 3, 7, 18446744073709551615ull, 2, 2, 5));
  EXPECT_THAT(b.feature_values, ElementsAre(0.5f, -2.0f, 1000.0f, 1.0f, 0.25f, 1.0f, 3.0f));
}

TEST(LoadLibsvmDataset, ParsesBinaryFile) {
  const std::string path = WriteFile(TempPath("binary.svm"), kBinary);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadLibsvmDataset(path, {}));
  ExpectBinary(*d);
}

TEST(LoadLibsvmDataset, ParsesGzipFile) {
  const std::string path = test_files::WriteGzipFile(TempPath("binary.svm.gz"), kBinary);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadLibsvmDataset(path, {}));
  ExpectBinary(*d);
}

TEST(LoadLibsvmDataset, EmptyFileGivesEmptyDataset) {
  const std::string path = WriteFile(TempPath("empty.svm"), "# nothing\n\n");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadLibsvmDataset(path, {}));
  EXPECT_EQ(d->size(), 0);
}

TEST(LoadLibsvmDataset, MultiClassInfersNumClasses) {
  const std::string path = WriteFile(TempPath("multi.svm"), "0 1:1\n3 2:1\n2\n");
  LibsvmOptions options;
  options.multiclass = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadLibsvmDataset(path, options));
  EXPECT_EQ(d->num_classes(), 4);
  const Batch b = All(*d);
  EXPECT_THAT(b.class_labels, ElementsAre(0, 3, 2));
  EXPECT_THAT(b.binary_labels, IsEmpty());
  EXPECT_THAT(b.offsets, ElementsAre(0, 1, 2, 2));
}

TEST(LoadLibsvmDataset, MultiClassChecksGivenNumClasses) {
  const std::string path = WriteFile(TempPath("multi-range.svm"), "0 1:1\n3 2:1\n");
  LibsvmOptions options;
  options.multiclass = true;
  options.num_classes = 5;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadLibsvmDataset(path, options));
  EXPECT_EQ(d->num_classes(), 5);
  options.num_classes = 3;
  EXPECT_THAT(
      LoadLibsvmDataset(path, options),
      StatusIs(absl::StatusCode::kInvalidArgument, path + ":2:1: label 3 is out of range [0, 3)"));
  options.num_classes = 1;
  EXPECT_THAT(LoadLibsvmDataset(path, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_classes")));
}

// A small gzip file can decompress to more examples than memory holds; the arrays grew until
// the OOM killer came. Now the load stops where the data would pass the limit.
TEST(LoadLibsvmDataset, DataBeyondTheMemoryLimitIsResourceExhausted) {
  std::string text;
  for (int i = 0; i < 50000; ++i) text += "1 1:1 2:1 3:1 4:1\n";  // 50k x 4 features
  const std::string path = test_files::WriteGzipFile(TempPath("many.svm.gz"), text);
  LibsvmOptions options;
  options.max_memory_bytes = 1 << 20;  // the data takes about 2.8 MB
  EXPECT_THAT(LoadLibsvmDataset(path, options),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("many.svm.gz:"), HasSubstr("GiB of memory"))));
  options.max_memory_bytes = 16 << 20;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> d, LoadLibsvmDataset(path, options));
  EXPECT_EQ(d->size(), 50000);
  // One line of 600 KB of spaces, beyond a quarter of the limit.
  const std::string wide = test_files::WriteGzipFile(
      TempPath("wide.svm.gz"), "1 1:1\n1" + std::string(600 << 10, ' ') + "\n");
  options.max_memory_bytes = 2 << 20;
  EXPECT_THAT(LoadLibsvmDataset(wide, options),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("wide.svm.gz: byte 6: a line longer than 524288 bytes")));
}

TEST(LoadLibsvmDataset, MissingFileIsNotFound) {
  EXPECT_THAT(LoadLibsvmDataset(TempPath("absent.svm"), {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent.svm")));
}

// Each bad line, loaded after a good line and a comment, gives exactly this message.
struct BadLine {
  const char* line;
  LibsvmOptions options;
  const char* message;  // after "<path>:3:"
};

class LibsvmErrorTest : public ::testing::TestWithParam<BadLine> {};

TEST_P(LibsvmErrorTest, NamesFileLineColumnAndProblem) {
  const BadLine& bad = GetParam();
  const std::string path =
      WriteFile(TempPath("bad.svm"), std::string("1 1:1\n# comment\n") + bad.line + "\n");
  EXPECT_THAT(LoadLibsvmDataset(path, bad.options),
              StatusIs(absl::StatusCode::kInvalidArgument, path + ":3:" + bad.message));
}

LibsvmOptions MultiClass() {
  LibsvmOptions options;
  options.multiclass = true;
  return options;
}

INSTANTIATE_TEST_SUITE_P(
    Errors, LibsvmErrorTest,
    ::testing::Values(
        BadLine{"yes 1:1", {}, "1: bad label 'yes': want +1, 1, 0 or -1 (binary)"},
        BadLine{"2 1:1", {}, "1: bad label '2': want +1, 1, 0 or -1 (binary)"},
        BadLine{"+-1 1:1", {}, "1: bad label '+-1': want +1, 1, 0 or -1 (binary)"},
        BadLine{"1.5 1:1", MultiClass(),
                "1: bad label '1.5': want a non-negative integer class (multi-class)"},
        BadLine{"-1 1:1", MultiClass(),
                "1: bad label '-1': want a non-negative integer class (multi-class)"},
        BadLine{"1 1:1  42", {}, "8: missing ':' in feature '42' (want index:value)"},
        BadLine{"1 x:1", {}, "3: bad feature index 'x': want an unsigned 64-bit integer"},
        BadLine{"1 -3:1", {}, "3: bad feature index '-3': want an unsigned 64-bit integer"},
        BadLine{"1 :1", {}, "3: bad feature index '': want an unsigned 64-bit integer"},
        BadLine{"1 18446744073709551616:1",
                {},
                "3: bad feature index '18446744073709551616': want an unsigned 64-bit integer"},
        BadLine{"1 4:abc", {}, "5: bad feature value 'abc': want a number"},
        BadLine{"1 4:", {}, "4: bad feature value '': want a number"},
        BadLine{"1 4:1.5x", {}, "5: bad feature value '1.5x': want a number"},
        BadLine{"1 2:1 4:inf", {}, "9: non-finite feature value 'inf'"},
        BadLine{"1 4:nan", {}, "5: non-finite feature value 'nan'"},
        BadLine{"1 4:1e999", {}, "5: non-finite feature value '1e999'"}));

}  // namespace
}  // namespace ps::worker
