#include "worker/local_sgd_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/status_macros.h"
#include "kernels/optimizer_config.h"

namespace ps::worker {
namespace {

// One optimizer step on `params` with `num_slots` slot arrays laid out back to back in
// `slots` (each params.size() long).
void Step(const kernels::OptimizerParams& p, int64_t step, absl::Span<float> params,
          absl::Span<const float> grads, float* slots, int num_slots) {
  float* slot_ptrs[4];
  for (int i = 0; i < num_slots; ++i) slot_ptrs[i] = slots + i * params.size();
  kernels::ApplyOptimizer(p, step, params, grads, absl::Span<float* const>(slot_ptrs, num_slots));
}

std::vector<float> InitialSlots(const kernels::OptimizerParams& p, int num_slots, int64_t dim) {
  std::vector<float> slots(num_slots * dim);
  for (int i = 0; i < num_slots; ++i) {
    std::fill_n(slots.begin() + i * dim, dim, kernels::SlotInitialValue(p, i));
  }
  return slots;
}

absl::Status CheckFinite(absl::string_view table, absl::Span<const float> values) {
  const size_t bad = common::CountNonFinite(values);
  if (bad == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("table '", table, "': ", bad, " non-finite gradient values"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalSgdStore>> LocalSgdStore::Create(
    common::ParameterStore* remote, absl::Span<const TableConfig> tables, uint32_t steps) {
  if (steps == 0) return absl::InvalidArgumentError("local SGD needs steps >= 1");
  std::unique_ptr<LocalSgdStore> store(new LocalSgdStore(remote, steps));
  absl::MutexLock lock(&store->mu_);
  for (const TableConfig& config : tables) {
    Table t;
    t.config = config;
    t.optimizer = kernels::ToOptimizerParams(config.optimizer());
    RETURN_IF_ERROR_CTX(kernels::ValidateOptimizerParams(t.optimizer),
                        absl::StrCat("table '", config.name(), "' optimizer"));
    t.num_slots = kernels::NumSlots(t.optimizer.kind);
    if (config.kind() == TABLE_KIND_DENSE) {
      t.dim = 1;
      for (int64_t d : config.shape()) t.dim *= d;
      if (config.shape().empty() || t.dim <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("table '", config.name(), "' has no shape"));
      }
      const std::vector<float> slots = InitialSlots(t.optimizer, t.num_slots, t.dim);
      t.slots.emplace_back(slots);  // one buffer holding every slot array
    } else {
      t.dim = config.dim();
      if (t.dim <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("table '", config.name(), "' has no dim"));
      }
    }
    store->tables_.emplace(config.name(), std::move(t));
  }
  return store;
}

absl::StatusOr<LocalSgdStore::Table*> LocalSgdStore::Find(const std::string& name, TableKind kind) {
  auto it = tables_.find(name);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("no table '", name, "'"));
  if (it->second.config.kind() != kind) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", name, "' is ", kind == TABLE_KIND_DENSE ? "sparse" : "dense"));
  }
  return &it->second;
}

absl::Status LocalSgdStore::Pull(const common::PullBatch& batch,
                                 const common::PullOptions& options) {
  absl::MutexLock lock(&mu_);
  // Check everything first, and collect what the period has not fetched yet.
  common::PullBatch fetch;
  std::vector<Table*> fetch_dense;
  std::vector<std::vector<uint64_t>> missing(batch.sparse.size());
  std::vector<std::vector<float>> missing_rows(batch.sparse.size());
  for (const common::DensePull& d : batch.dense) {
    ASSIGN_OR_RETURN(Table * t, Find(d.table, TABLE_KIND_DENSE));
    if (static_cast<int64_t>(d.out.size()) != t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", d.table, "' has ", t->dim,
                                                     " values, buffer holds ", d.out.size()));
    }
    if (!t->fetched && std::find(fetch_dense.begin(), fetch_dense.end(), t) == fetch_dense.end()) {
      t->current.resize(t->dim);
      fetch.dense.push_back({d.table, absl::MakeSpan(t->current)});
      fetch_dense.push_back(t);
    }
  }
  for (size_t i = 0; i < batch.sparse.size(); ++i) {
    const common::SparsePull& s = batch.sparse[i];
    ASSIGN_OR_RETURN(Table * t, Find(s.table, TABLE_KIND_SPARSE));
    if (static_cast<int64_t>(s.out.size()) != static_cast<int64_t>(s.keys.size()) * t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", s.table, "': ", s.keys.size(),
                                                     " keys of dim ", t->dim, " need ",
                                                     s.keys.size() * t->dim, " floats"));
    }
    const auto& rows = rows_[s.table];
    absl::flat_hash_map<uint64_t, bool> asked;
    for (uint64_t key : s.keys) {
      if (!rows.contains(key) && asked.emplace(key, true).second) missing[i].push_back(key);
    }
    if (!missing[i].empty()) {
      missing_rows[i].resize(missing[i].size() * t->dim);
      fetch.sparse.push_back({s.table, missing[i], absl::MakeSpan(missing_rows[i])});
    }
  }
  if (!fetch.dense.empty() || !fetch.sparse.empty()) {
    if (period_clock_ < 0) period_clock_ = options.clock;
    common::PullOptions remote_options;
    remote_options.clock = period_clock_;
    RETURN_IF_ERROR(remote_->Pull(fetch, remote_options));
    ++stats_.remote_pulls;
    for (Table* t : fetch_dense) {
      t->base = t->current;
      t->fetched = true;
    }
    for (size_t i = 0; i < batch.sparse.size(); ++i) {
      const int64_t dim = tables_[batch.sparse[i].table].dim;
      auto& rows = rows_[batch.sparse[i].table];
      for (size_t j = 0; j < missing[i].size(); ++j) {
        std::vector<float> row(missing_rows[i].begin() + j * dim,
                               missing_rows[i].begin() + (j + 1) * dim);
        rows[missing[i][j]] = Row{row, row};
      }
    }
  }
  for (const common::DensePull& d : batch.dense) {
    const Table& t = tables_[d.table];
    std::copy(t.current.begin(), t.current.end(), d.out.begin());
  }
  for (const common::SparsePull& s : batch.sparse) {
    const int64_t dim = tables_[s.table].dim;
    const auto& rows = rows_[s.table];
    for (size_t j = 0; j < s.keys.size(); ++j) {
      const std::vector<float>& row = rows.at(s.keys[j]).current;
      std::copy(row.begin(), row.end(), s.out.begin() + j * dim);
    }
  }
  return absl::OkStatus();
}

absl::Status LocalSgdStore::Push(const common::PushBatch& batch,
                                 const common::PushOptions& options) {
  if (options.is_delta) {
    return absl::InvalidArgumentError("local SGD computes its own deltas: push gradients");
  }
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckNoFailedMerge());
  // Check everything before changing anything.
  for (const common::DensePush& d : batch.dense) {
    ASSIGN_OR_RETURN(Table * t, Find(d.table, TABLE_KIND_DENSE));
    if (static_cast<int64_t>(d.values.size()) != t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", d.table, "' has ", t->dim,
                                                     " values, gradient has ", d.values.size()));
    }
    if (!t->fetched) {
      return absl::FailedPreconditionError(
          absl::StrCat("table '", d.table, "' was not pulled in this period"));
    }
    RETURN_IF_ERROR(CheckFinite(d.table, d.values));
  }
  for (const common::SparsePush& s : batch.sparse) {
    ASSIGN_OR_RETURN(Table * t, Find(s.table, TABLE_KIND_SPARSE));
    if (static_cast<int64_t>(s.values.size()) != static_cast<int64_t>(s.keys.size()) * t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", s.table, "': ", s.keys.size(),
                                                     " keys of dim ", t->dim, " need ",
                                                     s.keys.size() * t->dim, " floats"));
    }
    const auto& rows = rows_[s.table];
    for (uint64_t key : s.keys) {
      if (!rows.contains(key)) {
        return absl::FailedPreconditionError(
            absl::StrCat("table '", s.table, "' key ", key, " was not pulled in this period"));
      }
    }
    RETURN_IF_ERROR(CheckFinite(s.table, s.values));
  }
  for (const common::DensePush& d : batch.dense) {
    Table& t = tables_[d.table];
    Step(t.optimizer, ++t.step, absl::MakeSpan(t.current), d.values, t.slots[0].data(),
         t.num_slots);
  }
  for (const common::SparsePush& s : batch.sparse) {
    const Table& t = tables_[s.table];
    auto& rows = rows_[s.table];
    auto& states = row_state_[s.table];
    for (size_t j = 0; j < s.keys.size(); ++j) {
      RowState& state = states[s.keys[j]];
      if (state.slots.empty()) state.slots = InitialSlots(t.optimizer, t.num_slots, t.dim);
      Step(t.optimizer, ++state.step, absl::MakeSpan(rows[s.keys[j]].current),
           s.values.subspan(j * t.dim, t.dim), state.slots.data(), t.num_slots);
    }
  }
  ++stats_.local_steps;
  last_clock_ = options.clock;
  if (++pushes_in_period_ < k_) return absl::OkStatus();
  return Merge(options.clock);
}

absl::Status LocalSgdStore::CheckNoFailedMerge() const {
  if (merge_failed_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "a local SGD merge failed (", merge_failed_.message(),
      "): servers may hold part of its period, which sent again would be applied twice there"));
}

absl::Status LocalSgdStore::Merge(int64_t clock) {
  RETURN_IF_ERROR(CheckNoFailedMerge());
  common::PushBatch push;
  std::vector<std::vector<float>> dense_deltas;
  dense_deltas.reserve(tables_.size());
  for (auto& [name, t] : tables_) {
    if (t.config.kind() != TABLE_KIND_DENSE || !t.fetched) continue;
    std::vector<float>& delta = dense_deltas.emplace_back(t.dim);
    for (int64_t i = 0; i < t.dim; ++i) delta[i] = t.current[i] - t.base[i];
    push.dense.push_back({name, delta});
  }
  std::vector<std::vector<uint64_t>> keys;
  std::vector<std::vector<float>> values;
  keys.reserve(rows_.size());
  values.reserve(rows_.size());
  for (auto& [name, rows] : rows_) {
    std::vector<uint64_t>& k = keys.emplace_back();
    std::vector<float>& v = values.emplace_back();
    for (const auto& [key, row] : rows) {
      if (row.current == row.base) continue;  // pulled, never changed: nothing to merge
      k.push_back(key);
      for (size_t i = 0; i < row.current.size(); ++i) v.push_back(row.current[i] - row.base[i]);
    }
    if (!k.empty()) push.sparse.push_back({name, k, v});
  }
  common::PushOptions options;
  options.clock = clock;
  options.is_delta = true;
  if (absl::Status s = remote_->Push(push, options); !s.ok()) {
    // Of unknown fate: a push to several servers may have been applied by some of them.
    merge_failed_ = s;
    return common::Annotate(s, "local SGD merge");
  }
  ++stats_.merges;
  for (auto& [name, t] : tables_) t.fetched = false;
  rows_.clear();
  pushes_in_period_ = 0;
  period_clock_ = -1;
  return absl::OkStatus();
}

absl::Status LocalSgdStore::Flush() {
  absl::MutexLock lock(&mu_);
  if (pushes_in_period_ > 0) RETURN_IF_ERROR(Merge(last_clock_));
  return absl::OkStatus();
}

absl::Status LocalSgdStore::Finish() {
  RETURN_IF_ERROR(Flush());
  return remote_->Finish();
}

LocalSgdStats LocalSgdStore::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace ps::worker
