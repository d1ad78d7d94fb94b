#include "worker/models/fake_parameter_store.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/initializer.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "proto/config.pb.h"

namespace ps::worker {

absl::StatusOr<std::unique_ptr<FakeParameterStore>> FakeParameterStore::ForTables(
    absl::Span<const ps::TableConfig> tables) {
  auto store = std::make_unique<FakeParameterStore>();
  for (const ps::TableConfig& table : tables) {
    RETURN_IF_ERROR_CTX(common::ValidateInitializer(table.initializer(), table), table.name());
    if (table.kind() == ps::TABLE_KIND_SPARSE) {
      if (table.dim() == 0) {
        return absl::InvalidArgumentError(absl::StrCat(table.name(), ": sparse without dim"));
      }
      store->AddSparseTable(table.name(), table.dim(), table.initializer());
      continue;
    }
    if (table.shape_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(table.name(), ": dense without shape"));
    }
    int64_t size = 1;
    for (int64_t d : table.shape()) size *= d;
    std::vector<float> values(size);
    const common::Fans fans = common::ComputeFans(table);
    common::InitializeValues(table.initializer(), table.name(), fans.in, fans.out, 0,
                             absl::MakeSpan(values));
    store->AddDenseTable(table.name(), std::move(values));
  }
  return store;
}

void FakeParameterStore::AddDenseTable(const std::string& name, std::vector<float> values) {
  absl::MutexLock lock(&mu_);
  dense_[name] = std::move(values);
}

void FakeParameterStore::AddSparseTable(const std::string& name, int64_t dim,
                                        ps::InitializerConfig init) {
  absl::MutexLock lock(&mu_);
  SparseTable& table = sparse_[name];
  table.dim = dim;
  table.init = std::move(init);
  table.rows.clear();
}

void FakeParameterStore::set_learning_rate(float learning_rate) {
  absl::MutexLock lock(&mu_);
  learning_rate_ = learning_rate;
}

std::vector<float>& FakeParameterStore::Row(const std::string& name, SparseTable& table,
                                            uint64_t key) {
  auto [it, inserted] = table.rows.try_emplace(key);
  if (inserted) {
    it->second.resize(table.dim);
    common::InitializeSparseRow(table.init, name, key, absl::MakeSpan(it->second));
  }
  return it->second;
}

absl::Status FakeParameterStore::CheckPull(const common::PullBatch& batch) const {
  for (const common::DensePull& pull : batch.dense) {
    auto it = dense_.find(pull.table);
    if (it == dense_.end()) {
      return absl::NotFoundError(absl::StrCat("no dense table ", pull.table));
    }
    if (pull.out.size() != it->second.size()) {
      return absl::InvalidArgumentError(absl::StrCat(pull.table, ": buffer of ", pull.out.size(),
                                                     " floats, table has ", it->second.size()));
    }
  }
  for (const common::SparsePull& pull : batch.sparse) {
    auto it = sparse_.find(pull.table);
    if (it == sparse_.end()) {
      return absl::NotFoundError(absl::StrCat("no sparse table ", pull.table));
    }
    if (pull.out.size() != pull.keys.size() * it->second.dim) {
      return absl::InvalidArgumentError(absl::StrCat(pull.table, ": buffer of ", pull.out.size(),
                                                     " floats for ", pull.keys.size(), " keys"));
    }
  }
  return absl::OkStatus();
}

absl::Status FakeParameterStore::Pull(const common::PullBatch& batch,
                                      const common::PullOptions& /*options*/) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckPull(batch));
  for (const common::DensePull& pull : batch.dense) {
    const std::vector<float>& values = dense_.at(pull.table);
    std::copy(values.begin(), values.end(), pull.out.begin());
  }
  for (const common::SparsePull& pull : batch.sparse) {
    SparseTable& table = sparse_.at(pull.table);
    for (size_t i = 0; i < pull.keys.size(); ++i) {
      const std::vector<float>& row = Row(pull.table, table, pull.keys[i]);
      std::copy(row.begin(), row.end(), pull.out.begin() + i * table.dim);
    }
    last_pulled_keys_[pull.table].assign(pull.keys.begin(), pull.keys.end());
  }
  return absl::OkStatus();
}

absl::Status FakeParameterStore::CheckPush(const common::PushBatch& batch) const {
  for (const common::DensePush& push : batch.dense) {
    auto it = dense_.find(push.table);
    if (it == dense_.end()) {
      return absl::NotFoundError(absl::StrCat("no dense table ", push.table));
    }
    if (push.values.size() != it->second.size()) {
      return absl::InvalidArgumentError(absl::StrCat(push.table, ": ", push.values.size(),
                                                     " gradients, table has ", it->second.size()));
    }
  }
  for (const common::SparsePush& push : batch.sparse) {
    auto it = sparse_.find(push.table);
    if (it == sparse_.end()) {
      return absl::NotFoundError(absl::StrCat("no sparse table ", push.table));
    }
    if (push.values.size() != push.keys.size() * it->second.dim) {
      return absl::InvalidArgumentError(absl::StrCat(push.table, ": ", push.values.size(),
                                                     " gradients for ", push.keys.size(), " keys"));
    }
  }
  return absl::OkStatus();
}

absl::Status FakeParameterStore::Push(const common::PushBatch& batch,
                                      const common::PushOptions& /*options*/) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckPush(batch));
  RecordedPush record;
  for (const common::DensePush& push : batch.dense) {
    record.dense[push.table].assign(push.values.begin(), push.values.end());
    std::vector<float>& values = dense_.at(push.table);
    for (size_t i = 0; i < values.size(); ++i) values[i] -= learning_rate_ * push.values[i];
  }
  for (const common::SparsePush& push : batch.sparse) {
    SparseTable& table = sparse_.at(push.table);
    auto& rows = record.sparse[push.table];
    for (size_t i = 0; i < push.keys.size(); ++i) {
      const absl::Span<const float> grad = push.values.subspan(i * table.dim, table.dim);
      rows.emplace_back(push.keys[i], std::vector<float>(grad.begin(), grad.end()));
      std::vector<float>& row = Row(push.table, table, push.keys[i]);
      for (int64_t j = 0; j < table.dim; ++j) row[j] -= learning_rate_ * grad[j];
    }
  }
  last_push_ = std::move(record);
  ++num_pushes_;
  return absl::OkStatus();
}

std::vector<float>* FakeParameterStore::MutableDenseForTest(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = dense_.find(name);
  return it == dense_.end() ? nullptr : &it->second;
}

float* FakeParameterStore::MutableRowForTest(const std::string& name, uint64_t key) {
  absl::MutexLock lock(&mu_);
  auto it = sparse_.find(name);
  return it == sparse_.end() ? nullptr : Row(name, it->second, key).data();
}

FakeParameterStore::RecordedPush FakeParameterStore::last_push() const {
  absl::MutexLock lock(&mu_);
  return last_push_;
}

int64_t FakeParameterStore::num_pushes() const {
  absl::MutexLock lock(&mu_);
  return num_pushes_;
}

std::vector<uint64_t> FakeParameterStore::last_pulled_keys(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = last_pulled_keys_.find(name);
  return it == last_pulled_keys_.end() ? std::vector<uint64_t>() : it->second;
}

}  // namespace ps::worker
