// Writes and reads a checkpoint of 256 MB of float data (records of 1 MB) and prints MB/s, for
// each way of writing records (WAL off + flush before commit, WAL on) and with and without the
// read-back before commit.
//
//   bazel run -c opt //server/storage:checkpoint_bench -- [dir] [total_mb] [record_kb]
//
// `dir` defaults to a fresh directory under $TEST_TMPDIR or /tmp and is deleted afterwards.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/storage/checkpoint_store.h"

namespace ps::server::storage {
namespace {

struct Config {
  std::string name;
  bool wal_for_records;
  bool verify_before_commit;
};

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status RunOne(const std::string& dir, const Config& config, size_t total_bytes,
                    size_t record_bytes) {
  std::filesystem::remove_all(dir);
  CheckpointStoreOptions options;
  options.path = dir;
  options.wal_for_records = config.wal_for_records;
  options.verify_before_commit = config.verify_before_commit;
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(options);
  if (!store.ok()) return store.status();

  // Parameters-like data: floats around 0 with full mantissas (incompressible, like real ones).
  const size_t floats = record_bytes / sizeof(float);
  std::vector<float> data(floats);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (float& f : data) f = normal(rng);
  const absl::string_view value(reinterpret_cast<const char*>(data.data()), floats * sizeof(float));
  const size_t records = total_bytes / record_bytes;
  const double mb = static_cast<double>(records * value.size()) / (1 << 20);

  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer = (*store)->BeginCheckpoint();
  if (!writer.ok()) return writer.status();
  for (size_t i = 0; i < records; ++i) {
    data[0] = static_cast<float>(i);  // Distinct values.
    absl::Status status = (*writer)->Put(absl::StrFormat("dense/w%06d", i), value);
    if (!status.ok()) return status;
  }
  const double put_s = Seconds(start);
  absl::StatusOr<CheckpointInfo> info = (*writer)->Commit("bench");
  if (!info.ok()) return info.status();
  const double write_s = Seconds(start);
  writer->reset();

  // Closing flushes what is still only in memtables (WAL mode): work that was deferred, not
  // saved. Read from the reopened store; the files are likely still in the page cache, as they
  // would be for a restart on the same machine shortly after the checkpoint.
  start = std::chrono::steady_clock::now();
  store->reset();
  const double close_s = Seconds(start);
  store = CheckpointStore::Open(options);
  if (!store.ok()) return store.status();
  start = std::chrono::steady_clock::now();
  size_t read_bytes = 0;
  absl::Status status = (*store)->Read(info->id, [&](absl::string_view, absl::string_view v) {
    read_bytes += v.size();
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  const double read_s = Seconds(start);
  start = std::chrono::steady_clock::now();
  status = (*store)->Verify(info->id);
  if (!status.ok()) return status;
  const double verify_s = Seconds(start);

  std::printf(
      "%-32s %4.0f MB: write %4.0f MB/s (puts %4.2f s, commit %4.2f s, close %4.2f s)  "
      "read %5.0f MB/s  verify %5.0f MB/s  on disk %4.0f MB\n",
      config.name.c_str(), mb, mb / write_s, put_s, write_s - put_s, close_s,
      static_cast<double>(read_bytes) / (1 << 20) / read_s, mb / verify_s,
      static_cast<double>((*store)->ApproximateSizeBytes()) / (1 << 20));
  std::fflush(stdout);
  store->reset();
  std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  std::string dir;
  if (argc > 1) {
    dir = argv[1];
  } else {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/checkpoint_bench_", getpid());
  }
  const size_t total_mb = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 256;
  const size_t record_kb = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 1024;
  const std::vector<Config> configs = {
      {"WAL off, flush+verify (default)", false, true},
      {"WAL off, flush, no verify", false, false},
      {"WAL on, verify", true, true},
      {"WAL on, no verify", true, false},
  };
  for (const Config& config : configs) {
    absl::Status status = RunOne(dir, config, total_mb << 20, record_kb << 10);
    if (!status.ok()) {
      std::fprintf(stderr, "%s: %s\n", config.name.c_str(), status.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ps::server::storage

int main(int argc, char** argv) { return ps::server::storage::Main(argc, argv); }
