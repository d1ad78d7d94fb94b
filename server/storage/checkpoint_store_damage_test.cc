// The checkpoint store against damage: corrupt, truncated, missing or foreign files, and a
// file system that fails (disk full, a failed sync). Each is refused with a precise status
// and never loaded or crashed on, and what is still whole stays readable.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/options.h"
#include "server/storage/checkpoint_store.h"
#include "server/storage/checkpoint_store_test_util.h"

namespace ps::server::storage {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(CheckpointStoreTest, BadChecksumIsDataLossAndOlderCheckpointStillReads) {
  OpenStore();
  const Records good = MakeRecords(1, 10, 100);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, WriteCheckpoint(good));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo second, WriteCheckpoint(MakeRecords(2, 10, 100)));
  // Same key and length, one flipped bit, stale checksum: what a bit flip on disk looks like.
  std::string damaged = MakeRecords(2, 10, 100).at("table/5");
  const uint32_t stale_crc = 0x12345678;
  damaged[50] ^= 0x04;
  ASSERT_OK(store_->PutRawRecordForTest(second.id, "table/5", damaged, stale_crc));

  absl::Status verify = store_->Verify(second.id);
  EXPECT_THAT(verify, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(verify.message()), HasSubstr(absl::StrCat("checkpoint ", second.id)));
  EXPECT_THAT(std::string(verify.message()), HasSubstr("table/5"));
  EXPECT_THAT(std::string(verify.message()), HasSubstr(options_.path));

  std::vector<std::string> visited;
  absl::Status read = store_->Read(second.id, [&](absl::string_view key, absl::string_view) {
    visited.emplace_back(key);
    return absl::OkStatus();
  });
  EXPECT_THAT(read, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(read.message()), HasSubstr("table/5"));
  for (const std::string& key : visited) EXPECT_LT(key, "table/5");  // Nothing at or after it.

  ASSERT_OK(store_->Verify(first.id));
  ASSERT_OK_AND_ASSIGN(Records read_first, ReadAll(first.id));
  EXPECT_EQ(read_first, good);
}

TEST_F(CheckpointStoreTest, MissingRecordIsDataLoss) {
  OpenStore();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WriteCheckpoint(MakeRecords(1, 10, 100)));
  ASSERT_OK(store_->DeleteRecordForTest(info.id, "table/3"));
  absl::Status status = store_->Verify(info.id);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(status.message()), HasSubstr("9 records"));
  EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat("checkpoint ", info.id)));
  EXPECT_THAT(store_->Read(info.id, [](auto, auto) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kDataLoss));
}

TEST_F(CheckpointStoreTest, ExtraOrReplacedRecordIsDataLoss) {
  OpenStore();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WriteCheckpoint(MakeRecords(1, 10, 100)));
  ASSERT_OK(store_->PutRawRecordForTest(info.id, "table/99", "intruder", std::nullopt));
  absl::Status extra = store_->Verify(info.id);
  EXPECT_THAT(extra, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(extra.message()), HasSubstr("table/99"));

  ASSERT_OK(store_->DeleteRecordForTest(info.id, "table/99"));
  ASSERT_OK(store_->Verify(info.id));
  // A consistent (key, value, checksum) that is not the one committed: only the hash sees it.
  ASSERT_OK(store_->PutRawRecordForTest(info.id, "table/4", "replaced", std::nullopt));
  EXPECT_THAT(store_->Verify(info.id), StatusIs(absl::StatusCode::kDataLoss));
}

TEST_F(CheckpointStoreTest, FlippedByteInSstFileIsDataLoss) {
  OpenStore();
  const Records good = MakeRecords(1, 8, 64 << 10);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, WriteCheckpoint(good));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo second, WriteCheckpoint(MakeRecords(2, 8, 64 << 10)));
  store_.reset();  // Close: everything is in SST files and the WAL.

  ASSERT_EQ(SstFilesContaining("<ckpt1:").size(), 1u);
  ASSERT_NE(SstFilesContaining("<ckpt1:")[0], SstFilesContaining("<ckpt2:")[0])
      << "checkpoints 1 and 2 should live in different files";
  FlipByteAfter("<ckpt2:table/6>");

  OpenStore();
  absl::Status verify = store_->Verify(second.id);
  EXPECT_THAT(verify, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(verify.message()), HasSubstr(absl::StrCat("checkpoint ", second.id)));
  EXPECT_THAT(std::string(verify.message()),
              HasSubstr("table/5"));  // The last good key before table/6.
  int visited_after = 0;
  absl::Status read = store_->Read(second.id, [&](absl::string_view key, absl::string_view) {
    if (key >= "table/6") ++visited_after;
    return absl::OkStatus();
  });
  EXPECT_THAT(read, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(visited_after, 0);

  ASSERT_OK(store_->Verify(first.id));
  ASSERT_OK_AND_ASSIGN(Records read_first, ReadAll(first.id));
  EXPECT_EQ(read_first, good);
}

TEST_F(CheckpointStoreTest, CorruptOldCheckpointDoesNotStopNewOnes) {
  options_.keep = 1;
  OpenStore();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, WriteCheckpoint(MakeRecords(1, 8, 64 << 10)));
  store_.reset();
  FlipByteAfter("<ckpt1:table/3>");
  OpenStore();
  EXPECT_THAT(store_->Verify(first.id), StatusIs(absl::StatusCode::kDataLoss));
  // Retention deletes the corrupt checkpoint without reading it.
  const Records later = MakeRecords(2, 8, 64 << 10);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo second, WriteCheckpoint(later));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo third, WriteCheckpoint(MakeRecords(3, 2, 10)));
  EXPECT_THAT(ListIds(), ElementsAre(third.id));
  OpenStore();
  ASSERT_OK(store_->Verify(third.id));
  EXPECT_GT(third.id, second.id);
}

TEST_F(CheckpointStoreTest, TruncatedSstFileFailsOpenWithDataLoss) {
  OpenStore();
  ASSERT_OK(WriteCheckpoint(MakeRecords(1, 8, 64 << 10)).status());
  ASSERT_OK(WriteCheckpoint(MakeRecords(2, 8, 64 << 10)).status());
  store_.reset();
  std::vector<fs::path> files = SstFilesContaining("<ckpt2:");
  ASSERT_EQ(files.size(), 1u);
  fs::resize_file(files[0], fs::file_size(files[0]) / 2);

  // RocksDB (paranoid_checks) compares every file's size with the MANIFEST when opening, so the
  // store refuses to open rather than serve a checkpoint with a missing tail.
  absl::StatusOr<std::unique_ptr<CheckpointStore>> reopened = CheckpointStore::Open(options_);
  EXPECT_THAT(reopened, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(reopened.status().message()), HasSubstr(files[0].filename().string()));
  EXPECT_THAT(std::string(reopened.status().message()), HasSubstr(options_.path));
}

// Damage anywhere in any file of a closed store, including the parts RocksDB parses when it
// opens a table (footer, metaindex, properties), is refused with DATA_LOSS when the damaged data
// is needed, and never crashes or serves wrong records. Each case runs on a fresh copy.
TEST_F(CheckpointStoreTest, FlippedByteAnywhereInAnSstIsDataLossNeverACrash) {
  OpenStore();
  const Records first_records = MakeRecords(1, 4, 8 << 10);
  const Records second_records = MakeRecords(2, 4, 8 << 10);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, WriteCheckpoint(first_records));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo second, WriteCheckpoint(second_records));
  store_.reset();
  const fs::path pristine = options_.path;
  std::vector<fs::path> files = SstFilesContaining("<ckpt2:");
  ASSERT_EQ(files.size(), 1u);
  const std::string sst_name = files[0].filename().string();
  const uintmax_t size = fs::file_size(files[0]);
  // Every byte of the table's tail (index, metaindex and properties blocks, footer), and every
  // 397th byte before it. All bits flipped: this sets the high bit of a block's restart count.
  std::vector<uintmax_t> offsets;
  for (uintmax_t offset = 0; offset < size; offset += offset + 2048 < size ? 397 : 1) {
    offsets.push_back(offset);
  }
  int refused = 0, harmless = 0;
  for (uintmax_t offset : offsets) {
    SCOPED_TRACE(absl::StrCat("byte ", offset, " of ", size));
    options_.path = (dir_ / "copy").string();
    fs::remove_all(options_.path);
    fs::copy(pristine, options_.path);
    {
      std::fstream file(fs::path(options_.path) / sst_name,
                        std::ios::in | std::ios::out | std::ios::binary);
      file.seekg(static_cast<std::streamoff>(offset));
      const char byte = static_cast<char>(file.get());
      file.seekp(static_cast<std::streamoff>(offset));
      file.put(static_cast<char>(byte ^ 0xff));
    }
    absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(options_);
    if (!store.ok()) {
      EXPECT_THAT(store, StatusIs(absl::StatusCode::kDataLoss));
      ++refused;
      continue;
    }
    store_ = *std::move(store);
    absl::Status verify = store_->Verify(second.id);
    absl::StatusOr<Records> read = ReadAll(second.id);
    if (verify.ok()) {
      ASSERT_OK(read.status());
      EXPECT_EQ(*read, second_records);
      ++harmless;
    } else {
      EXPECT_THAT(verify, StatusIs(absl::StatusCode::kDataLoss));
      EXPECT_THAT(read, StatusIs(absl::StatusCode::kDataLoss));
      ++refused;
    }
    // The other checkpoint lives in another file and still reads.
    ASSERT_OK_AND_ASSIGN(Records other, ReadAll(first.id));
    EXPECT_EQ(other, first_records);
    store_.reset();
  }
  EXPECT_GT(refused, 0);
  RecordProperty("refused", refused);
  RecordProperty("harmless", harmless);
}

// Seen: with CURRENT and the (empty) log removed, RocksDB created a new store over the old
// files and deleted the MANIFEST and the table files of both checkpoints.
TEST_F(CheckpointStoreTest, MissingCurrentIsDataLossAndNothingIsDeleted) {
  OpenStore();
  ASSERT_OK(WriteCheckpoint(MakeRecords(1, 5, 1000)).status());
  ASSERT_OK(WriteCheckpoint(MakeRecords(2, 5, 1000)).status());
  store_.reset();
  fs::remove(fs::path(options_.path) / "CURRENT");
  for (const auto& entry : fs::directory_iterator(options_.path)) {
    if (entry.path().extension() == ".log") fs::remove(entry.path());
  }
  std::vector<std::string> before;
  for (const auto& entry : fs::directory_iterator(options_.path)) {
    before.push_back(entry.path().filename().string());
  }
  std::sort(before.begin(), before.end());

  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(options_);
  EXPECT_THAT(store, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("CURRENT is missing"));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("MANIFEST-"));
  std::vector<std::string> after;
  for (const auto& entry : fs::directory_iterator(options_.path)) {
    after.push_back(entry.path().filename().string());
  }
  std::sort(after.begin(), after.end());
  EXPECT_EQ(after, before);
}

// RocksDB, opening a store read-write, deletes the table files its MANIFEST does not list (it
// takes them for its own leftovers). A file the store did not write there (here: an SST of
// another store, under a number this one has not used) is moved into set-aside/ byte for byte
// instead, and the store's checkpoints are intact.
TEST_F(CheckpointStoreTest, FileTheStoreDoesNotListIsSetAsideNotDeleted) {
  CheckpointStoreOptions other = options_;
  other.path = (dir_ / "other").string();
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointStore> store, CheckpointStore::Open(other));
    store_ = std::move(store);
    ASSERT_OK(WriteCheckpoint(MakeRecords(7, 5, 1000)).status());
    store_.reset();
  }
  OpenStore();
  const Records first = MakeRecords(1, 5, 1000), second = MakeRecords(2, 5, 1000);
  ASSERT_OK(WriteCheckpoint(first).status());
  ASSERT_OK(WriteCheckpoint(second).status());
  store_.reset();

  fs::path source;
  for (const auto& entry : fs::directory_iterator(other.path)) {
    if (entry.path().extension() == ".sst") source = entry.path();
  }
  ASSERT_FALSE(source.empty());
  // The lowest number no file of the store uses: below the store's next file number, so
  // RocksDB would count the file as obsolete.
  std::set<uint64_t> used;
  for (const auto& entry : fs::directory_iterator(options_.path)) {
    const std::string name = entry.path().filename().string();
    const size_t digits = name.find_first_of("0123456789");
    if (digits != std::string::npos) used.insert(std::strtoull(name.c_str() + digits, nullptr, 10));
  }
  uint64_t number = 1;
  while (used.count(number) > 0) ++number;
  ASSERT_LT(number, *used.rbegin());
  char name[32];
  std::snprintf(name, sizeof(name), "%06llu.sst", static_cast<unsigned long long>(number));
  const fs::path extra = fs::path(options_.path) / name;
  fs::copy_file(source, extra);
  std::ifstream in(extra, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  OpenStore();
  EXPECT_FALSE(fs::exists(extra));
  const fs::path aside = fs::path(options_.path) / "set-aside" / name;
  ASSERT_TRUE(fs::exists(aside)) << "RocksDB deleted " << extra;
  std::ifstream moved(aside, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(moved)), std::istreambuf_iterator<char>()),
            bytes);
  EXPECT_THAT(ListIds(), ElementsAre(1, 2));
  ASSERT_OK_AND_ASSIGN(Records read1, ReadAll(1));
  EXPECT_TRUE(read1 == first);
  ASSERT_OK_AND_ASSIGN(Records read2, ReadAll(2));
  EXPECT_TRUE(read2 == second);
  // And the store goes on writing.
  ASSERT_OK(WriteCheckpoint(MakeRecords(3, 5, 1000)).status());
}

TEST_F(CheckpointStoreTest, OtherFormatVersionIsFailedPrecondition) {
  OpenStore();
  store_.reset();
  {
    // Rewrite the format record the way a future version would.
    rocksdb::DBOptions db_options;
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
        {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()}};
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(db_options, options_.path, cfs, &handles, &db).ok());
    ASSERT_TRUE(
        db->Put(rocksdb::WriteOptions(), "F", "ps.server.storage.CheckpointStore format 2").ok());
    for (auto* handle : handles) delete handle;
    delete db;
  }
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(options_);
  EXPECT_THAT(store, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("format 2"));
}

// Fails writes with ENOSPC while `full` is set, and log fsyncs while `fail_log_sync` is.
class FaultyFileSystem : public rocksdb::FileSystemWrapper {
 public:
  explicit FaultyFileSystem(std::shared_ptr<rocksdb::FileSystem> target)
      : FileSystemWrapper(std::move(target)) {}
  const char* Name() const override { return "FaultyFileSystem"; }

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewWritableFile(name, options, result, dbg);
    const bool is_log = absl::EndsWith(name, ".log");
    const bool is_sst = absl::EndsWith(name, ".sst");
    if (s.ok()) *result = std::make_unique<File>(std::move(*result), this, is_log, is_sst);
    return s;
  }

  // A full disk also says so when asked.
  rocksdb::IOStatus GetFreeSpace(const std::string& path, const rocksdb::IOOptions& options,
                                 uint64_t* free_bytes, rocksdb::IODebugContext* dbg) override {
    if (full) {
      *free_bytes = 0;
      return rocksdb::IOStatus::OK();
    }
    return target()->GetFreeSpace(path, options, free_bytes, dbg);
  }

  std::atomic<bool> full{false};
  // Only table files fail to grow, as on a nearly full disk where the small log and MANIFEST
  // appends still fit but a flush does not.
  std::atomic<bool> sst_full{false};
  std::atomic<bool> fail_log_sync{false};  // fsync of write-ahead log files fails.

 private:
  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> target, FaultyFileSystem* fs, bool is_log,
         bool is_sst)
        : FSWritableFileOwnerWrapper(std::move(target)), fs_(fs), is_log_(is_log), is_sst_(is_sst) {}
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
      if (is_log_ && fs_->fail_log_sync) return rocksdb::IOStatus::IOError("sync", "EIO");
      return FSWritableFileOwnerWrapper::Sync(options, dbg);
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                            rocksdb::IODebugContext* dbg) override {
      if (is_log_ && fs_->fail_log_sync) return rocksdb::IOStatus::IOError("fsync", "EIO");
      return FSWritableFileOwnerWrapper::Fsync(options, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
      if (Full()) return rocksdb::IOStatus::NoSpace("append", "No space left on device");
      return FSWritableFileOwnerWrapper::Append(data, options, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             const rocksdb::DataVerificationInfo& info,
                             rocksdb::IODebugContext* dbg) override {
      if (Full()) return rocksdb::IOStatus::NoSpace("append", "No space left on device");
      return FSWritableFileOwnerWrapper::Append(data, options, info, dbg);
    }

   private:
    bool Full() const { return fs_->full || (is_sst_ && fs_->sst_full); }
    FaultyFileSystem* fs_;
    bool is_log_;
    bool is_sst_;
  };
};

TEST_F(CheckpointStoreTest, DiskFullIsResourceExhaustedAndRecoversAfterReopen) {
  auto full_disk = std::make_shared<FaultyFileSystem>(rocksdb::FileSystem::Default());
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(full_disk);
  ASSERT_OK_AND_ASSIGN(store_, CheckpointStore::OpenWithEnvForTest(options_, env.get()));
  const Records good = MakeRecords(1, 10, 10 << 10);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, WriteCheckpoint(good));

  // The disk fills up while a checkpoint is being written: records sit in a memtable, so the
  // flush in Commit() is what fails.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> writer, store_->BeginCheckpoint());
  for (const auto& [key, value] : MakeRecords(2, 10, 10 << 10)) ASSERT_OK(writer->Put(key, value));
  full_disk->full = true;
  absl::StatusOr<CheckpointInfo> failed = writer->Commit("");
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr(options_.path));
  writer.reset();

  // The store refuses to build on what the failure left behind; reads of the old one work.
  EXPECT_TRUE(store_->NeedsReopen());
  EXPECT_THAT(WriteCheckpoint(MakeRecords(3, 1, 10)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(ListIds(), ElementsAre(first.id));
  ASSERT_OK_AND_ASSIGN(Records read, ReadAll(first.id));
  EXPECT_EQ(read, good);
  store_.reset();

  // Space is back: the reopened store writes a checkpoint that survives another reopen.
  full_disk->full = false;
  ASSERT_OK_AND_ASSIGN(store_, CheckpointStore::OpenWithEnvForTest(options_, env.get()));
  EXPECT_FALSE(store_->NeedsReopen());
  const Records later = MakeRecords(4, 10, 10 << 10);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo recovered, WriteCheckpoint(later));
  store_.reset();
  ASSERT_OK_AND_ASSIGN(store_, CheckpointStore::OpenWithEnvForTest(options_, env.get()));
  EXPECT_THAT(ListIds(), ElementsAre(first.id, recovered.id));
  ASSERT_OK_AND_ASSIGN(Records read_later, ReadAll(recovered.id));
  EXPECT_EQ(read_later, later);
  EXPECT_THAT(store_->CountRecordsForTest(), IsOkAndHolds(20u));  // The failed one is gone.
  store_.reset();                                                 // Before `env`.
}

// Seen on a 20 MB tmpfs: after a flush failed for lack of space, the next checkpoint's flush
// returned OK with its records still in a memtable, its read-back found them there, and it was
// reported written; after a restart it held no records at all.
TEST_F(CheckpointStoreTest, CheckpointAfterDiskFullIsNeverReportedWrittenWithoutItsRecords) {
  auto faulty = std::make_shared<FaultyFileSystem>(rocksdb::FileSystem::Default());
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(faulty);
  ASSERT_OK_AND_ASSIGN(store_, CheckpointStore::OpenWithEnvForTest(options_, env.get()));
  const Records good = MakeRecords(1, 10, 10 << 10);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, WriteCheckpoint(good));
  faulty->sst_full = true;
  EXPECT_THAT(WriteCheckpoint(MakeRecords(2, 10, 10 << 10)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  // Still full: the same store refuses to go on until reopened.
  EXPECT_THAT(WriteCheckpoint(MakeRecords(3, 10, 10 << 10)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(ListIds(), ElementsAre(first.id));
  store_.reset();
  // Reopened while still full: opening (which flushes what the log holds) or the next
  // checkpoint fails; nothing is reported written.
  absl::StatusOr<std::unique_ptr<CheckpointStore>> reopened =
      CheckpointStore::OpenWithEnvForTest(options_, env.get());
  if (reopened.ok()) {
    store_ = *std::move(reopened);
    EXPECT_THAT(WriteCheckpoint(MakeRecords(4, 10, 10 << 10)),
                StatusIs(absl::StatusCode::kResourceExhausted));
    EXPECT_THAT(ListIds(), ElementsAre(first.id));
    store_.reset();
  } else {
    EXPECT_THAT(reopened, StatusIs(absl::StatusCode::kResourceExhausted));
  }

  // Space is back: the reopened store starts from a clean state; its checkpoint survives a
  // reopen.
  faulty->sst_full = false;
  ASSERT_OK_AND_ASSIGN(store_, CheckpointStore::OpenWithEnvForTest(options_, env.get()));
  const Records later = MakeRecords(5, 10, 10 << 10);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo recovered, WriteCheckpoint(later));
  store_.reset();
  ASSERT_OK_AND_ASSIGN(store_, CheckpointStore::OpenWithEnvForTest(options_, env.get()));
  EXPECT_THAT(ListIds(), ElementsAre(first.id, recovered.id));
  ASSERT_OK_AND_ASSIGN(Records read_first, ReadAll(first.id));
  EXPECT_EQ(read_first, good);
  ASSERT_OK_AND_ASSIGN(Records read_later, ReadAll(recovered.id));
  EXPECT_EQ(read_later, later);
  EXPECT_THAT(store_->CountRecordsForTest(), IsOkAndHolds(20u));
  store_.reset();  // Before `env`.
}

TEST_F(CheckpointStoreTest, FailedCommitRecordSyncNeverLeavesCommitWithoutRecords) {
  auto faulty = std::make_shared<FaultyFileSystem>(rocksdb::FileSystem::Default());
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(faulty);
  ASSERT_OK_AND_ASSIGN(store_, CheckpointStore::OpenWithEnvForTest(options_, env.get()));
  ASSERT_OK(WriteCheckpoint(MakeRecords(1, 5, 1000)).status());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointWriter> writer, store_->BeginCheckpoint());
  for (const auto& [key, value] : MakeRecords(2, 5, 1000)) ASSERT_OK(writer->Put(key, value));
  faulty->fail_log_sync = true;
  // The commit record reaches the log but its fsync fails: RocksDB reports the error, yet may
  // replay the record at the next open.
  EXPECT_FALSE(writer->Commit("second").ok());
  writer.reset();
  faulty->fail_log_sync = false;
  store_.reset();

  ASSERT_OK_AND_ASSIGN(store_, CheckpointStore::OpenWithEnvForTest(options_, env.get()));
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointInfo> all, store_->List());
  ASSERT_FALSE(all.empty());
  for (const CheckpointInfo& info : all) {
    EXPECT_EQ(store_->Verify(info.id), absl::OkStatus()) << "checkpoint " << info.id;
  }
  ASSERT_OK(WriteCheckpoint(MakeRecords(3, 5, 1000)).status());
  store_.reset();  // Before `env`.
}

}  // namespace
}  // namespace ps::server::storage
