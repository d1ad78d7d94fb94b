#include "server/in_process_store.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/partitioner.h"
#include "common/status_macros.h"

namespace ps::server {

absl::StatusOr<std::unique_ptr<InProcessParameterStore>> InProcessParameterStore::Create(
    std::vector<Shard*> shards, const InProcessStoreOptions& options) {
  if (shards.empty()) return absl::InvalidArgumentError("no shards");
  const uint32_t n = shards[0]->partitioner().num_servers();
  if (shards.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job has ", n, " servers, got ", shards.size(), " shards"));
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (shards[i]->server_index() != i || shards[i]->partitioner().layout_fingerprint() !=
                                              shards[0]->partitioner().layout_fingerprint()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", i, " is not server ", i, " of the same layout"));
    }
  }
  return std::unique_ptr<InProcessParameterStore>(
      new InProcessParameterStore(std::move(shards), options));
}

absl::StatusOr<std::unique_ptr<InProcessParameterStore>> InProcessParameterStore::CreateCentralized(
    JobConfig config, const InProcessStoreOptions& options) {
  config.mutable_cluster()->set_num_workers(1);
  ASSIGN_OR_RETURN(uint32_t num_servers, common::NumServers(config.cluster()));
  std::vector<std::unique_ptr<Shard>> owned;
  std::vector<Shard*> raw;
  for (uint32_t s = 0; s < num_servers; ++s) {
    ShardOptions shard_options;
    shard_options.server_index = s;
    shard_options.reject_nonfinite = config.server().reject_nonfinite();
    ASSIGN_OR_RETURN(std::unique_ptr<Shard> shard, Shard::Create(config, shard_options));
    raw.push_back(shard.get());
    owned.push_back(std::move(shard));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<InProcessParameterStore> store, Create(raw, options));
  store->owned_shards_ = std::move(owned);
  return store;
}

InProcessParameterStore::InProcessParameterStore(std::vector<Shard*> shards,
                                                 const InProcessStoreOptions& options)
    : shards_(std::move(shards)), options_(options), partitioner_(&shards_[0]->partitioner()) {}

RequestInfo InProcessParameterStore::Info(int64_t clock, uint64_t sequence) const {
  RequestInfo info;
  info.worker_id = options_.worker_id;
  info.worker_incarnation = options_.worker_incarnation;
  info.sequence = sequence;
  info.clock = clock;
  info.layout_fingerprint = partitioner_->layout_fingerprint();
  return info;
}

absl::Status InProcessParameterStore::Pull(const common::PullBatch& batch,
                                           const common::PullOptions& options) {
  const RequestInfo info = Info(options.clock, 0);
  const absl::Time deadline = absl::Now() + options_.pull_timeout;
  for (Shard* shard : shards_) RETURN_IF_ERROR(shard->BeginPull(info, deadline));
  for (const common::DensePull& p : batch.dense) {
    const common::TableInfo* t = partitioner_->FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_DENSE || p.out.size() != t->numel) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': buffer of ",
                                                     p.out.size(), " floats for a table of ",
                                                     t->numel, " (dense)"));
    }
    for (uint32_t b = 0; b < t->num_blocks; ++b) {
      Shard* shard = shards_[partitioner_->ServerForBlock(*t, b)];
      ASSIGN_OR_RETURN(DenseTablePart * part, shard->FindDenseTable(p.table));
      auto [begin, end] = partitioner_->BlockRange(*t, b);
      part->Read(b, p.out.subspan(begin, end - begin));
    }
  }
  std::vector<std::vector<uint32_t>> positions;
  std::vector<uint64_t> keys;
  std::vector<float> rows;
  for (const common::SparsePull& p : batch.sparse) {
    const common::TableInfo* t = partitioner_->FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_SPARSE || p.out.size() != p.keys.size() * t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': buffer of ",
                                                     p.out.size(), " floats for ", p.keys.size(),
                                                     " rows (sparse)"));
    }
    if (shards_.size() == 1) {
      ASSIGN_OR_RETURN(SparseTablePart * part, shards_[0]->FindSparseTable(p.table));
      RETURN_IF_ERROR(part->Read(p.keys, p.out));
      continue;
    }
    partitioner_->SplitKeysByServer(p.keys, &positions);
    for (size_t s = 0; s < shards_.size(); ++s) {
      if (positions[s].empty()) continue;
      ASSIGN_OR_RETURN(SparseTablePart * part, shards_[s]->FindSparseTable(p.table));
      keys.clear();
      for (uint32_t i : positions[s]) keys.push_back(p.keys[i]);
      rows.resize(keys.size() * t->dim);
      RETURN_IF_ERROR(part->Read(keys, absl::MakeSpan(rows)));
      for (size_t j = 0; j < keys.size(); ++j) {
        std::copy_n(rows.data() + j * t->dim, t->dim, p.out.data() + positions[s][j] * t->dim);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status InProcessParameterStore::Push(const common::PushBatch& batch,
                                           const common::PushOptions& options) {
  // Phase 1: resolve and check everything, per server.
  std::vector<std::vector<PendingUpdate>> updates(shards_.size());
  // Sparse keys and values regrouped by server (kept alive until phase 2 is done).
  std::vector<std::vector<uint64_t>> owned_keys;
  std::vector<std::vector<float>> owned_values;
  owned_keys.reserve(batch.sparse.size() * shards_.size());
  owned_values.reserve(batch.sparse.size() * shards_.size());
  for (const common::DensePush& p : batch.dense) {
    const common::TableInfo* t = partitioner_->FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_DENSE || p.values.size() != t->numel) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': ", p.values.size(),
                                                     " values for a table of ", t->numel,
                                                     " (dense)"));
    }
    for (uint32_t b = 0; b < t->num_blocks; ++b) {
      const uint32_t s = partitioner_->ServerForBlock(*t, b);
      ASSIGN_OR_RETURN(DenseTablePart * part, shards_[s]->FindDenseTable(p.table));
      auto [begin, end] = partitioner_->BlockRange(*t, b);
      auto values = p.values.subspan(begin, end - begin);
      {  // Gradients and deltas alike.
        RETURN_IF_ERROR(shards_[s]->CheckFinite(*part, absl::StrCat("block ", b), values));
      }
      updates[s].push_back(PendingUpdate{part, b, {}, values});
    }
  }
  std::vector<std::vector<uint32_t>> positions;
  for (const common::SparsePush& p : batch.sparse) {
    const common::TableInfo* t = partitioner_->FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_SPARSE || p.values.size() != p.keys.size() * t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': ", p.values.size(),
                                                     " values for ", p.keys.size(),
                                                     " rows (sparse)"));
    }
    partitioner_->SplitKeysByServer(p.keys, &positions);
    for (size_t s = 0; s < shards_.size(); ++s) {
      if (positions[s].empty()) continue;
      ASSIGN_OR_RETURN(SparseTablePart * part, shards_[s]->FindSparseTable(p.table));
      absl::Span<const uint64_t> keys = p.keys;
      absl::Span<const float> values = p.values;
      if (shards_.size() > 1) {
        auto& k = owned_keys.emplace_back();
        auto& v = owned_values.emplace_back();
        for (uint32_t i : positions[s]) {
          k.push_back(p.keys[i]);
          v.insert(v.end(), p.values.begin() + i * t->dim, p.values.begin() + (i + 1) * t->dim);
        }
        keys = k;
        values = v;
      }
      RETURN_IF_ERROR(shards_[s]->CheckFinite(*part, "rows", values));
      updates[s].push_back(PendingUpdate{part, 0, keys, values});
    }
  }
  // Phase 2: apply. Every server gets the push (even an empty one) so that its clock moves.
  RequestInfo info = Info(options.clock, next_sequence_.fetch_add(1));
  info.deadline = absl::Now() + options_.pull_timeout;  // a deterministic push's turn
  UpdateOptions update;
  update.kind = options.is_delta ? UpdateKind::kDelta : UpdateKind::kGradient;
  update.delta_scale = shards_[0]->delta_scale();
  for (size_t s = 0; s < shards_.size(); ++s) {
    RETURN_IF_ERROR(shards_[s]->ApplyPush(info, updates[s], update, 0).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<common::WorkerPosition> InProcessParameterStore::ReportPosition(uint32_t epoch,
                                                                               uint64_t offset) {
  common::WorkerPosition saved;
  for (Shard* shard : shards_) {
    WorkerTracker& workers = shard->workers();
    RETURN_IF_ERROR(workers.Touch(options_.worker_id, options_.worker_incarnation));
    if (offset > 0 || epoch > 0) workers.SetDataPosition(options_.worker_id, offset, epoch);
    const std::optional<WorkerCheckpoint> w = workers.Get(options_.worker_id);
    if (!w.has_value()) continue;
    if (std::make_pair(w->epoch(), w->data_offset()) > std::make_pair(saved.epoch, saved.offset)) {
      saved.epoch = w->epoch();
      saved.offset = w->data_offset();
    }
    saved.clock = std::max(saved.clock, w->clock());
  }
  return saved;
}

absl::Status InProcessParameterStore::Finish() {
  for (Shard* shard : shards_) {
    shard->workers().Finish(options_.worker_id, options_.worker_incarnation);
  }
  return absl::OkStatus();
}

}  // namespace ps::server
