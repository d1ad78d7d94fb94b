#include "server/storage/spill_store.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server::storage {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::testing::HasSubstr;

class SpillStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.path =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name(), "/spill");
  }
  std::unique_ptr<SpillStore> Open(std::vector<std::string> tables = {"a", "b"}) {
    auto store = SpillStore::Open(options_, tables);
    EXPECT_THAT(store.status(), IsOk());
    return store.ok() ? *std::move(store) : nullptr;
  }
  // Every (key, value) of a snapshot of `t`.
  static std::map<uint64_t, std::string> Contents(SpillTable* t) {
    std::map<uint64_t, std::string> out;
    EXPECT_THAT(t->Snapshot()->ForEach([&](uint64_t key, absl::string_view value) {
      out[key] = std::string(value);
      return absl::OkStatus();
    }),
                IsOk());
    return out;
  }
  SpillStoreOptions options_;
};

TEST_F(SpillStoreTest, PutGetDeleteRoundTrip) {
  auto store = Open();
  SpillTable* t = store->table(0);
  EXPECT_EQ(t->name(), "a");
  std::string value;
  ASSERT_THAT(t->Get(7, &value).status(), IsOk());
  EXPECT_FALSE(*t->Get(7, &value));
  const std::string row("\x01\x02\0\x03", 4);
  ASSERT_THAT(t->Put(7, row), IsOk());
  ASSERT_TRUE(*t->Get(7, &value));
  EXPECT_EQ(value, row);
  ASSERT_THAT(t->Put(7, "other"), IsOk());
  ASSERT_TRUE(*t->Get(7, &value));
  EXPECT_EQ(value, "other");
  ASSERT_THAT(t->Delete(7), IsOk());
  EXPECT_FALSE(*t->Get(7, &value));
  ASSERT_THAT(t->Delete(12345), IsOk());  // absent: fine
}

TEST_F(SpillStoreTest, TablesAreSeparate) {
  auto store = Open();
  ASSERT_THAT(store->table(0)->Put(1, "in a"), IsOk());
  std::string value;
  EXPECT_FALSE(*store->table(1)->Get(1, &value));
  EXPECT_EQ(Contents(store->table(1)).size(), 0u);
}

TEST_F(SpillStoreTest, SnapshotSeesTheTableAsItWas) {
  auto store = Open();
  SpillTable* t = store->table(0);
  ASSERT_THAT(t->Put(3, "three"), IsOk());
  ASSERT_THAT(t->Put(1, "one"), IsOk());
  ASSERT_THAT(t->Put(~uint64_t{0}, "max"), IsOk());
  std::unique_ptr<SpillSnapshot> snapshot = t->Snapshot();
  ASSERT_THAT(t->Put(2, "two"), IsOk());
  ASSERT_THAT(t->Delete(3), IsOk());
  ASSERT_THAT(t->Put(1, "uno"), IsOk());
  std::vector<std::pair<uint64_t, std::string>> seen;
  ASSERT_THAT(snapshot->ForEach([&](uint64_t key, absl::string_view value) {
    seen.emplace_back(key, std::string(value));
    return absl::OkStatus();
  }),
              IsOk());
  // In numeric key order, as of the snapshot.
  EXPECT_EQ(seen, (std::vector<std::pair<uint64_t, std::string>>{
                      {1, "one"}, {3, "three"}, {~uint64_t{0}, "max"}}));
  EXPECT_EQ(Contents(t),
            (std::map<uint64_t, std::string>{{1, "uno"}, {2, "two"}, {~uint64_t{0}, "max"}}));
}

TEST_F(SpillStoreTest, SnapshotStopsAtTheVisitorsError) {
  auto store = Open();
  ASSERT_THAT(store->table(0)->Put(1, "x"), IsOk());
  ASSERT_THAT(store->table(0)->Put(2, "y"), IsOk());
  int calls = 0;
  EXPECT_THAT(store->table(0)->Snapshot()->ForEach([&](uint64_t, absl::string_view) {
    ++calls;
    return absl::CancelledError("enough");
  }),
              StatusIs(absl::StatusCode::kCancelled, "enough"));
  EXPECT_EQ(calls, 1);
}

TEST_F(SpillStoreTest, ReadsFromFilesAfterFlush) {
  auto store = Open();
  for (uint64_t k = 0; k < 1000; ++k)
    ASSERT_THAT(store->table(1)->Put(k, std::string(100, 'a' + k % 26)), IsOk());
  ASSERT_THAT(store->FlushForTest(), IsOk());
  std::string value;
  ASSERT_TRUE(*store->table(1)->Get(999, &value));
  EXPECT_EQ(value, std::string(100, 'a' + 999 % 26));
  EXPECT_FALSE(*store->table(1)->Get(1000, &value));
  EXPECT_EQ(Contents(store->table(1)).size(), 1000u);
  EXPECT_GT(store->ApproximateSizeBytes(), 100000u);
}

TEST_F(SpillStoreTest, CorruptValueIsDataLossNamingTheKey) {
  auto store = Open();
  ASSERT_THAT(store->table(0)->Put(41, "fine"), IsOk());
  ASSERT_THAT(store->table(0)->Put(42, "fine"), IsOk());
  // A flipped bit in the value (the first 4 bytes are the checksum).
  ASSERT_THAT(store->PutRawForTest(0, 42, std::string("\0\0\0\0fine", 8)), IsOk());
  std::string value;
  EXPECT_THAT(store->table(0)->Get(42, &value).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("key 42")));
  EXPECT_THAT(store->table(0)->Snapshot()->ForEach(
                  [](uint64_t, absl::string_view) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("key 42")));
  // Too short to hold a checksum.
  ASSERT_THAT(store->PutRawForTest(0, 41, "ab"), IsOk());
  EXPECT_THAT(store->table(0)->Get(41, &value).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("key 41")));
}

TEST_F(SpillStoreTest, ReopenStartsEmpty) {
  {
    auto store = Open();
    ASSERT_THAT(store->table(0)->Put(5, "stale"), IsOk());
    ASSERT_THAT(store->FlushForTest(), IsOk());
  }
  auto store = Open();
  std::string value;
  EXPECT_FALSE(*store->table(0)->Get(5, &value));
}

TEST_F(SpillStoreTest, LeftoversOfACrashedProcessAreDeleted) {
  // What a killed process leaves: a database with rows (the destructor never ran). Simulated
  // by a store whose files are copied aside before it is closed.
  {
    auto store = Open();
    ASSERT_THAT(store->table(0)->Put(5, "stale"), IsOk());
    ASSERT_THAT(store->FlushForTest(), IsOk());
    ASSERT_EQ(std::system(("cp -r " + options_.path + "/db " + options_.path + "/db.copy").c_str()),
              0);
  }
  ASSERT_EQ(std::system(("mv " + options_.path + "/db.copy " + options_.path + "/db").c_str()), 0);
  auto store = Open();
  std::string value;
  EXPECT_FALSE(*store->table(0)->Get(5, &value));
  EXPECT_EQ(Contents(store->table(0)).size(), 0u);
}

TEST_F(SpillStoreTest, SecondOpenOfTheSameDirectoryIsRefused) {
  auto store = Open();
  ASSERT_THAT(store->table(0)->Put(5, "mine"), IsOk());
  EXPECT_THAT(SpillStore::Open(options_, {"a"}).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(options_.path)));
  // The first store was not disturbed.
  std::string value;
  ASSERT_TRUE(*store->table(0)->Get(5, &value));
  EXPECT_EQ(value, "mine");
}

TEST_F(SpillStoreTest, BadOptionsAreRefused) {
  EXPECT_THAT(SpillStore::Open(SpillStoreOptions{}, {"a"}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SpillStore::Open(options_, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SpillStore::Open(options_, {"a", "a"}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'a'")));
}

TEST_F(SpillStoreTest, PathUnderARegularFileIsAnError) {
  const std::string file = absl::StrCat(std::getenv("TEST_TMPDIR"), "/plain_file");
  std::ofstream(file) << "x";
  options_.path = file + "/spill";
  auto store = SpillStore::Open(options_, {"a"});
  EXPECT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr(options_.path));
}

TEST_F(SpillStoreTest, DestructorDeletesTheData) {
  {
    auto store = Open();
    ASSERT_THAT(store->table(0)->Put(1, "x"), IsOk());
  }
  struct stat st;
  EXPECT_NE(stat((options_.path + "/db/CURRENT").c_str(), &st), 0);
}

}  // namespace
}  // namespace ps::server::storage
