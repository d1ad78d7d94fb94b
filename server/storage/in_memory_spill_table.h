// InMemorySpillTable: the in-process fake of SpillTable for tests, with fault injection.
#ifndef PS_SERVER_STORAGE_IN_MEMORY_SPILL_TABLE_H_
#define PS_SERVER_STORAGE_IN_MEMORY_SPILL_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/storage/spill_table.h"

namespace ps::server::storage {

// A std::map behind a mutex. Snapshots copy the map. Thread-safe.
class InMemorySpillTable final : public SpillTable {
 public:
  explicit InMemorySpillTable(std::string name = "fake") : name_(std::move(name)) {}

  const std::string& name() const override { return name_; }
  absl::StatusOr<bool> Get(uint64_t key, std::string* value) override;
  absl::Status Put(uint64_t key, absl::string_view value) override;
  absl::Status Delete(uint64_t key) override;
  std::unique_ptr<SpillSnapshot> Snapshot() override;

  // Fault injection: while set (not OK), every Get / every Put and Delete fails with it.
  void FailReads(absl::Status status);
  void FailWrites(absl::Status status);
  // Get(key) and snapshots report DATA_LOSS for `key` from now on, as if its bytes rotted.
  void Corrupt(uint64_t key);

  size_t size() const;
  uint64_t gets() const;
  uint64_t puts() const;

 private:
  const std::string name_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::string> rows_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, bool> corrupt_ ABSL_GUARDED_BY(mu_);
  absl::Status read_error_ ABSL_GUARDED_BY(mu_);
  absl::Status write_error_ ABSL_GUARDED_BY(mu_);
  uint64_t gets_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t puts_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps::server::storage

#endif  // PS_SERVER_STORAGE_IN_MEMORY_SPILL_TABLE_H_
