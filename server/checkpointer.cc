#include "server/checkpointer.h"

#include <malloc.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ps::server {

absl::StatusOr<std::unique_ptr<storage::CheckpointStore>> Checkpointer::OpenStore(
    const CheckpointerOptions& options) {
  storage::CheckpointStoreOptions store_options;
  store_options.path = options.data_dir;
  store_options.keep = options.keep;
  ASSIGN_OR_RETURN(auto store, storage::CheckpointStore::Open(store_options),
                   absl::StrCat("data dir ", options.data_dir));
  return store;
}

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Create(
    Shard* shard, const CheckpointerOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("no data dir");
  ASSIGN_OR_RETURN(auto store, OpenStore(options));
  return std::unique_ptr<Checkpointer>(new Checkpointer(shard, options, std::move(store)));
}

Checkpointer::Checkpointer(Shard* shard, const CheckpointerOptions& options,
                           std::unique_ptr<storage::CheckpointStore> store)
    : shard_(shard), options_(options), store_(std::move(store)) {}

Checkpointer::~Checkpointer() { Stop(); }

absl::StatusOr<RestoreReport> Checkpointer::Restore(std::optional<uint64_t> id) {
  absl::ReaderMutexLock store_lock(&store_mu_);
  if (store_ == nullptr) return absl::FailedPreconditionError("checkpoint store is not open");
  // A checkpoint whose commit record does not read is passed over as one that fails
  // verification is (before 2026-12-05 the newest one's failed the restore as a whole).
  std::vector<absl::Status> unreadable;
  ASSIGN_OR_RETURN(const std::vector<storage::CheckpointInfo> all, store_->List(&unreadable));
  RestoreReport report;
  for (const absl::Status& s : unreadable) LOG(ERROR) << "passing over a checkpoint: " << s;
  if (id.has_value()) {
    for (const storage::CheckpointInfo& c : all) {
      if (c.id == *id) {
        RETURN_IF_ERROR(RestoreOne(c, &report));
        // The newer ones are another timeline from here on: a restart must continue from
        // this one, and never fall back to them (before 2026-12-05 it took the newest).
        RETURN_IF_ERROR_CTX(store_->MakeCurrent(c.id),
                            "restored, but not recorded as the current checkpoint");
        ApplyRetentionAfterRestore();
        return report;
      }
    }
    const std::string prefix = absl::StrCat("checkpoint ", *id, ":");
    for (const absl::Status& s : unreadable) {
      if (absl::StrContains(s.message(), prefix)) return s;
    }
    return absl::NotFoundError(
        absl::StrCat("no complete checkpoint ", *id, " in ", options_.data_dir));
  }
  ASSIGN_OR_RETURN(const std::vector<uint64_t> superseded, store_->Superseded(),
                   "restore an explicit checkpoint id to choose the current one");
  // An unreadable checkpoint that was superseded is not one a restore would have taken: it
  // does not make a store with nothing current to restore fail.
  for (const absl::Status& s : unreadable) {
    const bool was_superseded = std::any_of(superseded.begin(), superseded.end(), [&](uint64_t i) {
      return absl::StrContains(s.message(), absl::StrCat("checkpoint ", i, ":"));
    });
    if (!was_superseded) report.skipped.push_back(s);
  }
  // Newest first; a checkpoint that fails verification is passed over, never loaded, and so
  // is one a restore of an older one superseded.
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (std::binary_search(superseded.begin(), superseded.end(), it->id)) {
      LOG(INFO) << "passing over checkpoint " << it->id
                << ": a restore of an older checkpoint superseded it";
      report.superseded.push_back(it->id);
      continue;
    }
    absl::Status status = RestoreOne(*it, &report);
    if (status.ok()) {
      // Newer ones that fail verification are superseded by it, as by a restore of its id:
      // counted as current, they would have retention delete good older ones while they stay
      // (found in review, 2026-12-06: with `keep` 2, the first checkpoint after falling back
      // from a damaged newest one deleted the one restored from).
      if (!report.skipped.empty()) {
        RETURN_IF_ERROR_CTX(store_->MakeCurrent(it->id),
                            "restored, but the damaged newer checkpoints not recorded as such");
      }
      ApplyRetentionAfterRestore();
      return report;
    }
    if (!absl::IsDataLoss(status) || report.checkpoint_id != 0) return status;
    report.skipped.push_back(status);
  }
  if (report.skipped.empty()) return report;  // An empty store.
  std::vector<std::string> messages;
  for (const absl::Status& s : report.skipped) messages.emplace_back(s.message());
  return absl::DataLossError(absl::StrCat("no checkpoint in ", options_.data_dir,
                                          " passes verification: ",
                                          absl::StrJoin(messages, "; ")));
}

absl::Status Checkpointer::StartFresh() {
  absl::ReaderMutexLock store_lock(&store_mu_);
  if (store_ == nullptr) return absl::FailedPreconditionError("checkpoint store is not open");
  RETURN_IF_ERROR(store_->MakeCurrent(0));
  ApplyRetentionAfterRestore();
  return absl::OkStatus();
}

void Checkpointer::ApplyRetentionAfterRestore() {
  // Only now, with the checkpoint taken verified (the store's Open deletes none): a failure
  // is retried by the next commit and does not fail the start.
  if (absl::Status s = store_->ApplyRetentionNow(); !s.ok()) {
    LOG(WARNING) << "restored, but deleting old checkpoints failed: " << s;
  }
}

// Sets report->checkpoint_id only once the shard has been touched (then it is not fresh).
absl::Status Checkpointer::RestoreOne(const storage::CheckpointInfo& info,
                                      RestoreReport* report) {
  CheckpointMeta meta;
  if (!meta.ParseFromString(info.metadata)) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", info.id, ": metadata record does not parse"));
  }
  // Verify every checksum before touching the shard: a corrupt checkpoint changes nothing.
  RETURN_IF_ERROR(store_->Verify(info.id));
  RETURN_IF_ERROR_CTX(shard_->BeginRestore(meta), absl::StrCat("checkpoint ", info.id));
  report->checkpoint_id = info.id;
  RETURN_IF_ERROR(store_->Read(info.id, [&](absl::string_view key, absl::string_view value) {
    return shard_->RestoreRecord(key, value);
  }));
  shard_->EndRestore(meta);
  report->updates_applied = meta.updates_applied();
  report->bytes = info.bytes;
  report->unix_micros = info.unix_micros;
  restored_ = *report;
  absl::MutexLock lock(&mu_);
  last_id_ = info.id;
  last_time_ = absl::FromUnixMicros(info.unix_micros);
  last_updates_ = meta.updates_applied();
  return absl::OkStatus();
}

absl::StatusOr<CheckpointResponse> Checkpointer::CheckpointNow() {
  uint64_t ticket;
  {
    absl::MutexLock lock(&mu_);
    ticket = ++requests_;
  }
  absl::MutexLock one_at_a_time(&write_mu_);
  uint64_t covers;
  {
    absl::MutexLock lock(&mu_);
    // A checkpoint begun after this request arrived holds all it asked for: its answer is
    // this one's too. So requests that pile up while one is written cost one more, not one
    // each (each held a server thread, and the drain waited for them all).
    if (covered_ >= ticket) return last_result_;
    covers = requests_;
  }
  if (write_hook_) write_hook_();
  absl::Status reopened = ReopenStoreIfFailed();
  absl::StatusOr<CheckpointResponse> result =
      reopened.ok() ? Write() : absl::StatusOr<CheckpointResponse>(reopened);
  absl::MutexLock lock(&mu_);
  ++(result.ok() ? written_ : failed_);
  covered_ = covers;
  last_result_ = result;
  return result;
}

uint64_t Checkpointer::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

absl::Status Checkpointer::ReopenStoreIfFailed() {
  {
    absl::ReaderMutexLock store_lock(&store_mu_);
    if (store_ != nullptr && !store_->NeedsReopen()) return absl::OkStatus();
  }
  absl::MutexLock store_lock(&store_mu_);
  if (reopen_hook_) reopen_hook_();
  // Closed first: RocksDB's lock file admits one open store per directory.
  store_.reset();
  ASSIGN_OR_RETURN(store_, OpenStore(options_), "reopen after a failed checkpoint");
  LOG(INFO) << "checkpoint store " << options_.data_dir
            << " reopened after a failed checkpoint: the next one starts from the files on disk";
  return absl::OkStatus();
}

void Checkpointer::FailStoreForTest(const absl::Status& status) {
  absl::ReaderMutexLock store_lock(&store_mu_);
  store_->MarkWriteFailedForTest(status);
}

absl::StatusOr<CheckpointResponse> Checkpointer::Write() {
  absl::ReaderMutexLock store_lock(&store_mu_);
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(auto writer, store_->BeginCheckpoint());
  ASSIGN_OR_RETURN(CheckpointMeta meta,
                   shard_->Snapshot(
                       [&](absl::string_view key, absl::string_view value) {
                         return writer->Put(key, value);
                       },
                       options_.record_bytes));
  ASSIGN_OR_RETURN(storage::CheckpointInfo info, writer->Commit(meta.SerializeAsString()));
  const absl::Duration took = absl::Now() - start;
#ifdef __GLIBC__
  // A checkpoint streams the whole shard through RocksDB's buffers; hand the freed pages
  // back instead of leaving them in malloc's per-thread heaps (a few ms, once per checkpoint).
  malloc_trim(0);
#endif
  {
    absl::MutexLock lock(&mu_);
    last_id_ = info.id;
    last_time_ = absl::Now();
    last_duration_s_ = absl::ToDoubleSeconds(took);
    last_updates_ = meta.updates_applied();
  }
  VLOG(1) << "checkpoint " << info.id << ": " << info.bytes << " bytes, " << info.num_records
          << " records, " << meta.updates_applied() << " updates, " << took;
  CheckpointResponse response;
  response.set_checkpoint_id(info.id);
  response.set_duration_s(absl::ToDoubleSeconds(took));
  response.set_bytes(info.bytes);
  response.set_updates_applied(meta.updates_applied());
  return response;
}

void Checkpointer::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void Checkpointer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Checkpointer::Loop() {
  absl::Time last_attempt = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Wake every 100 ms to look at the update count; Stop() wakes us at once.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100));
      if (stopping_) return;
    }
    uint64_t since;
    {
      absl::MutexLock lock(&mu_);
      since = shard_->updates_applied() - last_updates_;
    }
    const bool timer_due = options_.interval > absl::ZeroDuration() &&
                           absl::Now() - last_attempt >= options_.interval;
    const bool count_due = options_.every_updates > 0 && since >= options_.every_updates;
    if (!timer_due && !count_due) continue;
    last_attempt = absl::Now();
    absl::StatusOr<CheckpointResponse> r = CheckpointNow();
    if (!r.ok()) {
      LOG(ERROR) << "periodic checkpoint failed (training goes on): " << r.status();
    }
  }
}

void Checkpointer::FillStats(StatsResponse* out) {
  std::optional<uint64_t> bytes;
  if (store_mu_.ReaderTryLock()) {
    if (store_ != nullptr) bytes = store_->ApproximateSizeBytes();
    store_mu_.ReaderUnlock();
  }
  absl::MutexLock lock(&mu_);
  if (bytes.has_value()) storage_bytes_ = *bytes;
  if (storage_bytes_ > 0) out->set_storage_bytes(storage_bytes_);
  out->set_last_checkpoint_id(last_id_);
  if (last_id_ != 0) {
    out->set_last_checkpoint_age_s(absl::ToDoubleSeconds(absl::Now() - last_time_));
  }
  out->set_last_checkpoint_duration_s(last_duration_s_);
  out->set_checkpoints_written(written_);
  out->set_checkpoints_failed(failed_);
}

}  // namespace ps::server
