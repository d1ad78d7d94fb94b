#include "server/storage/sst_check.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/env.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_writer.h"
#include "rocksdb/table.h"

namespace ps::server::storage {
namespace {

namespace fs = std::filesystem;
using ::ps::common::StatusIs;
using ::testing::HasSubstr;

class SstCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("sst_check_test_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a real table of `rows` rows with RocksDB and returns its bytes.
  std::string WriteTable(rocksdb::ChecksumType checksum, int rows) {
    rocksdb::Options options;
    rocksdb::BlockBasedTableOptions table;
    table.checksum = checksum;
    table.block_size = 4096;
    options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    rocksdb::SstFileWriter writer(rocksdb::EnvOptions(), options);
    const std::string path = (dir_ / "table.sst").string();
    EXPECT_TRUE(writer.Open(path).ok());
    for (int i = 0; i < rows; ++i) {
      EXPECT_TRUE(writer.Put(absl::StrFormat("key/%08d", i), std::string(100, 'a' + i % 26)).ok());
    }
    EXPECT_TRUE(writer.Finish().ok());
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  fs::path dir_;
};

TEST_F(SstCheckTest, GoodTableIsGoodFromBytesAndFromFile) {
  const std::string bytes = WriteTable(rocksdb::kCRC32c, 500);
  ASSERT_OK_AND_ASSIGN(SstCheck check, CheckSstBytes("t", bytes));
  EXPECT_EQ(check, SstCheck::kGood);
  ASSERT_OK_AND_ASSIGN(check, CheckSstFile((dir_ / "table.sst").string()));
  EXPECT_EQ(check, SstCheck::kGood);
}

TEST_F(SstCheckTest, OtherChecksumTypesAreUnchecked) {
  const std::string bytes = WriteTable(rocksdb::kXXH3, 50);
  ASSERT_OK_AND_ASSIGN(SstCheck check, CheckSstBytes("t", bytes));
  EXPECT_EQ(check, SstCheck::kUnchecked);
}

// The table structure is the tail of the file: index block, meta blocks (properties),
// metaindex block, footer. Every byte there, changed, is caught, except the footer's checksum
// type and format_version: then the check steps aside, and RocksDB refuses the file itself
// (a block checksum that does not match the type, or an unknown version).
TEST_F(SstCheckTest, EveryFlippedByteOfTheTableStructureIsDataLoss) {
  const std::string good = WriteTable(rocksdb::kCRC32c, 500);
  const size_t checksum_type = good.size() - 53;
  size_t caught = 0, unchecked = 0;
  size_t lowest_caught = good.size();
  size_t highest_missed = 0;
  for (size_t offset = good.size() - 1; offset + 4096 >= good.size() && offset > 0; --offset) {
    std::string bad = good;
    bad[offset] = static_cast<char>(bad[offset] ^ 0x80);
    absl::StatusOr<SstCheck> check = CheckSstBytes("t.sst", bad);
    if (!check.ok()) {
      EXPECT_THAT(check, StatusIs(absl::StatusCode::kDataLoss));
      EXPECT_THAT(std::string(check.status().message()), HasSubstr("SST file t.sst"));
      ++caught;
      lowest_caught = offset;
    } else if (*check == SstCheck::kUnchecked) {
      const bool format_version = offset >= good.size() - 12 && offset < good.size() - 8;
      EXPECT_TRUE(offset == checksum_type || format_version) << offset;
      ++unchecked;
    } else if (offset < good.size() - 52 || offset >= good.size() - 12) {
      // (In the footer's handles, setting a varint's continuation bit before a zero padding
      // byte encodes the same value: harmless to RocksDB as well.)
      highest_missed = std::max(highest_missed, offset);
    }
  }
  // The flips the check does not see all lie before the structure (in data blocks, which
  // RocksDB verifies before it parses them).
  EXPECT_LT(highest_missed, lowest_caught);
  EXPECT_GT(caught, 200u);
  EXPECT_LE(unchecked, 5u);
}

TEST_F(SstCheckTest, TruncatedOrForeignFilesAreDataLoss) {
  const std::string good = WriteTable(rocksdb::kCRC32c, 50);
  EXPECT_THAT(CheckSstBytes("t", good.substr(0, good.size() - 1)),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(CheckSstBytes("t", good.substr(0, good.size() / 2)),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(CheckSstBytes("t", "short"), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(CheckSstBytes("t", std::string(4096, '\0')), StatusIs(absl::StatusCode::kDataLoss));
}

TEST_F(SstCheckTest, MissingFileIsUnavailable) {
  EXPECT_THAT(CheckSstFile((dir_ / "none.sst").string()), StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace ps::server::storage
