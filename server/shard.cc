#include "server/shard.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/parameter_store.h"
#include "common/startup/cores.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ps::server {
namespace {

constexpr char kVersion[] = "ps 0.1.0";
// Status payload carrying the reason a request was refused (see RejectionReason).
constexpr char kReasonPayload[] = "type.ps/ps.RejectionReason";

// Why the worker tracker refused a request's header: FAILED_PRECONDITION is an older
// incarnation of the worker; otherwise (the worker id is checked before) a sequence number
// it cannot take.
const char* HeaderRejection(const absl::Status& status) {
  if (absl::IsFailedPrecondition(status)) return "stale_incarnation";
  if (absl::IsOutOfRange(status)) return "sequence_given_up";
  return "bad_sequence";
}

WorkerTrackerOptions TrackerOptions(const JobConfig& config) {
  WorkerTrackerOptions o;
  o.num_workers = config.cluster().num_workers();
  if (config.training().has_staleness()) o.staleness = config.training().staleness();
  o.lease = absl::Seconds(config.server().worker_lease_s());
  return o;
}

// The dense blocks `updates` name, each once, in SortForLocking's order (other updaters and
// readers hold one block lock at a time).
std::vector<std::pair<DenseTablePart*, uint32_t>> LockOrder(
    absl::Span<const PendingUpdate> updates) {
  std::vector<std::pair<DenseTablePart*, uint32_t>> blocks;
  blocks.reserve(updates.size());
  for (const PendingUpdate& u : updates) {
    if (u.table->info().kind != TABLE_KIND_DENSE) continue;
    blocks.emplace_back(static_cast<DenseTablePart*>(u.table), u.block);
  }
  SortForLocking(&blocks);
  return blocks;
}

}  // namespace

void SortForLocking(std::vector<std::pair<DenseTablePart*, uint32_t>>* blocks) {
  auto before = [](const std::pair<DenseTablePart*, uint32_t>& a,
                   const std::pair<DenseTablePart*, uint32_t>& b) {
    return std::less<const DenseTablePart*>()(a.first, b.first) ||
           (a.first == b.first && a.second < b.second);
  };
  std::sort(blocks->begin(), blocks->end(), before);
  blocks->erase(std::unique(blocks->begin(), blocks->end()), blocks->end());
}

size_t ParallelApplyValues(const JobConfig& config, unsigned usable_cores) {
  if (config.server().parallel_apply_min_values() > 0) {
    return static_cast<size_t>(config.server().parallel_apply_min_values());
  }
  return usable_cores >= 8 ? kManyCoresParallelApplyValues : kParallelApplyValues;
}

absl::Duration ApplySpin(const JobConfig& config, unsigned usable_cores) {
  const int32_t us = config.server().apply_spin_us();
  if (us != 0) return us > 0 ? absl::Microseconds(us) : absl::ZeroDuration();
  return usable_cores >= 8 ? kManyCoresApplySpin : absl::ZeroDuration();
}

int ApplyHelpers(const JobConfig& config, unsigned usable_cores) {
  const uint32_t threads = config.server().apply_threads();
  return static_cast<int>(threads > 0 ? threads : std::max(1u, usable_cores)) - 1;
}

size_t ParallelApplyRangeValues(const JobConfig& config) {
  const uint64_t values = config.server().parallel_apply_range_values();
  return values > 0 ? static_cast<size_t>(values) : kParallelApplyRangeValues;
}

absl::StatusOr<std::unique_ptr<Shard>> Shard::Create(const JobConfig& config,
                                                     const ShardOptions& options) {
  ASSIGN_OR_RETURN(common::Partitioner partitioner, common::Partitioner::Create(config));
  if (options.server_index >= partitioner.num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat("server index ", options.server_index,
                                                   " is out of range: the job has ",
                                                   partitioner.num_servers(), " servers"));
  }
  std::vector<std::string> spilling;  // sparse tables with a memory budget, in table order
  for (const auto& table : partitioner.tables()) {
    RETURN_IF_ERROR_CTX(
        kernels::ValidateOptimizerParams(ToOptimizerParams(table.config->optimizer())),
        absl::StrCat("table '", table.name, "' optimizer"));
    if (table.config->memory_budget_rows() == 0) continue;
    if (table.kind != TABLE_KIND_SPARSE) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table.name, "': memory_budget_rows applies to sparse tables only"));
    }
    if (options.spill_dir.empty()) {
      LOG(WARNING) << "table '" << table.name << "': memory_budget_rows "
                   << table.config->memory_budget_rows()
                   << " is ignored: no spill directory (every row stays in memory)";
      continue;
    }
    spilling.push_back(table.name);
  }
  RETURN_IF_ERROR(CheckMemoryAtStart(partitioner, options, spilling));
  std::unique_ptr<storage::SpillStore> spill_store;
  if (!spilling.empty()) {
    storage::SpillStoreOptions spill_options;
    spill_options.path = options.spill_dir;
    ASSIGN_OR_RETURN(spill_store, storage::SpillStore::Open(spill_options, spilling));
  }
  std::unique_ptr<Shard> shard(new Shard(config, options, std::move(partitioner),
                                         TrackerOptions(config), std::move(spill_store)));
  if (options.cancelled && options.cancelled()) {
    // The constructor stopped allocating at the first block after the request.
    return absl::CancelledError(absl::StrCat(
        "server ", options.server_index, ": start cancelled while allocating the tables (",
        shard->memory_.used(), " bytes allocated so far; released)"));
  }
  return shard;
}

Shard::Shard(const JobConfig& config, const ShardOptions& options, common::Partitioner partitioner,
             const WorkerTrackerOptions& tracker_options,
             std::unique_ptr<storage::SpillStore> spill_store)
    : config_(config),
      options_(options),
      partitioner_(std::move(partitioner)),
      spill_store_(std::move(spill_store)),
      memory_(options.max_memory_bytes),
      start_time_(absl::Now()),
      workers_(tracker_options, options.now) {
  const int helpers = options.apply_threads >= 0
                          ? options.apply_threads
                          : static_cast<int>(common::UsableCores()) - 1;
  if (helpers > 0) {
    apply_pool_ = std::make_unique<common::ThreadPool>(
        helpers, common::ThreadPool::Spin{helpers, options.apply_spin});
  }
  size_t next_spill_table = 0;  // Create() opened one spill table per budgeted sparse table
  for (const auto& info : partitioner_.tables()) {
    const kernels::OptimizerParams opt = ToOptimizerParams(info.config->optimizer());
    std::unique_ptr<TablePart> part;
    if (info.kind == TABLE_KIND_DENSE) {
      part = std::make_unique<DenseTablePart>(info, opt, partitioner_, options_.server_index,
                                              options_.cancelled);
    } else if (spill_store_ != nullptr && info.config->memory_budget_rows() > 0) {
      storage::SpillTable* spill = spill_store_->table(next_spill_table++);
      CHECK_EQ(spill->name(), info.name);
      part = std::make_unique<SparseTablePart>(info, opt, spill, info.config->memory_budget_rows());
    } else {
      part = std::make_unique<SparseTablePart>(info, opt);
    }
    if (info.kind == TABLE_KIND_SPARSE) {
      auto* sparse = static_cast<SparseTablePart*>(part.get());
      sparse->set_key_owner([this](uint64_t key) {
        return partitioner_.ServerForKey(key) == options_.server_index;
      });
      sparse->set_memory_budget(&memory_);
      sparse->set_helpers(apply_pool_.get());
    } else {
      memory_.Add(static_cast<int64_t>(part->NumBytes()));
    }
    by_name_[info.name] = part.get();
    tables_.push_back(std::move(part));
  }
}

std::string RejectionReason(const absl::Status& status) {
  auto reason = status.GetPayload(kReasonPayload);  // absl::optional<absl::Cord>
  return reason.has_value() ? std::string(*reason) : std::string();
}

absl::Status WithRejectionReason(absl::Status status, absl::string_view reason) {
  if (!status.ok()) status.SetPayload(kReasonPayload, absl::Cord(reason));
  return status;
}

void Shard::CloseWaiters(absl::string_view why) {
  workers_.CloseWaiters(WithRejectionReason(absl::UnavailableError(why), "server_stopping"));
}

// ---- Checks -----------------------------------------------------------------------------

void Shard::CountRejection(absl::string_view reason) {
  absl::MutexLock lock(&stats_mu_);
  ++rejected_[reason];
}

void Shard::UncountRejection(absl::string_view reason) {
  if (reason.empty()) return;
  absl::MutexLock lock(&stats_mu_);
  auto it = rejected_.find(reason);
  if (it == rejected_.end()) return;
  if (--it->second == 0) rejected_.erase(it);
}

absl::Status Shard::Reject(absl::string_view reason, absl::Status status) {
  CountRejection(reason);
  return WithRejectionReason(std::move(status), reason);
}

absl::Status Shard::CheckLayout(const RequestInfo& info) {
  if (info.layout_fingerprint == partitioner_.layout_fingerprint()) return absl::OkStatus();
  return Reject(
      "layout_mismatch",
      absl::FailedPreconditionError(absl::StrCat(
          "layout mismatch: request partitioned with layout ", absl::Hex(info.layout_fingerprint),
          ", server ", options_.server_index, " has ", absl::Hex(partitioner_.layout_fingerprint()),
          " (different servers, tables or partitioning in the config)")));
}

absl::StatusOr<TablePart*> Shard::FindTable(absl::string_view name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return Reject("unknown_table",
                  absl::NotFoundError(absl::StrCat("table '", name, "' is not known to server ",
                                                   options_.server_index)));
  }
  return it->second;
}

absl::Status Shard::CheckEncoding(Encoding encoding) {
  if (common::IsKnownEncoding(encoding)) return absl::OkStatus();
  return Reject("bad_encoding", absl::InvalidArgumentError(
                                    absl::StrCat("unknown payload encoding ", encoding)));
}

absl::Status Shard::CheckBlock(const DenseTablePart& table, uint32_t block, int64_t num_values) {
  if (block >= table.info().num_blocks) {
    return Reject("bad_block",
                  absl::InvalidArgumentError(absl::StrCat("table '", table.name(), "' block ",
                                                          block, ": out of range (the table has ",
                                                          table.info().num_blocks, " blocks)")));
  }
  if (!table.Owns(block)) {
    return Reject("wrong_server",
                  absl::FailedPreconditionError(absl::StrCat(
                      "table '", table.name(), "' block ", block, " belongs to server ",
                      partitioner_.ServerForBlock(table.info(), block), ", not server ",
                      options_.server_index)));
  }
  if (num_values >= 0 && static_cast<size_t>(num_values) != table.BlockSize(block)) {
    return Reject("bad_size", absl::InvalidArgumentError(absl::StrCat(
                                  "table '", table.name(), "' block ", block, ": expected ",
                                  table.BlockSize(block), " values, got ", num_values)));
  }
  return absl::OkStatus();
}

absl::Status Shard::CheckKeys(const SparseTablePart& table, absl::Span<const uint64_t> keys,
                              int64_t num_values) {
  // The size first: it does not depend on which server the request reached, so a store that
  // could not split the rows by server (their count is wrong) gets the same answer.
  if (num_values >= 0 && static_cast<uint64_t>(num_values) != keys.size() * table.info().dim) {
    return Reject("bad_size", absl::InvalidArgumentError(absl::StrCat(
                                  "table '", table.name(), "': ", keys.size(), " keys of dim ",
                                  table.info().dim, " need ", keys.size() * table.info().dim,
                                  " values, got ", num_values)));
  }
  for (uint64_t key : keys) {
    const uint32_t owner = partitioner_.ServerForKey(key);
    if (owner != options_.server_index) {
      return Reject("wrong_server",
                    absl::FailedPreconditionError(
                        absl::StrCat("table '", table.name(), "' key ", key, " belongs to server ",
                                     owner, ", not server ", options_.server_index)));
    }
  }
  return absl::OkStatus();
}

// ---- Pulls and pushes -------------------------------------------------------------------

absl::Status Shard::CheckWorkerAndClock(const RequestInfo& info) {
  // A clock counts completed steps. The consistency bound subtracts clocks (clock -
  // staleness, clock - slowest clock), which a negative clock from a peer would overflow.
  const uint32_t num_workers = config_.cluster().num_workers();
  if (info.worker_id >= 0 && static_cast<uint32_t>(info.worker_id) >= num_workers) {
    // Each worker id holds exactly-once state: ids beyond the job would let a peer grow it.
    return Reject("bad_worker",
                  absl::InvalidArgumentError(absl::StrCat(
                      "worker ", info.worker_id, " is not in this job (cluster.num_workers is ",
                      num_workers, ")")));
  }
  const auto in_range = [](int64_t clock) { return clock >= 0 && clock <= common::kMaxClock; };
  if (info.worker_id < 0 || (in_range(info.clock) && in_range(info.done_clock))) {
    return absl::OkStatus();
  }
  const bool clock_bad = !in_range(info.clock);
  return Reject(
      "bad_clock",
      absl::InvalidArgumentError(absl::StrCat(
          "worker ", info.worker_id, ": ", clock_bad ? "clock " : "done_clock ",
          clock_bad ? info.clock : info.done_clock, " is not in [0, ", common::kMaxClock, "]")));
}

absl::Status Shard::CheckPusher(const RequestInfo& info) {
  if (info.worker_id >= 0) return absl::OkStatus();
  // Pushes without a worker slot would skip exactly-once bookkeeping: the same bytes sent
  // twice would change the parameters twice.
  return Reject("bad_worker", absl::InvalidArgumentError(absl::StrCat(
                                  "push from worker ", info.worker_id, ": pushes need a worker "
                                  "id in [0, cluster.num_workers); negative ids may only read")));
}

absl::Status Shard::CheckPullClocks(const RequestInfo& info) {
  if (info.worker_id < 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckWorkerAndClock(info));
  if (absl::Status s = workers_.CheckPullClock(info.worker_id, info.clock, info.done_clock);
      !s.ok()) {
    return Reject("clock_ahead", std::move(s));
  }
  return absl::OkStatus();
}

absl::Status Shard::CheckPullStart(const RequestInfo& info) {
  RETURN_IF_ERROR(CheckPullClocks(info));
  if (absl::Status s = workers_.Touch(info.worker_id, info.worker_incarnation, info.done_clock);
      !s.ok()) {
    const char* reason = HeaderRejection(s);  // before s is moved (argument order)
    return Reject(reason, std::move(s));
  }
  return absl::OkStatus();
}

absl::Status Shard::BeginPull(const RequestInfo& info, absl::Time deadline) {
  if (info.worker_id < 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPullStart(info));
  return WithRejectionReason(workers_.WaitForBound(info.worker_id, info.clock, deadline),
                             "bound_timeout");
}

absl::StatusOr<WorkerTracker::WaiterId> Shard::ParkPull(const RequestInfo& info,
                                                        absl::Time deadline,
                                                        const WorkerTracker::ParkLimits& limits,
                                                        WorkerTracker::BoundCallback done,
                                                        uint64_t held_bytes) {
  if (info.worker_id < 0) return WorkerTracker::WaiterId{0};
  RETURN_IF_ERROR(CheckPullStart(info));
  absl::StatusOr<WorkerTracker::WaiterId> parked = workers_.WhenBound(
      info.worker_id, info.worker_incarnation, info.clock, deadline, limits,
      [this, done = std::move(done)](absl::Status s) {
        if (absl::IsDeadlineExceeded(s)) {
          s = WithRejectionReason(std::move(s), "bound_timeout");
        } else if (absl::IsFailedPrecondition(s)) {
          // A newer incarnation of the worker was heard from meanwhile.
          s = Reject("stale_incarnation", std::move(s));
        }
        done(std::move(s));
      },
      held_bytes);
  if (absl::IsFailedPrecondition(parked.status())) {
    return Reject("stale_incarnation", parked.status());
  }
  if (absl::IsResourceExhausted(parked.status())) {
    // Full for all workers together: not this worker's doing, and sent again it may park
    // once others' pulls are answered (server_busy: retried); its own limit is final.
    const bool all_full = parked.status().GetPayload(WorkerTracker::kAllWorkersFull).has_value();
    return Reject(all_full ? "server_busy" : "too_many_waiting", parked.status());
  }
  if (absl::IsDeadlineExceeded(parked.status())) {
    return WithRejectionReason(parked.status(), "bound_timeout");
  }
  return parked;
}

absl::StatusOr<uint64_t> Shard::CheckPull(const RequestInfo& info,
                                           absl::Span<const PullTable> tables) {
  RETURN_IF_ERROR(CheckLayout(info));
  uint64_t payload_bytes = 0;
  for (const PullTable& t : tables) {
    RETURN_IF_ERROR(CheckEncoding(t.encoding));
    const uint64_t bpv = common::BytesPerValue(t.encoding);
    ASSIGN_OR_RETURN(TablePart * part, FindTable(t.table));
    if (part->info().kind == TABLE_KIND_DENSE) {
      if (!t.keys.empty()) {
        return Reject("wrong_kind", absl::InvalidArgumentError(absl::StrCat(
                                        "table '", t.table, "' is dense: pull it by blocks, not keys")));
      }
      auto* dense = static_cast<DenseTablePart*>(part);
      for (uint32_t b : t.blocks) {
        RETURN_IF_ERROR(CheckBlock(*dense, b, -1));
        payload_bytes += dense->BlockSize(b) * bpv;
      }
    } else {
      if (!t.blocks.empty()) {
        return Reject("wrong_kind", absl::InvalidArgumentError(absl::StrCat(
                                        "table '", t.table, "' is sparse: pull it by keys, not blocks")));
      }
      RETURN_IF_ERROR(CheckKeys(*static_cast<SparseTablePart*>(part), t.keys, -1));
      payload_bytes += static_cast<uint64_t>(t.keys.size()) * part->info().dim * bpv;
    }
  }
  return payload_bytes;
}

absl::StatusOr<SparseTableStats> Shard::SparseStats(absl::string_view table) const {
  auto it = by_name_.find(table);
  if (it == by_name_.end() || it->second->info().kind != TABLE_KIND_SPARSE) {
    return absl::NotFoundError(absl::StrCat("no sparse table '", table, "'"));
  }
  const auto* sparse = static_cast<const SparseTablePart*>(it->second);
  SparseTableStats stats;
  stats.rows = sparse->NumRows();
  stats.spills = sparse->spills();
  stats.budget_rows = sparse->budget_rows();
  stats.spill = sparse->spill_stats();
  return stats;
}

absl::StatusOr<PushResult> Shard::Push(const PushView& push) {
  ASSIGN_OR_RETURN(CheckedPush checked, CheckPush(push));
  return ApplyPush(std::move(checked));
}

absl::StatusOr<PushResult> Shard::ApplyPush(CheckedPush push) {
  const RequestInfo& info = push.info_;
  if (config_.training().deterministic()) {
    // Deterministic BSP: this clock's pushes go in worker order, once all have arrived.
    if (absl::Status s = workers_.WaitForTurn(info.worker_id, info.worker_incarnation,
                                              info.sequence, info.clock, info.deadline);
        !s.ok()) {
      if (absl::IsResourceExhausted(s)) return Reject("too_many_waiting", std::move(s));
      if (absl::IsDeadlineExceeded(s)) return WithRejectionReason(std::move(s), "turn_timeout");
      if (absl::IsAborted(s)) return Reject("turn_superseded", std::move(s));  // a retry waits
      if (absl::IsUnavailable(s)) return s;     // the server stops: the worker sends it again
      const char* reason = HeaderRejection(s);  // before s is moved (argument order)
      return Reject(reason, std::move(s));
    }
  }
  // A new incarnation's answers to its predecessor's parked pulls (which finish calls and may
  // free a segment) run when this goes, after the shard's locks below are released.
  WorkerTracker::Released replaced;
  Timed timed(&push_apply_ns_);
  if (push.one_pass_) return ApplyOnePass(push, &replaced);
  // PrepareRows makes the new rows of tables that spill (evicting others to the spill store)
  // and checks room for the others': what Admit would refuse is refused first, so that a
  // refused push makes no row. Admit still decides; only another push of the same worker in
  // between can make it refuse a push that passed here (whose new rows then stay, at their
  // initial values).
  auto is_sparse = [](const PendingUpdate& u) { return u.table->info().kind == TABLE_KIND_SPARSE; };
  if (std::any_of(push.updates_.begin(), push.updates_.end(), is_sparse)) {
    absl::Status s =
        workers_.CheckAdmission(info.worker_id, info.worker_incarnation, info.sequence);
    if (!s.ok()) return Reject(HeaderRejection(s), s);
  }
  // Shared: pushes run in parallel (each block/row has its own lock); a snapshot waits for
  // the pushes in flight and cuts between pushes, so admission (exactly-once state) and
  // parameters always agree in a checkpoint.
  absl::ReaderMutexLock lock(&apply_mu_);
  // Rows of tables over their memory budget come into memory (and stay pinned there) before
  // the push is admitted: if the spill store fails, nothing is applied nor recorded, and
  // applying cannot fail half-way.
  std::vector<const PendingUpdate*> pinned;
  auto unpin = absl::MakeCleanup([&pinned] {
    for (const PendingUpdate* u : pinned) static_cast<SparseTablePart*>(u->table)->Unpin(u->keys);
  });
  RETURN_IF_ERROR(PrepareRows(push.updates_, &pinned));
  absl::StatusOr<WorkerTracker::Admission> admission = workers_.Admit(
      info.worker_id, info.worker_incarnation, info.sequence, /*applied=*/false, &replaced);
  if (std::optional<absl::StatusOr<PushResult>> not_admitted = NotAdmitted(admission, info)) {
    return *std::move(not_admitted);
  }
  ApplyUpdates(push.updates_, push.options_);
  return Applied(push);
}

std::optional<absl::StatusOr<PushResult>> Shard::NotAdmitted(
    const absl::StatusOr<WorkerTracker::Admission>& admission, const RequestInfo& info) {
  if (!admission.ok()) return Reject(HeaderRejection(admission.status()), admission.status());
  if (*admission == WorkerTracker::Admission::kApply) return std::nullopt;
  // A duplicate is answered once the attempt it repeats has been applied: its answer lets the
  // worker read (its call's pull, or its next), rewrite (lent memory) what that push held and
  // count the push in its done_clock. Not applied by the deadline: DEADLINE_EXCEEDED, never an
  // OK for an update still under way (the worker sends it again). A stopping server (its
  // waiters closed) answers at once: its final checkpoint waits for the attempt anyway.
  if (absl::Status s = workers_.WaitUntilApplied(info.worker_id, info.worker_incarnation,
                                                 info.sequence, info.deadline);
      !s.ok()) {
    return Reject("duplicate_pending", std::move(s));
  }
  absl::MutexLock stats(&stats_mu_);
  ++duplicates_;
  return PushResult{true, updates_applied_};
}

PushResult Shard::Applied(const CheckedPush& push) {
  const RequestInfo& info = push.info_;
  workers_.AdvanceClock(info.worker_id, info.worker_incarnation, info.clock, info.sequence);
  absl::MutexLock stats(&stats_mu_);
  ++pushes_;
  ++updates_applied_;
  bytes_in_ += push.bytes_in_;
  return PushResult{false, updates_applied_};
}

absl::StatusOr<PushResult> Shard::ApplyOnePass(const CheckedPush& push,
                                               WorkerTracker::Released* replaced) {
  const RequestInfo& info = push.info_;
  const std::vector<PendingUpdate>& updates = push.updates_;
  {
    absl::MutexLock stats(&stats_mu_);
    ++one_pass_pushes_;
  }
  absl::ReaderMutexLock lock(&apply_mu_);  // as in ApplyPush
  const std::vector<std::pair<DenseTablePart*, uint32_t>> blocks = LockOrder(updates);
  for (const auto& [table, block] : blocks) table->LockBlock(block);
  auto unlock = absl::MakeCleanup([&blocks] {
    for (const auto& [table, block] : blocks) table->UnlockBlock(block);
  });
  // The old parameters, for an undo: one buffer per thread, kept (kOnePassMaxValues at most).
  thread_local std::vector<float> undo;
  size_t values = 0;
  for (const PendingUpdate& u : updates) values += u.num_values();
  if (undo.size() < values) {
    undo.resize(values);
    absl::MutexLock stats(&stats_mu_);
    ++one_pass_buffers_allocated_;
  }
  std::vector<int64_t> old_steps(updates.size());
  size_t applied = 0, at = 0, nonfinite = 0;
  while (applied < updates.size() && nonfinite == 0) {
    const PendingUpdate& u = updates[applied];
    BlockPiece whole;
    absl::Span<const BlockPiece> pieces = u.pieces;
    if (pieces.empty()) {
      whole.values = kernels::FloatBytes{u.values.data(), static_cast<int64_t>(u.values.size()),
                                         /*zero_nonfinite=*/true};
      pieces = absl::MakeConstSpan(&whole, 1);
    }
    nonfinite = static_cast<DenseTablePart*>(u.table)->ApplyCountingNonFinite(
        u.block, pieces, undo.data() + at, &old_steps[applied]);
    at += u.num_values();
    ++applied;
  }
  auto undo_all = [&] {  // the latest first: a block named twice goes back to its first state
    for (size_t i = applied; i-- > 0;) {
      at -= updates[i].num_values();
      static_cast<DenseTablePart*>(updates[i].table)
          ->UndoUpdate(updates[i].block, undo.data() + at, old_steps[i]);
    }
  };
  if (nonfinite > 0) {
    undo_all();
    std::move(unlock).Invoke();
    // Counted and worded as the two-pass check counts and words it. A value can only have
    // turned finite again since if the worker rewrote its shared payload meanwhile.
    RETURN_IF_ERROR(CheckFinite(updates));
    return Reject("nonfinite", absl::InvalidArgumentError(absl::StrCat(
                                   "a push held ", nonfinite,
                                   " non-finite values when applied (its payload changed since)")));
  }
  absl::StatusOr<WorkerTracker::Admission> admission = workers_.Admit(
      info.worker_id, info.worker_incarnation, info.sequence, /*applied=*/true, replaced);
  if (!admission.ok() || *admission == WorkerTracker::Admission::kDuplicate) undo_all();
  std::move(unlock).Invoke();  // (before a duplicate waits: the attempt it repeats may need them)
  if (std::optional<absl::StatusOr<PushResult>> not_admitted = NotAdmitted(admission, info)) {
    return *std::move(not_admitted);
  }
  for (const PendingUpdate& u : updates) static_cast<DenseTablePart*>(u.table)->CountUpdate();
  return Applied(push);
}

void Shard::ApplyUpdates(absl::Span<const PendingUpdate> updates, const UpdateOptions& options) {
  size_t dense_values = 0;
  for (const PendingUpdate& u : updates) {
    if (u.table->info().kind == TABLE_KIND_DENSE) {
      dense_values += u.num_values();
    } else {
      static_cast<SparseTablePart*>(u.table)->Apply(u.keys, u.values, options);
    }
  }
  auto apply = [&](size_t i) {
    const PendingUpdate& u = updates[i];
    auto* table = static_cast<DenseTablePart*>(u.table);
    if (u.pieces.empty()) {
      table->Apply(u.block, u.values, options);
    } else {
      table->Apply(u.block, u.pieces, options);
    }
  };
  if (apply_pool_ == nullptr || dense_values < options_.parallel_apply_values) {
    for (size_t i = 0; i < updates.size(); ++i) {
      if (updates[i].table->info().kind == TABLE_KIND_DENSE) apply(i);
    }
    return;
  }
  // A unit is one block: the updates of a block named more than once run in push order on
  // one thread. Blocks are independent (each has its lock and its own step), so the result is
  // the serial one bit for bit, whichever thread applies which block.
  std::vector<size_t> heads;                        // first update of each block
  std::vector<size_t> next(updates.size(), SIZE_MAX);  // next update of the same block
  absl::flat_hash_map<std::pair<const TablePart*, uint32_t>, size_t> last;
  for (size_t i = 0; i < updates.size(); ++i) {
    if (updates[i].table->info().kind != TABLE_KIND_DENSE) continue;
    auto [it, added] = last.try_emplace(std::make_pair(updates[i].table, updates[i].block), i);
    if (added) {
      heads.push_back(i);
    } else {
      next[it->second] = i;
      it->second = i;
    }
  }
  // A block larger than the push's share per thread may be split (ApplyInRanges).
  const bool ranged = ApplyInRanges(updates, options, heads, next, RangeValues(dense_values));
  if (!ranged) {
    apply_pool_->ParallelFor(heads.size(), apply_pool_->num_threads(), [&](size_t unit) {
      for (size_t i = heads[unit]; i != SIZE_MAX; i = next[i]) apply(i);
    });
  }
  absl::MutexLock lock(&stats_mu_);
  ++parallel_pushes_;
  if (ranged) ++ranged_pushes_;
}

size_t Shard::RangeValues(size_t values) const {
  const size_t threads = static_cast<size_t>(apply_pool_->num_threads()) + 1;
  const size_t share = (values + threads - 1) / threads;
  return std::max(options_.parallel_apply_range_values, (share + 1023) / 1024 * 1024);
}

bool Shard::ApplyInRanges(absl::Span<const PendingUpdate> updates, const UpdateOptions& options,
                          absl::Span<const size_t> heads, absl::Span<const size_t> next,
                          size_t range) {
  // A unit: a range [begin, end) of a block updated once, or (end 0) a block's updates.
  struct Unit {
    size_t head;
    size_t begin = 0, end = 0;
  };
  auto splits = [&](size_t head) {
    return next[head] == SIZE_MAX && updates[head].num_values() > range;
  };
  bool split = false;
  for (size_t head : heads) {
    if (!static_cast<DenseTablePart*>(updates[head].table)->AppliesInRanges(options)) return false;
    split = split || splits(head);
  }
  if (!split) return false;
  std::vector<Unit> units;
  for (size_t head : heads) {
    if (!splits(head)) {
      units.push_back(Unit{head});
      continue;
    }
    const size_t n = updates[head].num_values();
    for (size_t begin = 0; begin < n; begin += range) {
      units.push_back(Unit{head, begin, std::min(n, begin + range)});
    }
  }
  // The blocks stay locked, by this thread, until every unit is done: the helpers write them
  // without their locks. Each update's step is taken here, in push order.
  const std::vector<std::pair<DenseTablePart*, uint32_t>> blocks = LockOrder(updates);
  for (const auto& [table, block] : blocks) table->LockBlock(block);
  std::vector<int64_t> steps(updates.size(), 0);
  for (size_t i = 0; i < updates.size(); ++i) {
    if (updates[i].table->info().kind != TABLE_KIND_DENSE) continue;
    steps[i] = static_cast<DenseTablePart*>(updates[i].table)
                   ->BeginLockedUpdate(updates[i].block, options);
  }
  apply_pool_->ParallelFor(units.size(), apply_pool_->num_threads(), [&](size_t k) {
    const Unit& unit = units[k];
    for (size_t i = unit.head; i != SIZE_MAX; i = next[i]) {
      const PendingUpdate& u = updates[i];
      const size_t end = unit.end == 0 ? u.num_values() : unit.end;
      static_cast<DenseTablePart*>(u.table)->ApplyPiecesLocked(u.block, steps[i],
                                                               u.Pieces(unit.begin, end), options);
      if (unit.end != 0) break;  // a split block is updated once
    }
  });
  for (const PendingUpdate& u : updates) {
    if (u.table->info().kind == TABLE_KIND_DENSE)
      static_cast<DenseTablePart*>(u.table)->CountUpdate();
  }
  for (const auto& [table, block] : blocks) table->UnlockBlock(block);
  return true;
}

float Shard::delta_scale() const {
  const uint32_t workers = std::max<uint32_t>(1, config_.cluster().num_workers());
  return config_.training().local_sgd().merge() == LocalSgdConfig::AVERAGE ? 1.0f / workers
                                                                            : 1.0f;
}

uint64_t Shard::parallel_pushes() const {
  absl::MutexLock lock(&stats_mu_);
  return parallel_pushes_;
}

uint64_t Shard::ranged_pushes() const {
  absl::MutexLock lock(&stats_mu_);
  return ranged_pushes_;
}

uint64_t Shard::parallel_pulls() const {
  absl::MutexLock lock(&stats_mu_);
  return parallel_pulls_;
}

uint64_t Shard::one_pass_pushes() const {
  absl::MutexLock lock(&stats_mu_);
  return one_pass_pushes_;
}

uint64_t Shard::one_pass_buffers_allocated() const {
  absl::MutexLock lock(&stats_mu_);
  return one_pass_buffers_allocated_;
}

uint64_t Shard::updates_applied() const {
  absl::MutexLock lock(&stats_mu_);
  return updates_applied_;
}

// ---- Stats ------------------------------------------------------------------------------

void Shard::FillStats(StatsResponse* out) {
  out->set_server_index(options_.server_index);
  out->set_server_incarnation(options_.incarnation);
  for (const auto& t : tables_) {
    TableStats* ts = out->add_tables();
    ts->set_name(t->name());
    ts->set_kind(t->info().kind);
    if (t->info().kind == TABLE_KIND_SPARSE) {
      const SpillStats spill = static_cast<const SparseTablePart*>(t.get())->spill_stats();
      ts->set_rows(spill.resident_rows + spill.spilled_rows);
      ts->set_rows_in_memory(spill.resident_rows);
      ts->set_rows_faulted_in(spill.faults);
      ts->set_rows_evicted(spill.evictions);
    } else {
      ts->set_rows(t->NumRows());
      ts->set_rows_in_memory(ts->rows());
    }
    ts->set_bytes(t->NumBytes());
    ts->set_updates_applied(t->updates_applied());
  }
  std::vector<WorkerClock> clocks;
  workers_.FillStats(&clocks);
  for (auto& c : clocks) *out->add_worker_clocks() = std::move(c);
  out->set_max_staleness_seen(workers_.max_staleness_seen());
  out->set_uptime_s(absl::ToDoubleSeconds(absl::Now() - start_time_));
  out->set_push_check_s(1e-9 * static_cast<double>(push_check_ns_.load(std::memory_order_relaxed)));
  out->set_push_apply_s(1e-9 * static_cast<double>(push_apply_ns_.load(std::memory_order_relaxed)));
  out->set_pull_read_s(1e-9 * static_cast<double>(pull_read_ns_.load(std::memory_order_relaxed)));
  absl::MutexLock lock(&stats_mu_);
  out->set_pulls(pulls_);
  out->set_pushes(pushes_);
  out->set_updates_applied(updates_applied_);
  out->set_duplicate_pushes(duplicates_);
  out->set_bytes_in(bytes_in_);
  out->set_bytes_out(bytes_out_);
  for (const auto& [reason, n] : rejected_) (*out->mutable_rejected())[reason] = n;
  if (nonfinite_values_ > 0) (*out->mutable_rejected())["nonfinite_values"] = nonfinite_values_;
}

void Shard::FillServerInfo(ServerInfoResponse* out) const {
  out->set_server_index(options_.server_index);
  out->set_num_servers(partitioner_.num_servers());
  out->set_layout_fingerprint(partitioner_.layout_fingerprint());
  out->set_server_incarnation(options_.incarnation);
  out->set_version(kVersion);
  for (const auto& t : config_.tables()) *out->add_tables() = t;
  out->set_asynchronous(!config_.training().has_staleness());
  out->set_staleness(config_.training().staleness());
}

}  // namespace ps::server
