#include "server/worker_tracker.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace ps::server {

namespace {

// A parked-pull limit refusal; those of all workers together (`own` false) carry
// kAllWorkersFull.
absl::Status Full(bool own, absl::Status status) {
  if (!own) status.SetPayload(WorkerTracker::kAllWorkersFull, absl::Cord("1"));
  return status;
}

}  // namespace

WorkerTracker::WorkerTracker(const WorkerTrackerOptions& options, std::function<absl::Time()> now)
    : options_(options), now_(now ? std::move(now) : [] { return absl::Now(); }) {}

WorkerTracker::~WorkerTracker() {
  CloseWaiters(absl::UnavailableError("the server is stopping"));
  {
    absl::MutexLock lock(&mu_);
    stop_timer_ = true;
    timer_cv_.Signal();
  }
  if (timer_.joinable()) timer_.join();
}

uint64_t WorkerTracker::LeadLimit(absl::Time now) const {
  const absl::Time limit = now + options_.max_incarnation_lead;
  if (limit <= absl::UnixEpoch()) return 0;
  if (limit >= absl::FromUnixNanos(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return static_cast<uint64_t>(absl::ToUnixNanos(limit));
}

uint64_t WorkerTracker::MaxIncarnation() const {
  return std::max(LeadLimit(now_()), restored_incarnation_.load(std::memory_order_relaxed));
}

absl::Status WorkerTracker::CheckIncarnation(int32_t worker, uint64_t incarnation) const {
  if (incarnation <= MaxIncarnation()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "worker ", worker, " incarnation ", incarnation,
      " is further ahead of this server's clock than ",
      absl::FormatDuration(options_.max_incarnation_lead),
      ": an incarnation is the worker's start time in ns since the Unix epoch"));
}

absl::Status WorkerTracker::CheckWorkerIncarnation(int32_t worker, uint64_t incarnation) const {
  if (worker < 0 || static_cast<uint32_t>(worker) >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", worker, " is not in this job (",
                                                   options_.num_workers, " workers)"));
  }
  RETURN_IF_ERROR(CheckIncarnation(worker, incarnation));
  auto it = workers_.find(worker);
  if (it != workers_.end() && it->second.seen && incarnation < it->second.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker, " incarnation ", incarnation, " is older than its current incarnation ",
        it->second.incarnation, ": that process was replaced"));
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerTracker::Worker*> WorkerTracker::Lookup(int32_t worker, uint64_t incarnation,
                                                             Released* released) {
  RETURN_IF_ERROR(CheckWorkerIncarnation(worker, incarnation));
  Worker& w = workers_[worker];
  if (!w.seen || incarnation > w.incarnation) {
    // A new process for this worker id: its pushes start again at sequence 1. Its clock and
    // data position carry over (it resumes where the previous incarnation stopped).
    w.incarnation = incarnation;
    w.floor = 0;
    w.above.clear();
    w.given_up.clear();
    w.unknown_through = 0;
    w.applying.clear();  // the old process's: their attempts no longer end it
    w.turn_attempts.clear();  // its pushes waiting for their turn end (FAILED_PRECONDITION)
    w.seen = true;
    w.window_open = true;
    w.finished = false;
    ReleaseReplaced(worker, released);
  }
  // A finished incarnation stays finished: a call it gave up on that is served late (a retried
  // push queued on the pool, a last heartbeat) would otherwise put it back in the bound, and
  // nothing it sends later would take it out again.
  w.last_seen = now_();
  return &w;
}

absl::Status WorkerTracker::GivenUpError(int32_t worker, const Worker& w, uint64_t sequence) {
  if (sequence <= w.unknown_through) {
    return absl::OutOfRangeError(absl::StrCat(
        "worker ", worker, ": push sequence ", sequence,
        " is older than the given-up sequences this server remembers: whether it was applied "
        "is unknown, and it will not be applied now"));
  }
  return absl::OutOfRangeError(absl::StrCat(
      "worker ", worker, ": push sequence ", sequence, " was given up (", kMaxAbove,
      " later ones were applied while it was missing): it was never applied and will not be; "
      "keep fewer pushes in flight"));
}

bool WorkerTracker::GivenUp(const Worker& w, uint64_t sequence) {
  if (sequence <= w.unknown_through) return true;
  auto it = w.given_up.upper_bound(sequence);
  if (it == w.given_up.begin()) return false;
  --it;
  return sequence <= it->second;
}

void WorkerTracker::GiveUp(Worker* w, uint64_t first, uint64_t last) {
  if (first > last) return;
  w->given_up.emplace(first, last);
  while (w->given_up.size() > kMaxGivenUpRanges) {
    w->unknown_through = std::max(w->unknown_through, w->given_up.begin()->second);
    w->given_up.erase(w->given_up.begin());
  }
}

absl::Status WorkerTracker::CheckSequence(int32_t worker, uint64_t incarnation,
                                          uint64_t sequence) const {
  if (sequence == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker, ": push sequence numbers start at 1"));
  }
  auto it = workers_.find(worker);
  // Until a push of this incarnation is applied here (no record yet, Lookup (re)starts it;
  // or one made by its pulls, heartbeats or a push waiting for its turn; or one restored
  // from a checkpoint), a push may come with any sequence up to kMaxSequence: a server
  // restarted without its state, or restored from an older checkpoint, meets a worker that
  // may have pushed more than the window since (before 2026-12-05 it was refused for good).
  if (it != workers_.end() && it->second.seen && incarnation == it->second.incarnation) {
    const Worker& w = it->second;
    if (sequence <= w.floor && GivenUp(w, sequence)) return GivenUpError(worker, w, sequence);
    if (sequence <= w.floor || w.above.contains(sequence)) return absl::OkStatus();  // duplicate
    const uint64_t highest = w.above.empty() ? w.floor : *w.above.rbegin();
    if (!w.window_open && sequence > highest && sequence - highest > kSequenceWindow) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", worker, ": push sequence ", sequence, " is more than ", kSequenceWindow,
          " ahead of the highest applied (", highest, "): sequences count pushes one by one"));
    }
  }
  if (sequence > kMaxSequence) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker, ": push sequence ", sequence, " is past 2^62"));
  }
  return absl::OkStatus();
}

absl::Status WorkerTracker::CheckAdmission(int32_t worker, uint64_t incarnation,
                                           uint64_t sequence) const {
  absl::MutexLock lock(&mu_);
  // In Admit's order: the sequence, then what Lookup refuses.
  RETURN_IF_ERROR(CheckSequence(worker, incarnation, sequence));
  return CheckWorkerIncarnation(worker, incarnation);
}

absl::StatusOr<WorkerTracker::Admission> WorkerTracker::Admit(int32_t worker, uint64_t incarnation,
                                                              uint64_t sequence, bool applied,
                                                              Released* released) {
  Released own;
  if (released == nullptr) released = &own;
  absl::MutexLock lock(&mu_);
  // The sequence is checked before Lookup records the worker (a new incarnation, last seen), so
  // that a push refused for its sequence changes nothing.
  RETURN_IF_ERROR(CheckSequence(worker, incarnation, sequence));
  auto found = Lookup(worker, incarnation, released);
  if (!found.ok()) return found.status();
  Worker& w = **found;
  if (sequence <= w.floor || w.above.contains(sequence)) return Admission::kDuplicate;
  w.above.insert(sequence);
  w.window_open = false;
  // Sequences that never arrive (pushes lost with a server restored from an older
  // checkpoint) would keep the floor down and the set growing: past kMaxAbove entries the
  // oldest gap is given up on, and remembered as never applied (a worker does not retry a
  // push that far back; one that does is refused, not told it was a duplicate).
  while (w.above.size() > kMaxAbove) {
    const uint64_t next = *w.above.begin();
    GiveUp(&w, w.floor + 1, next - 1);
    w.floor = next;
    w.above.erase(w.above.begin());
  }
  while (!w.above.empty() && *w.above.begin() == w.floor + 1) {
    w.above.erase(w.above.begin());
    ++w.floor;
  }
  if (!applied) w.applying.insert(sequence);
  return Admission::kApply;
}

void WorkerTracker::AdvanceClock(int32_t worker, uint64_t incarnation, int64_t clock,
                                 uint64_t sequence) {
  Released released;
  absl::MutexLock lock(&mu_);
  Worker& w = workers_[worker];
  if (w.incarnation != incarnation) return;  // replaced meanwhile
  if (sequence != 0) w.applying.erase(sequence);
  w.clock = std::max(w.clock, clock);
  w.last_seen = now_();
  ReleaseReady(&released);
}

absl::Status WorkerTracker::WaitUntilApplied(int32_t worker, uint64_t incarnation,
                                             uint64_t sequence, absl::Time deadline) {
  struct Wait {
    WorkerTracker* tracker;
    int32_t worker;
    uint64_t incarnation, sequence;
  } wait{this, worker, incarnation, sequence};
  absl::MutexLock lock(&mu_);
  const bool done = mu_.AwaitWithDeadline(absl::Condition(
                                              +[](Wait* x) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                                if (!x->tracker->closed_.ok()) return true;
                                                auto it = x->tracker->workers_.find(x->worker);
                                                return it == x->tracker->workers_.end() ||
                                                       it->second.incarnation != x->incarnation ||
                                                       !it->second.applying.contains(x->sequence);
                                              },
                                              &wait),
                                          deadline);
  if (done) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("worker ", worker, ": push ", sequence,
                                                  " is still being applied by an earlier attempt"));
}

absl::Status WorkerTracker::Touch(int32_t worker, uint64_t incarnation, int64_t done_clock) {
  Released released;
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Worker * w, Lookup(worker, incarnation, &released));
  if (done_clock > w->clock) {
    w->clock = done_clock;
    ReleaseReady(&released);
  }
  return absl::OkStatus();
}

absl::Status WorkerTracker::Finish(int32_t worker, uint64_t incarnation) {
  Released released;
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker);
  if (it != workers_.end() && it->second.seen && incarnation != it->second.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker, " incarnation ", incarnation, " cannot finish: the worker's current "
        "incarnation is ", it->second.incarnation));
  }
  // A worker this server has no record of (a server restarted without a checkpoint) may
  // finish with its first word: Lookup registers it with the usual checks.
  ASSIGN_OR_RETURN(Worker * w, Lookup(worker, incarnation, &released));
  w->finished = true;
  ReleaseReady(&released);
  return absl::OkStatus();
}

absl::Status WorkerTracker::CheckPullClock(int32_t worker, int64_t clock,
                                           int64_t done_clock) const {
  if (!options_.staleness.has_value()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  int64_t newest = std::max<int64_t>(0, done_clock);
  for (const auto& [id, w] : workers_) newest = std::max(newest, w.clock);
  // clock >= 0 (checked by the shard), staleness >= 0 and newest >= 0, while a pushed clock may
  // be near INT64_MAX: compare differences, which cannot overflow here.
  const int64_t waits_for = clock - *options_.staleness;
  if (waits_for <= newest || waits_for - newest <= kPullClockLead) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "worker ", worker, ": pull at clock ", clock, " with staleness ", *options_.staleness,
      " waits for clock ", waits_for, ", but the newest clock any worker has ",
      "pushed here is ", newest, ": no push can let it through"));
}

bool WorkerTracker::SetDataPosition(int32_t worker, uint64_t incarnation, uint64_t offset,
                                    uint32_t epoch) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end() || it->second.incarnation != incarnation) return false;
  it->second.data_offset = offset;
  it->second.epoch = epoch;
  return true;
}

bool WorkerTracker::Live(const Worker& w, absl::Time now) const {
  if (w.finished) return false;
  // Not heard from yet: counts (with clock 0) so that nobody runs ahead of a late starter.
  if (!w.seen) return true;
  return now - w.last_seen <= options_.lease;
}

std::pair<int64_t, int32_t> WorkerTracker::MinLive(absl::Time now) const {
  int64_t min_clock = std::numeric_limits<int64_t>::max();
  int32_t slowest = -1;
  for (uint32_t id = 0; id < options_.num_workers; ++id) {
    auto it = workers_.find(static_cast<int32_t>(id));
    Worker absent;
    const Worker& w = it == workers_.end() ? absent : it->second;
    if (!Live(w, now)) continue;
    if (w.clock < min_clock) {
      min_clock = w.clock;
      slowest = static_cast<int32_t>(id);
    }
  }
  return {min_clock, slowest};
}

bool WorkerTracker::BoundHolds(BoundArgs* args) {
  auto [min_clock, slowest] = args->tracker->MinLive(args->tracker->now_());
  return slowest < 0 || min_clock >= args->need;
}

absl::Status WorkerTracker::WaitForBound(int32_t worker, int64_t clock, absl::Time deadline) {
  if (!options_.staleness.has_value()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  BoundArgs args{this, clock - *options_.staleness};
  // absl::Mutex re-evaluates the condition whenever the lock is released: after every push,
  // touch, finish, and every Poke (leases run out with time, not with events).
  if (!mu_.AwaitWithDeadline(absl::Condition(&BoundHolds, &args), deadline)) {
    return BoundTimeout(worker, clock);
  }
  auto [min_clock, slowest] = MinLive(now_());
  if (slowest >= 0) max_staleness_seen_ = std::max(max_staleness_seen_, clock - min_clock);
  return absl::OkStatus();
}

absl::Status WorkerTracker::BoundTimeout(int32_t worker, int64_t clock) const {
  auto [min_clock, slowest] = MinLive(now_());
  return absl::DeadlineExceededError(absl::StrCat(
      "worker ", worker, " at clock ", clock, " waited too long for the consistency bound (",
      "staleness ", options_.staleness.value_or(0), "): slowest live worker is ", slowest,
      " at clock ", min_clock));
}

// ---- Parked pulls -------------------------------------------------------------------------

WorkerTracker::Released::~Released() {
  for (auto& [done, status] : items_) done(std::move(status));
}

void WorkerTracker::Released::Add(BoundCallback done, absl::Status status) {
  items_.emplace_back(std::move(done), std::move(status));
}

absl::StatusOr<WorkerTracker::WaiterId> WorkerTracker::WhenBound(
    int32_t worker, uint64_t incarnation, int64_t clock, absl::Time deadline,
    const ParkLimits& limits, BoundCallback done, uint64_t held_bytes) {
  if (!options_.staleness.has_value()) return WaiterId{0};
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(closed_);
  if (auto it = workers_.find(worker);
      it != workers_.end() && it->second.seen && incarnation < it->second.incarnation) {
    // Replaced since the caller's Touch: nothing would answer it early.
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker, " incarnation ", incarnation, " is older than its current incarnation ",
        it->second.incarnation, ": that process was replaced"));
  }
  const int64_t need = clock - *options_.staleness;
  auto [min_clock, slowest] = MinLive(now_());
  if (slowest < 0 || min_clock >= need) {
    if (slowest >= 0) max_staleness_seen_ = std::max(max_staleness_seen_, clock - min_clock);
    return WaiterId{0};
  }
  if (deadline <= absl::Now()) return BoundTimeout(worker, clock);
  Parked& mine = parked_per_worker_[worker];
  if (mine.pulls >= limits.per_worker || waiters_.size() >= limits.total) {
    const bool own = mine.pulls >= limits.per_worker;
    if (mine.pulls == 0) parked_per_worker_.erase(worker);
    return Full(own,
                absl::ResourceExhaustedError(absl::StrCat(
                    own ? absl::StrCat("worker ", worker, " has ") : std::string("workers have "),
                    own ? mine.pulls : waiters_.size(),
                    " pulls waiting for the consistency bound already (at most ",
                    own ? limits.per_worker : limits.total, own ? " per worker" : " in all",
                    "): wait for their answers before pulling again")));
  }
  // Their requests' bytes too: a few pulls of requests as large as a message may be (512 MiB)
  // held gigabytes for max_pull_wait_s (found in review, 2026-12-05).
  if (held_bytes > limits.bytes_per_worker - std::min(mine.bytes, limits.bytes_per_worker) ||
      held_bytes > limits.bytes_total - std::min(parked_bytes_, limits.bytes_total)) {
    const bool own =
        held_bytes > limits.bytes_per_worker - std::min(mine.bytes, limits.bytes_per_worker);
    const uint64_t held = own ? mine.bytes : parked_bytes_;
    if (mine.pulls == 0) parked_per_worker_.erase(worker);
    return Full(
        own,
        absl::ResourceExhaustedError(absl::StrCat(
            "a pull of ", held_bytes, " bytes would wait for the consistency bound beside ",
            own ? absl::StrCat("worker ", worker, "'s ") : std::string("the "), held,
            " bytes of pulls waiting already (at most ",
            own ? limits.bytes_per_worker : limits.bytes_total, own ? " per worker" : " in all",
            "): wait for their answers before pulling again")));
  }
  ++mine.pulls;
  mine.bytes += held_bytes;
  parked_bytes_ += held_bytes;
  const WaiterId id = next_waiter_++;
  waiters_.emplace(id, Waiter{worker, incarnation, clock, deadline, std::move(done), held_bytes});
  by_need_.emplace(need, id);
  by_deadline_.emplace(deadline, id);
  if (!timer_.joinable()) timer_ = std::thread([this] { TimerLoop(); });
  timer_cv_.Signal();
  return id;
}

WorkerTracker::BoundCallback WorkerTracker::TakeWaiter(WaiterId id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return nullptr;
  Waiter& w = it->second;
  by_need_.erase({w.clock - options_.staleness.value_or(0), id});
  by_deadline_.erase({w.deadline, id});
  parked_bytes_ -= w.bytes;
  auto count = parked_per_worker_.find(w.worker);
  if (count != parked_per_worker_.end()) {
    count->second.bytes -= w.bytes;
    if (--count->second.pulls == 0) parked_per_worker_.erase(count);
  }
  BoundCallback done = std::move(w.done);
  waiters_.erase(it);
  return done;
}

void WorkerTracker::ReleaseReady(Released* out) {
  if (waiters_.empty()) return;
  auto [min_clock, slowest] = MinLive(now_());
  while (!by_need_.empty() && (slowest < 0 || by_need_.begin()->first <= min_clock)) {
    const WaiterId id = by_need_.begin()->second;
    const int64_t clock = waiters_.at(id).clock;
    if (slowest >= 0) max_staleness_seen_ = std::max(max_staleness_seen_, clock - min_clock);
    out->Add(TakeWaiter(id), absl::OkStatus());
  }
}

void WorkerTracker::ReleaseExpired(absl::Time now, Released* out) {
  while (!by_deadline_.empty() && by_deadline_.begin()->first <= now) {
    const WaiterId id = by_deadline_.begin()->second;
    const Waiter& w = waiters_.at(id);
    absl::Status timeout = BoundTimeout(w.worker, w.clock);
    out->Add(TakeWaiter(id), std::move(timeout));
  }
}

void WorkerTracker::ReleaseReplaced(int32_t worker, Released* out) {
  if (!parked_per_worker_.contains(worker)) return;
  const uint64_t current = workers_.at(worker).incarnation;
  std::vector<WaiterId> replaced;
  for (const auto& [id, w] : waiters_) {
    if (w.worker == worker && w.incarnation < current) replaced.push_back(id);
  }
  for (WaiterId id : replaced) {
    out->Add(TakeWaiter(id), absl::FailedPreconditionError(absl::StrCat(
                                 "worker ", worker, ": a newer incarnation (", current,
                                 ") of this worker is running: this pull's process was replaced")));
  }
}

void WorkerTracker::CancelWaiter(WaiterId id, absl::Status status) {
  Released released;
  absl::MutexLock lock(&mu_);
  if (BoundCallback done = TakeWaiter(id)) released.Add(std::move(done), std::move(status));
}

void WorkerTracker::CloseWaiters(absl::Status status) {
  Released released;
  absl::MutexLock lock(&mu_);
  if (closed_.ok()) closed_ = status;
  while (!waiters_.empty()) {
    const WaiterId id = waiters_.begin()->first;
    released.Add(TakeWaiter(id), status);
  }
}

size_t WorkerTracker::parked() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

int WorkerTracker::pushes_waiting_for_turn() const {
  absl::MutexLock lock(&mu_);
  int waiting = 0;
  for (const auto& [id, w] : workers_) waiting += w.turn_waits;
  return waiting;
}

void WorkerTracker::TimerLoop() {
  mu_.Lock();
  while (!stop_timer_) {
    absl::Time wake = absl::InfiniteFuture();
    if (!by_deadline_.empty()) {
      wake = std::min(by_deadline_.begin()->first, absl::Now() + kLeaseRecheck);
    }
    timer_cv_.WaitWithDeadline(&mu_, wake);
    {
      Released released;
      ReleaseExpired(absl::Now(), &released);
      ReleaseReady(&released);
      // The callbacks run (in released's destructor) without the lock.
      mu_.Unlock();
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

bool WorkerTracker::IsTurn(TurnArgs* args) {
  const WorkerTracker& t = *args->tracker;
  if (!t.closed_.ok()) return true;  // the server stops: answered UNAVAILABLE
  if (auto me = t.workers_.find(args->worker); me != t.workers_.end()) {
    auto it = me->second.turn_attempts.find(args->sequence);
    if (it == me->second.turn_attempts.end() || it->second != args->attempt) {
      args->superseded = true;
      return true;
    }
  }
  const absl::Time now = t.now_();
  for (uint32_t id = 0; id < t.options_.num_workers; ++id) {
    const int32_t v = static_cast<int32_t>(id);
    if (v == args->worker) continue;
    auto it = t.workers_.find(v);
    Worker absent;
    const Worker& w = it == t.workers_.end() ? absent : it->second;
    if (!t.Live(w, now)) continue;
    // Lower ids apply first; higher ids must at least have arrived with this clock's push.
    const bool ready =
        v < args->worker ? w.clock >= args->clock : std::max(w.clock, w.arrived) >= args->clock;
    if (!ready) {
      args->blocker = v;
      return false;
    }
  }
  args->blocker = -1;
  return true;
}

absl::Status WorkerTracker::WaitForTurn(int32_t worker, uint64_t incarnation, uint64_t sequence,
                                        int64_t clock, absl::Time deadline) {
  uint64_t attempt = 0;
  {
    // A replaced incarnation's parked pulls are answered before this push waits.
    Released released;
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(closed_);
    // What Admit would refuse is refused before Lookup records anything.
    RETURN_IF_ERROR(CheckSequence(worker, incarnation, sequence));
    // Counted within the incarnation (a newer one's Lookup below ends the older one's waits),
    // a retry of a waiting push not again.
    if (auto it = workers_.find(worker);
        it != workers_.end() && incarnation <= it->second.incarnation &&
        it->second.turn_attempts.size() >= kMaxTurnWaitsPerWorker &&
        !it->second.turn_attempts.contains(sequence)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("worker ", worker, " has ", it->second.turn_attempts.size(),
                       " pushes waiting for their turn already (at most ", kMaxTurnWaitsPerWorker,
                       ", deterministic BSP): wait for their answers"));
    }
    ASSIGN_OR_RETURN(Worker * w, Lookup(worker, incarnation, &released));
    w->arrived = std::max(w->arrived, clock);
    w->last_seen = now_();
    ++w->turn_waits;
    attempt = ++next_turn_attempt_;
    w->turn_attempts[sequence] = attempt;
  }
  absl::MutexLock lock(&mu_);
  TurnArgs args{this, worker, clock, sequence, attempt, -1, false};
  const bool turn = mu_.AwaitWithDeadline(absl::Condition(&IsTurn, &args), deadline);
  // Found again: the map may have grown (and moved its entries) during the wait.
  Worker& me = workers_[worker];
  me.turn_waits = std::max(0, me.turn_waits - 1);
  if (auto it = me.turn_attempts.find(sequence);
      it != me.turn_attempts.end() && it->second == args.attempt) {
    me.turn_attempts.erase(it);
  }
  RETURN_IF_ERROR(closed_);
  if (args.superseded) {
    if (me.incarnation != incarnation) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", worker, " incarnation ", incarnation,
                       ": a newer incarnation took over while this push waited for its turn"));
    }
    return absl::AbortedError(absl::StrCat("worker ", worker, ": push ", sequence,
                                           " was sent again while this attempt waited for its "
                                           "turn (deterministic BSP): the newer attempt waits"));
  }
  if (!turn) {
    return absl::DeadlineExceededError(absl::StrCat("worker ", worker, ": push of clock ", clock,
                                                    " waited too long for its turn "
                                                    "(deterministic BSP): waiting for worker ",
                                                    args.blocker));
  }
  return absl::OkStatus();
}

std::vector<int32_t> WorkerTracker::Poke() {
  Released released;
  absl::MutexLock lock(&mu_);
  ++pokes_;
  std::vector<int32_t> expired;
  const absl::Time now = now_();
  for (auto& [id, w] : workers_) {
    if (!w.seen || w.finished) continue;
    if (Live(w, now)) {
      w.expiry_reported = false;
    } else if (!w.expiry_reported) {
      w.expiry_reported = true;
      expired.push_back(id);
    }
  }
  std::sort(expired.begin(), expired.end());
  ReleaseReady(&released);
  return expired;
}

bool WorkerTracker::AllFinished() const {
  absl::MutexLock lock(&mu_);
  for (uint32_t id = 0; id < options_.num_workers; ++id) {
    auto it = workers_.find(static_cast<int32_t>(id));
    if (it == workers_.end() || !it->second.seen || !it->second.finished) return false;
  }
  return true;
}

int64_t WorkerTracker::MinLiveClock() const {
  absl::MutexLock lock(&mu_);
  auto [min_clock, slowest] = MinLive(now_());
  return slowest < 0 ? 0 : min_clock;
}

int64_t WorkerTracker::max_staleness_seen() const {
  absl::MutexLock lock(&mu_);
  return max_staleness_seen_;
}

void WorkerTracker::FillStats(std::vector<WorkerClock>* out) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = now_();
  for (uint32_t id = 0; id < options_.num_workers; ++id) {
    auto it = workers_.find(static_cast<int32_t>(id));
    WorkerClock c;
    c.set_worker_id(static_cast<int32_t>(id));
    if (it != workers_.end()) {
      c.set_clock(it->second.clock);
      c.set_incarnation(it->second.incarnation);
      c.set_live(Live(it->second, now));
      if (it->second.seen) {
        c.set_seconds_since_seen(absl::ToDoubleSeconds(now - it->second.last_seen));
      }
    } else {
      c.set_live(true);
    }
    out->push_back(std::move(c));
  }
}

WorkerCheckpoint WorkerTracker::SaveWorker(int32_t id, const Worker& w) {
  WorkerCheckpoint c;
  c.set_worker_id(id);
  c.set_incarnation(w.incarnation);
  c.set_clock(w.clock);
  c.set_applied_floor(w.floor);
  for (uint64_t s : w.above) c.add_applied_above(s);
  for (const auto& [first, last] : w.given_up) {
    SequenceRange* r = c.add_given_up();
    r->set_first(first);
    r->set_last(last);
  }
  c.set_given_up_through(w.unknown_through);
  c.set_data_offset(w.data_offset);
  c.set_epoch(w.epoch);
  c.set_finished(w.finished);
  return c;
}

std::vector<WorkerCheckpoint> WorkerTracker::Save() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerCheckpoint> out;
  for (const auto& [id, w] : workers_) {
    if (w.seen) out.push_back(SaveWorker(id, w));
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.worker_id() < b.worker_id(); });
  return out;
}

void WorkerTracker::Restore(const std::vector<WorkerCheckpoint>& workers, absl::Time saved_at) {
  Released released;
  absl::MutexLock lock(&mu_);
  workers_.clear();
  const absl::Time now = now_();
  // Judged by the clock of the checkpoint's time too: the incarnations in it passed the
  // check against that clock (or were forged before there was one).
  const uint64_t max_incarnation = LeadLimit(std::max(now, saved_at));
  uint64_t restored = 0;
  for (const auto& c : workers) {
    Worker& w = workers_[c.worker_id()];
    // An incarnation too far ahead was forged into an older checkpoint: keep where the worker
    // is (clock, data position), not who it was, so that its next real incarnation takes over.
    const bool forged = c.incarnation() > max_incarnation;
    w.incarnation = forged ? 0 : c.incarnation();
    restored = std::max(restored, w.incarnation);
    w.clock = c.clock();
    if (!forged) {
      w.floor = c.applied_floor();
      // Only sequences above the floor (Save writes no other): one at or below it would be
      // taken for the next floor when the set is trimmed, moving the floor back, and a push
      // between the two would be applied again.
      for (uint64_t q : c.applied_above()) {
        if (q > w.floor) w.above.insert(q);
      }
      while (!w.above.empty() && *w.above.begin() == w.floor + 1) {
        w.above.erase(w.above.begin());
        ++w.floor;
      }
      // Ranges in order, each at or below the floor and above the one before (anything
      // else is not what Save writes: left out); past kMaxGivenUpRanges, forgotten.
      w.unknown_through = std::min(c.given_up_through(), w.floor);
      for (const SequenceRange& r : c.given_up()) {
        const uint64_t after = w.given_up.empty() ? w.unknown_through : w.given_up.rbegin()->second;
        if (r.first() <= after || r.first() > r.last() || r.last() > w.floor) continue;
        GiveUp(&w, r.first(), r.last());
      }
    }
    w.data_offset = c.data_offset();
    w.epoch = c.epoch();
    w.finished = c.finished();
    w.seen = true;
    // The checkpoint may be older than the worker's pushes by more than the window.
    w.window_open = true;
    w.last_seen = now;
  }
  restored_incarnation_.store(restored, std::memory_order_relaxed);
  ReleaseReady(&released);
}

std::optional<WorkerCheckpoint> WorkerTracker::Get(int32_t worker) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end() || !it->second.seen) return std::nullopt;
  return SaveWorker(worker, it->second);
}

std::optional<WorkerTracker::Position> WorkerTracker::PositionOf(int32_t worker) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end() || !it->second.seen) return std::nullopt;
  return Position{it->second.incarnation, it->second.data_offset, it->second.epoch,
                  it->second.clock};
}

}  // namespace ps::server
