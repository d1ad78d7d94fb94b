// What the checkpoint store's tests share: status matchers, records of pseudo-random values
// that can be found in the SST files on disk, and a fixture owning a store in a temporary
// directory (checkpoint_store_test.cc: its life cycle; checkpoint_store_damage_test.cc:
// damaged files and failing disks).
#ifndef PS_SERVER_STORAGE_CHECKPOINT_STORE_TEST_UTIL_H_
#define PS_SERVER_STORAGE_CHECKPOINT_STORE_TEST_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/storage/checkpoint_store.h"

namespace ps::server::storage {

// TODO(storage): switch to the shared testonly StatusIs matcher once common/ provides one.
MATCHER_P(StatusIs, code, "") {
  const absl::Status& status = [](const auto& s) -> const absl::Status& {
    if constexpr (std::is_same_v<std::decay_t<decltype(s)>, absl::Status>) {
      return s;
    } else {
      return s.status();
    }
  }(arg);
  *result_listener << "status is " << status;
  return status.code() == code;
}

MATCHER_P(IsOkAndHolds, value, "") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  *result_listener << "value is " << *arg;
  return *arg == value;
}

#define ASSERT_OK(expr) ASSERT_EQ((expr), absl::OkStatus())
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                                       \
  auto PS_TEST_CONCAT_(_or, __LINE__) = (rexpr);                                               \
  ASSERT_TRUE(PS_TEST_CONCAT_(_or, __LINE__).ok()) << PS_TEST_CONCAT_(_or, __LINE__).status(); \
  lhs = std::move(PS_TEST_CONCAT_(_or, __LINE__)).value()
#define PS_TEST_CONCAT_INNER_(a, b) a##b
#define PS_TEST_CONCAT_(a, b) PS_TEST_CONCAT_INNER_(a, b)

using Records = std::map<std::string, std::string>;

// A value of `size` pseudo-random bytes (incompressible, so SST files hold it verbatim) that
// starts with a marker naming the checkpoint and key, for finding it in files on disk.
inline std::string MakeValue(absl::string_view marker, size_t size, uint32_t seed) {
  std::string value(marker);
  std::mt19937 rng(seed);
  while (value.size() < size) value.push_back(static_cast<char>(rng()));
  value.resize(size);
  return value;
}

inline Records MakeRecords(int checkpoint, int count, size_t value_size) {
  Records records;
  for (int i = 0; i < count; ++i) {
    std::string key = absl::StrCat("table/", i);
    records[key] = MakeValue(absl::StrCat("<ckpt", checkpoint, ":", key, ">"), value_size,
                             checkpoint * 1000 + i);
  }
  return records;
}

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) / absl::StrCat("ckpt_", info->name(), "_", getpid());
    std::filesystem::remove_all(dir_);
    options_.path = (dir_ / "db").string();
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  void OpenStore() {
    store_.reset();
    ASSERT_OK_AND_ASSIGN(store_, CheckpointStore::Open(options_));
  }

  // Writes `records` (in reverse key order, to show order does not matter) and commits.
  absl::StatusOr<CheckpointInfo> WriteCheckpoint(const Records& records,
                                                 absl::string_view metadata = "meta") {
    absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer = store_->BeginCheckpoint();
    if (!writer.ok()) return writer.status();
    for (auto it = records.rbegin(); it != records.rend(); ++it) {
      absl::Status status = (*writer)->Put(it->first, it->second);
      if (!status.ok()) return status;
    }
    return (*writer)->Commit(metadata);
  }

  absl::StatusOr<Records> ReadAll(uint64_t id) {
    Records records;
    std::string previous;
    absl::Status status = store_->Read(id, [&](absl::string_view key, absl::string_view value) {
      EXPECT_TRUE(records.empty() || key > previous) << "keys out of order";
      previous = std::string(key);
      records.emplace(std::string(key), std::string(value));
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    return records;
  }

  std::vector<uint64_t> ListIds() {
    std::vector<uint64_t> ids;
    absl::StatusOr<std::vector<CheckpointInfo>> list = store_->List();
    EXPECT_TRUE(list.ok()) << list.status();
    if (list.ok()) {
      for (const CheckpointInfo& info : *list) ids.push_back(info.id);
    }
    return ids;
  }

  std::vector<uint64_t> SupersededIds() {
    absl::StatusOr<std::vector<uint64_t>> ids = store_->Superseded();
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<uint64_t>{};
  }

  // SST files of the store whose bytes contain `needle`.
  std::vector<std::filesystem::path> SstFilesContaining(absl::string_view needle) {
    std::vector<std::filesystem::path> found;
    for (const auto& entry : std::filesystem::directory_iterator(options_.path)) {
      if (entry.path().extension() != ".sst") continue;
      std::ifstream in(entry.path(), std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (bytes.find(needle.data(), 0, needle.size()) != std::string::npos)
        found.push_back(entry.path());
    }
    return found;
  }

  uint64_t SstBytesOnDisk() {
    uint64_t bytes = 0;
    for (const auto& entry : std::filesystem::directory_iterator(options_.path)) {
      if (entry.path().extension() == ".sst") bytes += entry.file_size();
    }
    return bytes;
  }

  // Flips one byte inside the value that starts with `marker`, in the one SST file holding it.
  void FlipByteAfter(absl::string_view marker) {
    std::vector<std::filesystem::path> files = SstFilesContaining(marker);
    ASSERT_EQ(files.size(), 1u);
    std::fstream file(files[0], std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    const size_t offset = bytes.find(marker.data(), 0, marker.size()) + 1000;
    file.seekp(static_cast<std::streamoff>(offset));
    file.put(static_cast<char>(bytes[offset] ^ 0x01));
  }

  std::filesystem::path dir_;
  CheckpointStoreOptions options_;
  std::unique_ptr<CheckpointStore> store_;
};

}  // namespace ps::server::storage

#endif  // PS_SERVER_STORAGE_CHECKPOINT_STORE_TEST_UTIL_H_
