#include "server/storage/in_memory_spill_table.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ps::server::storage {
namespace {

class CopySnapshot final : public SpillSnapshot {
 public:
  explicit CopySnapshot(std::vector<std::pair<uint64_t, absl::StatusOr<std::string>>> rows)
      : rows_(std::move(rows)) {}
  absl::Status ForEach(
      const std::function<absl::Status(uint64_t, absl::string_view)>& visit) override {
    for (const auto& [key, value] : rows_) {
      if (!value.ok()) return value.status();
      absl::Status s = visit(key, *value);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::pair<uint64_t, absl::StatusOr<std::string>>> rows_;
};

}  // namespace

absl::StatusOr<bool> InMemorySpillTable::Get(uint64_t key, std::string* value) {
  absl::MutexLock lock(&mu_);
  ++gets_;
  if (!read_error_.ok()) return read_error_;
  auto it = rows_.find(key);
  if (it == rows_.end()) return false;
  if (corrupt_.count(key) > 0) {
    return absl::DataLossError(
        absl::StrCat("fake spill table '", name_, "' key ", key, ": checksum mismatch"));
  }
  *value = it->second;
  return true;
}

absl::Status InMemorySpillTable::Put(uint64_t key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  if (!write_error_.ok()) return write_error_;
  ++puts_;
  rows_[key] = std::string(value);
  corrupt_.erase(key);
  return absl::OkStatus();
}

absl::Status InMemorySpillTable::Delete(uint64_t key) {
  absl::MutexLock lock(&mu_);
  if (!write_error_.ok()) return write_error_;
  rows_.erase(key);
  corrupt_.erase(key);
  return absl::OkStatus();
}

std::unique_ptr<SpillSnapshot> InMemorySpillTable::Snapshot() {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<uint64_t, absl::StatusOr<std::string>>> rows;
  for (const auto& [key, value] : rows_) {
    if (corrupt_.count(key) > 0) {
      rows.emplace_back(key, absl::DataLossError(absl::StrCat("fake spill table '", name_, "' key ",
                                                              key, ": checksum mismatch")));
    } else {
      rows.emplace_back(key, value);
    }
  }
  return std::make_unique<CopySnapshot>(std::move(rows));
}

void InMemorySpillTable::FailReads(absl::Status status) {
  absl::MutexLock lock(&mu_);
  read_error_ = std::move(status);
}

void InMemorySpillTable::FailWrites(absl::Status status) {
  absl::MutexLock lock(&mu_);
  write_error_ = std::move(status);
}

void InMemorySpillTable::Corrupt(uint64_t key) {
  absl::MutexLock lock(&mu_);
  corrupt_[key] = true;
}

size_t InMemorySpillTable::size() const {
  absl::MutexLock lock(&mu_);
  return rows_.size();
}

uint64_t InMemorySpillTable::gets() const {
  absl::MutexLock lock(&mu_);
  return gets_;
}

uint64_t InMemorySpillTable::puts() const {
  absl::MutexLock lock(&mu_);
  return puts_;
}

}  // namespace ps::server::storage
