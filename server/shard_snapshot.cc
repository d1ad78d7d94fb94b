// Shard's snapshots and restores (the checkpointer's side of a shard).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/shard.h"

namespace ps::server {
namespace {

// Snapshot record keys: "<table name>\0<table-part key>". Table names never hold '\0'.
std::string RecordKey(absl::string_view table, absl::string_view part) {
  std::string key(table);
  key.push_back('\0');
  key.append(part.data(), part.size());
  return key;
}

}  // namespace

// ---- Snapshots --------------------------------------------------------------------------

absl::StatusOr<CheckpointMeta> Shard::Snapshot(const SnapshotSink& sink, size_t record_bytes) {
  absl::MutexLock one_at_a_time(&snapshot_mu_);
  // Tables call their sink from the writer (this thread) and from pushing threads: serialize
  // the calls into `sink`, adding the table's name to each record key.
  absl::Mutex sink_mu;
  std::vector<SnapshotSink> table_sinks;
  table_sinks.reserve(tables_.size());
  for (auto& t : tables_) {
    table_sinks.push_back(
        [&sink, &sink_mu, name = t->name()](absl::string_view part, absl::string_view value) {
          absl::MutexLock lock(&sink_mu);
          return sink(RecordKey(name, part), value);
        });
  }
  CheckpointMeta meta;
  {
    // The cut: no push is half-applied while this is held.
    absl::WriterMutexLock lock(&apply_mu_);
    const uint64_t epoch = ++snapshot_epoch_;
    for (size_t i = 0; i < tables_.size(); ++i) tables_[i]->BeginSnapshot(epoch, &table_sinks[i]);
    meta.set_server_index(options_.server_index);
    meta.set_num_servers(partitioner_.num_servers());
    meta.set_layout_fingerprint(partitioner_.layout_fingerprint());
    meta.set_server_incarnation(options_.incarnation);
    meta.set_updates_applied(updates_applied());
    meta.set_unix_micros(absl::ToUnixMicros(absl::Now()));
    for (auto& w : workers_.Save()) *meta.add_workers() = std::move(w);
    for (auto& t : tables_) {
      TableCheckpoint* tc = meta.add_tables();
      tc->set_name(t->name());
      tc->set_optimizer_kind(static_cast<int>(t->optimizer().kind));
      tc->set_num_slots(t->num_slots());
      tc->set_updates_applied(t->updates_applied());
    }
  }
  absl::Status status;
  for (size_t i = 0; i < tables_.size() && status.ok(); ++i) {
    status = tables_[i]->WriteSnapshot(record_bytes);
  }
  {
    // Updates stop writing through before the sinks go away.
    absl::WriterMutexLock lock(&apply_mu_);
    for (auto& t : tables_) t->EndSnapshot();
  }
  RETURN_IF_ERROR(status);
  // The rows the records hold (a row a pull created after the cut is in neither; counted at
  // the cut it was, found in review 2026-12-05).
  for (size_t i = 0; i < tables_.size(); ++i) {
    meta.mutable_tables(static_cast<int>(i))->set_rows(tables_[i]->SnapshotRows());
  }
  return meta;
}

absl::Status Shard::BeginRestore(const CheckpointMeta& meta) {
  if (meta.layout_fingerprint() != partitioner_.layout_fingerprint() ||
      meta.num_servers() != partitioner_.num_servers()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint was written with layout ", absl::Hex(meta.layout_fingerprint()), " (",
        meta.num_servers(), " servers); this server has layout ",
        absl::Hex(partitioner_.layout_fingerprint()), " (", partitioner_.num_servers(),
        " servers): tables or partitioning changed"));
  }
  if (meta.server_index() != options_.server_index) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint belongs to server ",
                                                      meta.server_index(), ", not server ",
                                                      options_.server_index));
  }
  for (const auto& w : meta.workers()) {
    if (w.clock() < 0 || w.clock() > common::kMaxClock) {
      return absl::DataLossError(absl::StrCat("the checkpoint holds worker ", w.worker_id(),
                                              " at clock ", w.clock(), " (not in [0, ",
                                              common::kMaxClock, "])"));
    }
  }
  for (const auto& tc : meta.tables()) {
    auto it = by_name_.find(tc.name());
    if (it == by_name_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint has table '", tc.name(), "', the config does not"));
    }
    if (tc.num_slots() != it->second->num_slots() ||
        tc.optimizer_kind() != static_cast<int>(it->second->optimizer().kind)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", tc.name(), "': the checkpoint holds optimizer kind ", tc.optimizer_kind(),
          " with ", tc.num_slots(), " slots; the config asks for kind ",
          static_cast<int>(it->second->optimizer().kind), " with ", it->second->num_slots()));
    }
  }
  return absl::OkStatus();
}

absl::Status Shard::RestoreRecord(absl::string_view key, absl::string_view value) {
  const size_t sep = key.find('\0');
  if (sep == absl::string_view::npos) {
    return absl::DataLossError("checkpoint record key has no table name");
  }
  auto it = by_name_.find(key.substr(0, sep));
  if (it == by_name_.end()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint record for unknown table '", key.substr(0, sep), "'"));
  }
  return it->second->RestoreRecord(key.substr(sep + 1), value);
}

void Shard::EndRestore(const CheckpointMeta& meta) {
  workers_.Restore({meta.workers().begin(), meta.workers().end()},
                   absl::FromUnixMicros(meta.unix_micros()));
  for (const auto& tc : meta.tables()) {
    // (BeginRestore checked that every table of the checkpoint is the config's.)
    if (auto it = by_name_.find(tc.name()); it != by_name_.end()) {
      it->second->set_updates_applied(tc.updates_applied());
    }
  }
  absl::MutexLock lock(&stats_mu_);
  updates_applied_ = meta.updates_applied();
}

}  // namespace ps::server
