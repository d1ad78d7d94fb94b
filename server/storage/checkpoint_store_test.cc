#include "server/storage/checkpoint_store.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "server/storage/checkpoint_store_test_util.h"

namespace ps::server::storage {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST_F(CheckpointStoreTest, RoundTripReturnsRecordsInKeyOrder) {
  OpenStore();
  ASSERT_OK_AND_ASSIGN(std::optional<CheckpointInfo> none, store_->Latest());
  EXPECT_FALSE(none.has_value());

  const Records records = MakeRecords(1, 50, 1000);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WriteCheckpoint(records, "step=42"));
  EXPECT_EQ(info.metadata, "step=42");
  EXPECT_EQ(info.num_records, 50u);
  uint64_t bytes = 0;
  for (const auto& [key, value] : records) bytes += key.size() + value.size();
  EXPECT_EQ(info.bytes, bytes);
  EXPECT_GT(info.unix_micros, 0);

  ASSERT_OK_AND_ASSIGN(std::optional<CheckpointInfo> latest, store_->Latest());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->id, info.id);
  EXPECT_EQ(latest->metadata, "step=42");
  EXPECT_EQ(latest->num_records, 50u);
  EXPECT_EQ(latest->bytes, bytes);
  EXPECT_EQ(latest->unix_micros, info.unix_micros);
  ASSERT_OK(store_->Verify(info.id));
  ASSERT_OK_AND_ASSIGN(Records read, ReadAll(info.id));
  EXPECT_EQ(read, records);
  EXPECT_GT(store_->ApproximateSizeBytes(), 50u * 1000);
}

TEST_F(CheckpointStoreTest, RoundTripWithRecordsThroughWal) {
  options_.wal_for_records = true;
  OpenStore();
  const Records records = MakeRecords(1, 20, 3000);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WriteCheckpoint(records));
  OpenStore();  // Reopen: records come back from the WAL.
  ASSERT_OK_AND_ASSIGN(Records read, ReadAll(info.id));
  EXPECT_EQ(read, records);
}

TEST_F(CheckpointStoreTest, EmptyCheckpointAndBinaryKeysRoundTrip) {
  OpenStore();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo empty, WriteCheckpoint({}));
  EXPECT_EQ(empty.num_records, 0u);
  ASSERT_OK(store_->Verify(empty.id));

  const Records binary = {{std::string(), "empty key"},
                          {std::string("\0\xff\x01", 3), std::string("\0\0", 2)},
                          {std::string(8, '\xff'), std::string()}};
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WriteCheckpoint(binary));
  ASSERT_OK_AND_ASSIGN(Records read, ReadAll(info.id));
  EXPECT_EQ(read, binary);
}

TEST_F(CheckpointStoreTest, LargeCheckpointSpansBatchesAndMemtables) {
  options_.write_batch_bytes = 1 << 20;
  OpenStore();
  const Records records = MakeRecords(1, 160, 512 << 10);  // 80 MB: more than one memtable.
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WriteCheckpoint(records));
  OpenStore();
  ASSERT_OK(store_->Verify(info.id));
  ASSERT_OK_AND_ASSIGN(Records read, ReadAll(info.id));
  EXPECT_TRUE(read == records);
}

TEST_F(CheckpointStoreTest, IdsIncreaseAcrossReopen) {
  OpenStore();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, WriteCheckpoint(MakeRecords(1, 3, 10)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> aborted, store_->BeginCheckpoint());
  const uint64_t aborted_id = aborted->id();
  EXPECT_GT(aborted_id, first.id);
  aborted->Abort();
  OpenStore();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo second, WriteCheckpoint(MakeRecords(2, 3, 10)));
  EXPECT_GT(second.id, aborted_id);
  OpenStore();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> third, store_->BeginCheckpoint());
  EXPECT_GT(third->id(), second.id);
}

TEST_F(CheckpointStoreTest, AbortedCheckpointIsInvisibleAndDeleted) {
  OpenStore();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, WriteCheckpoint(MakeRecords(1, 5, 100)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> writer, store_->BeginCheckpoint());
  for (const auto& [key, value] : MakeRecords(2, 7, 100)) ASSERT_OK(writer->Put(key, value));
  const uint64_t id = writer->id();
  writer->Abort();
  EXPECT_THAT(writer->Put("k", "v"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(writer->Commit(""), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(ListIds(), ElementsAre(first.id));
  EXPECT_THAT(store_->Verify(id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->CountRecordsForTest(), IsOkAndHolds(5u));
}

TEST_F(CheckpointStoreTest, WriterDestroyedWithoutCommitIsAborted) {
  OpenStore();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, WriteCheckpoint(MakeRecords(1, 5, 100)));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> writer, store_->BeginCheckpoint());
    for (const auto& [key, value] : MakeRecords(2, 7, 100)) ASSERT_OK(writer->Put(key, value));
  }
  EXPECT_THAT(ListIds(), ElementsAre(first.id));
  EXPECT_THAT(store_->CountRecordsForTest(), IsOkAndHolds(5u));
  // The slot is free again.
  ASSERT_OK_AND_ASSIGN(CheckpointInfo second, WriteCheckpoint(MakeRecords(3, 2, 10)));
  EXPECT_THAT(ListIds(), ElementsAre(first.id, second.id));
}

TEST_F(CheckpointStoreTest, AbandonedCheckpointIsDeletedOnReopen) {
  OpenStore();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, WriteCheckpoint(MakeRecords(1, 5, 100)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> writer, store_->BeginCheckpoint());
  for (const auto& [key, value] : MakeRecords(2, 7, 100)) ASSERT_OK(writer->Put(key, value));
  const uint64_t abandoned_id = writer->id();
  writer->AbandonForTest();  // As if the process died here.
  writer.reset();
  EXPECT_THAT(store_->CountRecordsForTest(), IsOkAndHolds(12u));
  EXPECT_THAT(ListIds(), ElementsAre(first.id));

  OpenStore();
  EXPECT_THAT(store_->CountRecordsForTest(), IsOkAndHolds(5u));
  EXPECT_THAT(ListIds(), ElementsAre(first.id));
  ASSERT_OK_AND_ASSIGN(Records read, ReadAll(first.id));
  EXPECT_EQ(read, MakeRecords(1, 5, 100));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo next, WriteCheckpoint(MakeRecords(3, 1, 10)));
  EXPECT_GT(next.id, abandoned_id);
}

TEST_F(CheckpointStoreTest, AbandonedCheckpointIsDeletedByNextBegin) {
  OpenStore();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> writer, store_->BeginCheckpoint());
  ASSERT_OK(writer->Put("a", "b"));
  writer->AbandonForTest();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> next, store_->BeginCheckpoint());
  EXPECT_THAT(store_->CountRecordsForTest(), IsOkAndHolds(0u));
}

// The child half of ProcessKilledMidCheckpointLeavesOnlyCompleteOnes: runs only when the test
// binary is re-executed with PS_CHECKPOINT_CRASH_DIR set.
TEST(CheckpointStoreCrashChild, WritesThenDies) {
  const char* dir = std::getenv("PS_CHECKPOINT_CRASH_DIR");
  if (dir == nullptr) GTEST_SKIP() << "only run as a child process";
  CheckpointStoreOptions options;
  options.path = dir;
  auto store = CheckpointStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  auto first = (*store)->BeginCheckpoint();
  ASSERT_TRUE(first.ok());
  for (const auto& [key, value] : MakeRecords(1, 10, 1000)) ASSERT_OK((*first)->Put(key, value));
  ASSERT_TRUE((*first)->Commit("first").ok());
  auto second = (*store)->BeginCheckpoint();
  ASSERT_TRUE(second.ok());
  // 96 MB: some records reach SST files through memtable flushes, the rest die in memory.
  for (const auto& [key, value] : MakeRecords(2, 96, 1 << 20)) {
    ASSERT_OK((*second)->Put(key, value));
  }
  raise(SIGKILL);
}

TEST_F(CheckpointStoreTest, ProcessKilledMidCheckpointLeavesOnlyCompleteOnes) {
  fs::create_directories(dir_);
  const pid_t pid = fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) {
    setenv("PS_CHECKPOINT_CRASH_DIR", options_.path.c_str(), 1);
    execl("/proc/self/exe", "checkpoint_store_test",
          "--gtest_filter=CheckpointStoreCrashChild.WritesThenDies", static_cast<char*>(nullptr));
    _exit(127);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "child did not die by SIGKILL; wait status " << wstatus;

  OpenStore();
  ASSERT_OK_AND_ASSIGN(std::optional<CheckpointInfo> latest, store_->Latest());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->metadata, "first");
  EXPECT_THAT(ListIds(), ElementsAre(latest->id));
  ASSERT_OK_AND_ASSIGN(Records read, ReadAll(latest->id));
  EXPECT_EQ(read, MakeRecords(1, 10, 1000));
  EXPECT_THAT(store_->CountRecordsForTest(), IsOkAndHolds(10u));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> next, store_->BeginCheckpoint());
  EXPECT_GT(next->id(), latest->id + 1);  // The dead checkpoint's id is not reused.
}

TEST_F(CheckpointStoreTest, RetentionKeepsNewestAndDeletesOlder) {
  options_.keep = 2;
  OpenStore();
  std::vector<uint64_t> ids;
  for (int i = 1; i <= 4; ++i) {
    ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WriteCheckpoint(MakeRecords(i, 10, 100 << 10)));
    ids.push_back(info.id);
  }
  EXPECT_THAT(ListIds(), ElementsAre(ids[2], ids[3]));
  EXPECT_THAT(store_->Verify(ids[0]), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->CountRecordsForTest(), IsOkAndHolds(20u));
  ASSERT_OK(store_->Verify(ids[2]));
  ASSERT_OK(store_->Verify(ids[3]));
  // The space of the deleted ones is reclaimed: about two checkpoints of 1 MB remain.
  EXPECT_LT(store_->ApproximateSizeBytes(), 3u << 20);
  EXPECT_LT(SstBytesOnDisk(), 3u << 20);

  // Lowering `keep` applies once the opener asks (after its restore), never to the newest
  // checkpoint; Open itself deletes nothing.
  options_.keep = 1;
  OpenStore();
  EXPECT_THAT(ListIds(), ElementsAre(ids[2], ids[3]));
  ASSERT_OK(store_->ApplyRetentionNow());
  EXPECT_THAT(ListIds(), ElementsAre(ids[3]));
  ASSERT_OK_AND_ASSIGN(Records read, ReadAll(ids[3]));
  EXPECT_EQ(read, MakeRecords(4, 10, 100 << 10));
}

// Found 2026-12-05 by a review: retention ran at Open, before the restore, so lowering
// `keep` in the same start as a restore of an older id deleted the checkpoint asked for. And
// found 2026-12-06: with the default restore of the newest, it deleted the older checkpoints
// before the restore found the newest damaged. Open now deletes no complete checkpoint.
TEST_F(CheckpointStoreTest, OpenDeletesNoCompleteCheckpoint) {
  options_.keep = 3;
  OpenStore();
  std::vector<uint64_t> ids;
  for (int i = 1; i <= 3; ++i) {
    ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WriteCheckpoint(MakeRecords(i, 10, 1000)));
    ids.push_back(info.id);
  }
  options_.keep = 1;
  OpenStore();
  EXPECT_THAT(ListIds(), ElementsAre(ids[0], ids[1], ids[2]));
  ASSERT_OK_AND_ASSIGN(Records read, ReadAll(ids[0]));
  EXPECT_EQ(read, MakeRecords(1, 10, 1000));
  // Restored: the newer ones are superseded and kept by the retention after the restore;
  // the next commit applies `keep`.
  ASSERT_OK(store_->MakeCurrent(ids[0]));
  ASSERT_OK(store_->ApplyRetentionNow());
  EXPECT_THAT(ListIds(), ElementsAre(ids[0], ids[1], ids[2]));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo next, WriteCheckpoint(MakeRecords(4, 10, 1000)));
  EXPECT_THAT(ListIds(), ElementsAre(next.id));
}

TEST_F(CheckpointStoreTest, MakeCurrentSupersedesNewerCheckpointsUntilRetentionCatchesUp) {
  options_.keep = 2;
  OpenStore();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo c1, WriteCheckpoint(MakeRecords(1, 3, 100)));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo c2, WriteCheckpoint(MakeRecords(2, 3, 100)));
  EXPECT_THAT(SupersededIds(), IsEmpty());
  EXPECT_THAT(store_->MakeCurrent(c2.id + 7), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(store_->MakeCurrent(c1.id));
  EXPECT_THAT(SupersededIds(), ElementsAre(c2.id));
  // Durable, and kept through retention while fewer than `keep` current ones are newer.
  OpenStore();
  EXPECT_THAT(SupersededIds(), ElementsAre(c2.id));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo c3, WriteCheckpoint(MakeRecords(3, 3, 100)));
  EXPECT_THAT(ListIds(), ElementsAre(c1.id, c2.id, c3.id));
  // Restoring the superseded one again undoes it, and supersedes what came after c1.
  ASSERT_OK(store_->MakeCurrent(c2.id));
  EXPECT_THAT(SupersededIds(), ElementsAre(c3.id));
  ASSERT_OK(store_->MakeCurrent(c1.id));
  EXPECT_THAT(SupersededIds(), ElementsAre(c2.id, c3.id));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo c4, WriteCheckpoint(MakeRecords(4, 3, 100)));
  EXPECT_THAT(ListIds(), ElementsAre(c1.id, c2.id, c3.id, c4.id));
  // c5 makes two current ones (c4, c5) newer than c1, c2 and c3.
  ASSERT_OK_AND_ASSIGN(CheckpointInfo c5, WriteCheckpoint(MakeRecords(5, 3, 100)));
  EXPECT_THAT(ListIds(), ElementsAre(c4.id, c5.id));
  EXPECT_THAT(SupersededIds(), IsEmpty());
  // A fresh start supersedes them all.
  ASSERT_OK(store_->MakeCurrent(0));
  EXPECT_THAT(SupersededIds(), ElementsAre(c4.id, c5.id));
}

TEST_F(CheckpointStoreTest, ACorruptRecordOfSupersededCheckpointsDeletesNothing) {
  options_.keep = 1;
  OpenStore();
  ASSERT_OK(WriteCheckpoint(MakeRecords(1, 3, 100)).status());
  ASSERT_OK_AND_ASSIGN(CheckpointInfo c2, WriteCheckpoint(MakeRecords(2, 3, 100)));
  EXPECT_THAT(ListIds(), ElementsAre(c2.id));
  ASSERT_OK(store_->PutSupersededRecordForTest("\x01\x02\x03\x04\x05"));
  EXPECT_THAT(store_->Superseded(), StatusIs(absl::StatusCode::kDataLoss));
  // Which one is current is unknown, so retention keeps them all; the store still opens.
  ASSERT_OK_AND_ASSIGN(CheckpointInfo c3, WriteCheckpoint(MakeRecords(3, 3, 100)));
  OpenStore();
  EXPECT_THAT(ListIds(), ElementsAre(c2.id, c3.id));
  // Making one current writes the record anew.
  ASSERT_OK(store_->MakeCurrent(c2.id));
  EXPECT_THAT(SupersededIds(), ElementsAre(c3.id));
}

TEST_F(CheckpointStoreTest, DuplicateKeyFailsCommitWithInvalidArgument) {
  OpenStore();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> writer, store_->BeginCheckpoint());
  ASSERT_OK(writer->Put("k", "v1"));
  ASSERT_OK(writer->Put("k", "v2"));
  EXPECT_THAT(writer->Commit(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ListIds(), ElementsAre());
  EXPECT_THAT(store_->CountRecordsForTest(), IsOkAndHolds(0u));
}

TEST_F(CheckpointStoreTest, OneWriterAtATime) {
  OpenStore();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> writer, store_->BeginCheckpoint());
  EXPECT_THAT(store_->BeginCheckpoint(), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(writer->Commit("").status());
  EXPECT_TRUE(store_->BeginCheckpoint().ok());
}

TEST_F(CheckpointStoreTest, ReadOfUnknownIdIsNotFoundAndVisitorErrorsPassThrough) {
  OpenStore();
  EXPECT_THAT(store_->Verify(7), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WriteCheckpoint(MakeRecords(1, 3, 10)));
  int calls = 0;
  absl::Status status = store_->Read(info.id, [&](absl::string_view, absl::string_view) {
    ++calls;
    return absl::CancelledError("stop");
  });
  EXPECT_EQ(status, absl::CancelledError("stop"));
  EXPECT_EQ(calls, 1);
}

TEST_F(CheckpointStoreTest, InvalidOptionsAreInvalidArgument) {
  options_.keep = 0;
  EXPECT_THAT(CheckpointStore::Open(options_), StatusIs(absl::StatusCode::kInvalidArgument));
  options_.keep = 1;
  options_.path = "";
  EXPECT_THAT(CheckpointStore::Open(options_), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CheckpointStoreTest, PathUnderRegularFileIsClearError) {
  // Tests run as root, so permission bits do not stop us; a parent that is a file does.
  fs::create_directories(dir_);
  const fs::path file = dir_ / "not_a_dir";
  std::ofstream(file) << "x";
  options_.path = (file / "db").string();
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(options_);
  EXPECT_THAT(store, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(options_.path));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("not a directory"));
}

TEST_F(CheckpointStoreTest, SecondOpenOfSameDirectoryIsUnavailable) {
  OpenStore();
  EXPECT_THAT(CheckpointStore::Open(options_), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(CheckpointStoreTest, ForeignRocksDbIsFailedPrecondition) {
  rocksdb::Options options;
  options.create_if_missing = true;
  fs::create_directories(dir_);
  {
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(options, options_.path, &db).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "someone", "else").ok());
    delete db;
  }
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(options_);
  EXPECT_THAT(store, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("not a checkpoint store"));
}

TEST_F(CheckpointStoreTest, ReadsDuringRetentionSeeWholeCheckpointsOrNone) {
  options_.keep = 1;
  OpenStore();
  ASSERT_OK(WriteCheckpoint(MakeRecords(0, 20, 4 << 10)).status());
  std::atomic<bool> done{false};
  std::atomic<int> verified{0};
  std::thread reader([&] {
    while (!done) {
      absl::StatusOr<std::optional<CheckpointInfo>> latest = store_->Latest();
      ASSERT_TRUE(latest.ok()) << latest.status();
      if (!latest->has_value()) continue;
      absl::Status status = store_->Verify((*latest)->id);
      ASSERT_TRUE(status.ok() || absl::IsNotFound(status)) << status;
      if (status.ok()) ++verified;
    }
  });
  for (int i = 1; i <= 20; ++i) {
    ASSERT_OK(WriteCheckpoint(MakeRecords(i, 20, 4 << 10)).status());
  }
  done = true;
  reader.join();
  EXPECT_GT(verified.load(), 0);
}

}  // namespace
}  // namespace ps::server::storage
