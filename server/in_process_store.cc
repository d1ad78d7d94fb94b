#include "server/in_process_store.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/partitioner.h"
#include "common/startup/cores.h"
#include "common/status_macros.h"

namespace ps::server {

ShardOptions CentralizedShardOptions(const JobConfig& config, uint32_t server_index) {
  ShardOptions options;
  options.server_index = server_index;
  options.reject_nonfinite = config.server().reject_nonfinite();
  options.parallel_apply_values = ParallelApplyValues(config, common::UsableCores());
  options.parallel_apply_range_values = ParallelApplyRangeValues(config);
  options.apply_threads = ApplyHelpers(config, common::UsableCores());
  return options;
}

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
    ASSIGN_OR_RETURN(std::unique_ptr<Shard> shard,
                     Shard::Create(config, CentralizedShardOptions(config, s)));
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

namespace {

absl::string_view Bytes(absl::Span<const float> values) {
  return absl::string_view(reinterpret_cast<const char*>(values.data()),
                           values.size() * sizeof(float));
}

}  // namespace

// One table of a pull as one shard is asked for it, and where its values go.
struct InProcessParameterStore::PullPart {
  absl::string_view table;
  absl::Span<float> out;            // the caller's buffer for the whole table
  const common::TableInfo* info = nullptr;
  std::vector<uint32_t> blocks;     // dense
  absl::Span<const uint64_t> keys;  // sparse: the caller's keys, or this shard's in `own_keys`
  std::vector<uint64_t> own_keys;
  std::vector<uint32_t> positions;  // rows of `out` that own_keys go to (several shards)
};

absl::Status InProcessParameterStore::SplitPull(const common::PullBatch& batch,
                                                std::vector<std::vector<PullPart>>* parts) const {
  parts->assign(shards_.size(), {});
  for (const common::DensePull& p : batch.dense) {
    const common::TableInfo* t = partitioner_->FindTable(p.table);
    if (t == nullptr || t->kind != TABLE_KIND_DENSE) {
      // Not a dense table: the shard refuses it (unknown_table, wrong_kind) as it would from
      // the wire.
      (*parts)[0].push_back(PullPart{p.table, p.out, t, {0}, {}, {}, {}});
      continue;
    }
    if (p.out.size() != t->numel) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': buffer of ",
                                                     p.out.size(), " floats for a table of ",
                                                     t->numel, " (dense)"));
    }
    std::vector<PullPart*> by_shard(shards_.size(), nullptr);
    for (uint32_t b = 0; b < t->num_blocks; ++b) {
      const uint32_t s = partitioner_->ServerForBlock(*t, b);
      if (by_shard[s] == nullptr) by_shard[s] = &(*parts)[s].emplace_back(PullPart{p.table, p.out, t});
      by_shard[s]->blocks.push_back(b);
    }
  }
  std::vector<std::vector<uint32_t>> positions;
  for (const common::SparsePull& p : batch.sparse) {
    const common::TableInfo* t = partitioner_->FindTable(p.table);
    if (t == nullptr || t->kind != TABLE_KIND_SPARSE || shards_.size() == 1) {
      if (t != nullptr && t->kind == TABLE_KIND_SPARSE && p.out.size() != p.keys.size() * t->dim) {
        return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': buffer of ",
                                                       p.out.size(), " floats for ", p.keys.size(),
                                                       " rows (sparse)"));
      }
      (*parts)[0].push_back(PullPart{p.table, p.out, t, {}, p.keys});
      continue;
    }
    if (p.out.size() != p.keys.size() * t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': buffer of ",
                                                     p.out.size(), " floats for ", p.keys.size(),
                                                     " rows (sparse)"));
    }
    partitioner_->SplitKeysByServer(p.keys, &positions);
    for (size_t s = 0; s < shards_.size(); ++s) {
      if (positions[s].empty()) continue;
      PullPart& part = (*parts)[s].emplace_back(PullPart{p.table, p.out, t});
      for (uint32_t i : positions[s]) part.own_keys.push_back(p.keys[i]);
      part.keys = part.own_keys;
      part.positions = std::move(positions[s]);
    }
  }
  return absl::OkStatus();
}

absl::Status InProcessParameterStore::Pull(const common::PullBatch& batch,
                                           const common::PullOptions& options) {
  std::vector<std::vector<PullPart>> parts;
  RETURN_IF_ERROR(SplitPull(batch, &parts));
  std::vector<std::vector<PullTable>> views(shards_.size());
  const RequestInfo info = Info(options.clock, 0);
  // Every shard checks its part before any waits or reads: a bad pull changes nothing.
  for (size_t s = 0; s < shards_.size(); ++s) {
    for (const PullPart& p : parts[s]) {
      views[s].push_back(PullTable{p.table, ENCODING_FLOAT32, p.blocks, p.keys});
    }
    RETURN_IF_ERROR(shards_[s]->CheckPull(info, views[s]).status());
  }
  const absl::Time deadline = absl::Now() + options_.pull_timeout;
  for (Shard* shard : shards_) RETURN_IF_ERROR(shard->BeginPull(info, deadline));
  std::vector<float> rows;
  for (size_t s = 0; s < shards_.size(); ++s) {
    auto sink = [&](size_t table, size_t part, size_t n,
                    absl::FunctionRef<absl::Status(absl::Span<float>)> fill) -> absl::Status {
      const PullPart& p = parts[s][table];
      if (part != kRowsPart) {
        auto [begin, end] = partitioner_->BlockRange(*p.info, p.blocks[part]);
        return fill(p.out.subspan(begin, end - begin));
      }
      if (p.positions.empty()) return fill(p.out.first(n));
      // This shard's rows, scattered to where their keys are in the caller's request.
      rows.resize(n);
      RETURN_IF_ERROR(fill(absl::MakeSpan(rows)));
      const size_t dim = p.info->dim;
      for (size_t j = 0; j < p.positions.size(); ++j) {
        std::copy_n(rows.data() + j * dim, dim, p.out.data() + p.positions[j] * dim);
      }
      return absl::OkStatus();
    };
    // Dense blocks are filled in the caller's buffers, where they stay.
    RETURN_IF_ERROR(shards_[s]->ReadPull(views[s], sink, /*stream=*/false, /*in_place=*/true));
  }
  return absl::OkStatus();
}

// The tables of a push as each shard gets them, and the sparse rows regrouped by shard.
struct InProcessParameterStore::SplitPush {
  std::vector<std::vector<PushTable>> tables;  // by shard
  std::deque<std::vector<uint64_t>> keys;      // deques: views into them stay valid
  std::deque<std::vector<float>> values;
};

absl::Status InProcessParameterStore::SplitDense(const common::PushBatch& batch,
                                                 SplitPush* split) const {
  for (const common::DensePush& p : batch.dense) {
    const common::TableInfo* t = partitioner_->FindTable(p.table);
    if (t == nullptr || t->kind != TABLE_KIND_DENSE || p.values.size() != t->numel) {
      // Not something to cut into blocks: the shard of block 0 gets it whole as block 0 and
      // refuses it (unknown_table, wrong_kind, bad_size) as it would from the wire.
      const uint32_t s =
          t != nullptr && t->kind == TABLE_KIND_DENSE ? partitioner_->ServerForBlock(*t, 0) : 0;
      PushTable& view = split->tables[s].emplace_back();
      view.table = p.table;
      view.blocks.push_back(PushTable::Block{0, Bytes(p.values)});
      continue;
    }
    std::vector<PushTable*> by_shard(shards_.size(), nullptr);
    for (uint32_t b = 0; b < t->num_blocks; ++b) {
      const uint32_t s = partitioner_->ServerForBlock(*t, b);
      if (by_shard[s] == nullptr) {
        by_shard[s] = &split->tables[s].emplace_back();
        by_shard[s]->table = p.table;
      }
      auto [begin, end] = partitioner_->BlockRange(*t, b);
      by_shard[s]->blocks.push_back(PushTable::Block{b, Bytes(p.values.subspan(begin, end - begin))});
    }
  }
  return absl::OkStatus();
}

void InProcessParameterStore::SplitSparse(const common::PushBatch& batch, SplitPush* split) const {
  std::vector<std::vector<uint32_t>> positions;
  for (const common::SparsePush& p : batch.sparse) {
    const common::TableInfo* t = partitioner_->FindTable(p.table);
    if (t == nullptr || t->kind != TABLE_KIND_SPARSE || p.values.size() != p.keys.size() * t->dim ||
        shards_.size() == 1) {
      // Whole, to the server of the first key: one shard's part, or one the shard refuses
      // (unknown_table, wrong_kind, bad_size).
      const uint32_t s = t != nullptr && t->kind == TABLE_KIND_SPARSE && !p.keys.empty()
                             ? partitioner_->ServerForKey(p.keys[0])
                             : 0;
      PushTable& view = split->tables[s].emplace_back();
      view.table = p.table;
      view.keys = p.keys;
      view.rows = Bytes(p.values);
      continue;
    }
    partitioner_->SplitKeysByServer(p.keys, &positions);
    for (size_t s = 0; s < shards_.size(); ++s) {
      if (positions[s].empty()) continue;
      auto& k = split->keys.emplace_back();
      auto& v = split->values.emplace_back();
      for (uint32_t i : positions[s]) {
        k.push_back(p.keys[i]);
        v.insert(v.end(), p.values.begin() + i * t->dim, p.values.begin() + (i + 1) * t->dim);
      }
      PushTable& view = split->tables[s].emplace_back();
      view.table = p.table;
      view.keys = k;
      view.rows = Bytes(v);
    }
  }
}

absl::Status InProcessParameterStore::Push(const common::PushBatch& batch,
                                           const common::PushOptions& options) {
  SplitPush split;
  split.tables.resize(shards_.size());
  RETURN_IF_ERROR(SplitDense(batch, &split));
  SplitSparse(batch, &split);
  RequestInfo info = Info(options.clock, next_sequence_.fetch_add(1));
  info.deadline = absl::Now() + options_.pull_timeout;  // a deterministic push's turn
  // Every shard checks its part before any applies: a bad push changes nothing anywhere.
  // Every shard gets the push (even an empty one) so that its clock moves.
  std::vector<CheckedPush> checked;
  checked.reserve(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    PushView view;
    view.info = info;
    view.is_delta = options.is_delta;
    view.tables = split.tables[s];
    ASSIGN_OR_RETURN(CheckedPush c, shards_[s]->CheckPush(view));
    checked.push_back(std::move(c));
  }
  for (size_t s = 0; s < shards_.size(); ++s) {
    RETURN_IF_ERROR(shards_[s]->ApplyPush(std::move(checked[s])).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<common::WorkerPosition> InProcessParameterStore::ReportPosition(uint32_t epoch,
                                                                               uint64_t offset) {
  common::WorkerPosition saved;
  for (Shard* shard : shards_) {
    WorkerTracker& workers = shard->workers();
    RETURN_IF_ERROR(workers.Touch(options_.worker_id, options_.worker_incarnation));
    if (offset > 0 || epoch > 0) {
      workers.SetDataPosition(options_.worker_id, options_.worker_incarnation, offset, epoch);
    }
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
    RETURN_IF_ERROR(shard->workers().Finish(options_.worker_id, options_.worker_incarnation));
  }
  return absl::OkStatus();
}

}  // namespace ps::server
