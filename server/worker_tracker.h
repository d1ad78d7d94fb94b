// WorkerTracker: what a server knows about each worker: its incarnation, the pushes it has
// had applied (exactly-once), its clock (the SSP/BSP bound), when it was last heard from (its
// lease) and where it is in its data shard.
//
// Consistency bound. Workers 0..num_workers-1 take part. A worker that has not been heard
// from yet counts with clock 0, so a BSP job does not run ahead of a worker that is still
// starting. A worker that finished, or whose lease ran out, leaves the bound (and is
// reported); one whose lease ran out rejoins when it is heard from again, one that finished
// only with a new incarnation (a late call of the finished process changes nothing).
//
// Exactly-once. Pushes are identified by (worker, incarnation, sequence). Per worker the
// tracker keeps its newest incarnation, a floor F and the applied sequences above F (at most
// kMaxAbove); a push is applied at most once. A sequence <= F was applied, unless the floor
// was moved past it while it was missing (given up: kMaxAbove later ones were applied
// first); a push carrying a given-up sequence is refused (OUT_OF_RANGE), never taken for a
// duplicate, so a push is acknowledged only once applied. A push from an older incarnation
// than the newest seen is refused (FAILED_PRECONDITION): that process is gone.
//
// Validated, not trusted. A peer could claim any incarnation, sequence or clock; the tracker
// bounds each so that no single request can lock a worker out or make its honest pushes
// duplicates (a client that can act as the worker can still do it with many: only an
// authenticated identity, mTLS, stops that):
// - an incarnation is the worker's start time in ns since the Unix epoch, so a new one may
//   lead the server's clock by at most max_incarnation_lead (clock skew); one further ahead
//   is INVALID_ARGUMENT (2^64-1 would otherwise outrank every real restart for good), and a
//   checkpoint holding one is restored without it;
// - a sequence may lead the highest one applied for its incarnation by at most
//   kSequenceWindow (INVALID_ARGUMENT), so pushes with huge sequences cannot fill the
//   applied set and push the floor past the real worker's next sequence; the first push of
//   an incarnation this server applies (new here, or restored) may start anywhere up to
//   kMaxSequence (2^62);
// - a pull may ask for a clock at most staleness + kPullClockLead ahead of the newest clock
//   any worker has pushed here, or its own done_clock (INVALID_ARGUMENT at once, instead of a
//   wait no push can end).
//
// Parked pulls. A pull the bound does not let through yet can be parked (WhenBound) instead
// of blocking a thread: the tracker keeps its callback and calls it when clocks move
// (AdvanceClock, Finish, Restore, Poke, and its own timer for leases), at the pull's
// deadline (DEADLINE_EXCEEDED), when it is taken back (CancelWaiter), when a newer
// incarnation of its worker is heard from (FAILED_PRECONDITION: the process that sent it is
// gone, and what it holds, such as a shared-memory segment, goes with the answer) or when
// the server stops (CloseWaiters). One timer thread serves every waiter; it starts with the first
// parked pull and is joined by the destructor. Waiters are capped per worker and in all.
//
// Locking: callbacks are taken out of the waiter sets under mu_ and run after mu_ is
// released (on the thread that moved the clock, or the timer thread), so a callback may call
// back into the tracker.
#ifndef PS_SERVER_WORKER_TRACKER_H_
#define PS_SERVER_WORKER_TRACKER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/checkpoint.pb.h"
#include "proto/ps.pb.h"

namespace ps::server {

struct WorkerTrackerOptions {
  // Workers taking part in the consistency bound (ids 0..num_workers-1).
  uint32_t num_workers = 1;
  // 0 = BSP, k = SSP with bound k, nullopt = asynchronous (pulls never wait).
  std::optional<int32_t> staleness;
  // A worker not heard from for this long leaves the bound.
  absl::Duration lease = absl::Seconds(30);
  // How far a worker's incarnation (its start time, ns since the Unix epoch) may lead this
  // server's clock: the clock skew tolerated between machines.
  absl::Duration max_incarnation_lead = absl::Hours(1);
};

// Thread-safe.
class WorkerTracker {
 public:
  // Applied sequences kept above a worker's floor; older gaps are given up on.
  static constexpr size_t kMaxAbove = 1024;
  // Ranges of given-up sequences remembered per worker (the newest); the sequences of older
  // ranges, and every sequence below them, are of unknown fate and refused as given up.
  static constexpr size_t kMaxGivenUpRanges = 1024;
  // How far a push's sequence may lead the highest applied one of its incarnation. An honest
  // worker's pushes to one server skip the steps that had nothing for it, and a server
  // restored from an older checkpoint misses the pushes since: both stay far below this.
  // The first push this server applies of an incarnation (a new worker process, a server
  // restarted without its state, which a long-running worker may be tens of millions of
  // pushes into, or one restored from an older checkpoint) may carry any sequence up to
  // kMaxSequence, whatever the worker's pulls and heartbeats recorded before it.
  static constexpr uint64_t kSequenceWindow = uint64_t{1} << 24;
  static constexpr uint64_t kMaxSequence = uint64_t{1} << 62;
  // How far beyond (newest pushed clock + staleness) a pull's clock may be: a worker issues
  // the pull of its next step while the push of the current one is in flight.
  static constexpr int64_t kPullClockLead = 2;
  // Deterministic-BSP pushes of one worker that may wait for their turn at once (a worker
  // sends one push per clock; a retry may overlap the original). More: RESOURCE_EXHAUSTED, so
  // one worker cannot hold every serving thread with pushes of clocks nobody reaches.
  static constexpr int kMaxTurnWaitsPerWorker = 2;
  // How often the timer re-checks the bound of parked pulls while any are parked (leases run
  // out with time, not with events).
  static constexpr absl::Duration kLeaseRecheck = absl::Milliseconds(200);

  // `now` is the clock (injected for tests); defaults to absl::Now.
  explicit WorkerTracker(const WorkerTrackerOptions& options,
                         std::function<absl::Time()> now = nullptr);
  // Stops the timer thread; parked pulls left get UNAVAILABLE.
  ~WorkerTracker();
  WorkerTracker(const WorkerTracker&) = delete;
  WorkerTracker& operator=(const WorkerTracker&) = delete;

  class Released;  // below: answers to parked pulls, run when it goes

  // The outcome of Admit.
  enum class Admission { kApply, kDuplicate };

  // Admits push (worker, incarnation, sequence): kApply the first time, and records it as
  // applied at once, so that a concurrent retry of the same push gets kDuplicate; the
  // caller must apply it (callers hold the shard's apply lock across Admit and the apply,
  // so a snapshot never sees one without the other). FAILED_PRECONDITION for an incarnation
  // older than the newest seen; INVALID_ARGUMENT for sequence 0, for one beyond kMaxSequence,
  // for one beyond kSequenceWindow ahead of the highest applied once a push of the incarnation
  // was applied here (Worker::window_open), and for an
  // incarnation too far ahead of the clock; OUT_OF_RANGE for a sequence given up (never applied,
  // and now never will be). `applied`: the caller applied the push before admitting it (the one
  // pass); otherwise the push counts as being applied until AdvanceClock(..., sequence)
  // (WaitUntilApplied). A new incarnation's answers to the old one's parked pulls go into
  // `released` when given (run when the caller lets go of it, after its own locks), else run before
  // Admit returns.
  absl::StatusOr<Admission> Admit(int32_t worker, uint64_t incarnation, uint64_t sequence,
                                  bool applied = false, Released* released = nullptr);
  // What Admit would refuse of push (worker, incarnation, sequence) now, with Admit's status,
  // recording nothing; OK for a push it would apply or take for a duplicate. For a caller that
  // must do work with effects of its own (creating rows) before it may call Admit. Admit can
  // still refuse a push this let through when another call of the same worker comes between
  // the two: a push closing the sequence window or giving a sequence up, or any call of a
  // newer incarnation (a pull or heartbeat included).
  absl::Status CheckAdmission(int32_t worker, uint64_t incarnation, uint64_t sequence) const;
  // Advances the worker's clock to at least `clock`, after its push `sequence` was applied
  // (so that a pull released by the new clock sees the push); the push is no longer being
  // applied (0: none named).
  void AdvanceClock(int32_t worker, uint64_t incarnation, int64_t clock, uint64_t sequence = 0);
  // For a push found a duplicate: waits until the admitted copy of it is applied (a retry
  // answered while the attempt it repeats is still being applied would let the worker read,
  // and rewrite, what that attempt has not applied yet), the worker replaced, or the tracker
  // closed. DEADLINE_EXCEEDED at `deadline`.
  absl::Status WaitUntilApplied(int32_t worker, uint64_t incarnation, uint64_t sequence,
                                absl::Time deadline);

  // A sign of life without a push (pulls, heartbeats). Returns FAILED_PRECONDITION for an
  // older incarnation than the newest seen, INVALID_ARGUMENT for one too far ahead.
  // `done_clock`: the steps the worker says it has completed (RequestHeader.done_clock); the
  // worker's clock rises to it once the incarnation is accepted. In a healthy job it is never
  // ahead (every server applied those pushes); after this server was restored from an older
  // checkpoint it is, and without it the worker's pulls would wait for its own lost clock.
  absl::Status Touch(int32_t worker, uint64_t incarnation, int64_t done_clock = 0);
  // The worker is done: it leaves the bound for good (until heard from again). Only the
  // worker's current incarnation may finish it (or the first one heard of, for a worker this
  // server has no record of): FAILED_PRECONDITION for any other, so a finish cannot come
  // with a new incarnation of its own; INVALID_ARGUMENT for an id outside the job.
  absl::Status Finish(int32_t worker, uint64_t incarnation);
  // Records where the worker's incarnation `incarnation` is in its data; false (nothing
  // changed) when the worker is unknown or at another incarnation: a late heartbeat of a
  // process that was replaced does not move its successor's position.
  bool SetDataPosition(int32_t worker, uint64_t incarnation, uint64_t offset, uint32_t epoch);

  // OK when a pull at `clock` can be served by pushes that may come: INVALID_ARGUMENT when
  // clock - staleness is more than kPullClockLead beyond the newest clock any worker has
  // pushed here, or than the worker's own `done_clock` (which Touch takes). Always OK when
  // asynchronous (pulls never wait).
  absl::Status CheckPullClock(int32_t worker, int64_t clock, int64_t done_clock = 0) const;
  // Blocks until the bound lets a worker at `clock` read (min live clock >= clock -
  // staleness), or until `deadline` (DEADLINE_EXCEEDED naming the slowest worker).
  // Returns at once when asynchronous. Records the staleness seen.
  absl::Status WaitForBound(int32_t worker, int64_t clock, absl::Time deadline);
  // Deterministic BSP: blocks the push of `clock` from `worker` until it is its turn, i.e.
  // every live worker has arrived with its push of `clock` (or got past it), and every live
  // worker with a lower id has had its push of `clock` applied (AdvanceClock). So the pushes
  // of one clock are applied together, in worker order, and after every pull of the previous
  // clock: with the same seeds, runs give bitwise-identical parameters. DEADLINE_EXCEEDED at
  // `deadline` naming the worker waited for; the push may be retried. FAILED_PRECONDITION for
  // an older incarnation; UNAVAILABLE once the server stops (CloseWaiters). The push's
  // `sequence` is checked as Admit checks it (INVALID_ARGUMENT, OUT_OF_RANGE) before anything
  // is recorded, and so is the cap on waiting pushes (RESOURCE_EXHAUSTED): a push refused by
  // these changes nothing, not even the worker's incarnation. The cap counts distinct pushes
  // of the worker's incarnation: a retry of a push that waits takes its place (the older
  // attempt, whose caller gave it up, ends ABORTED at once), and a new incarnation's first
  // push ends every wait of the old one (FAILED_PRECONDITION), so neither is refused for
  // waits nobody listens to (before 2026-12-06, found in review: they held the cap until
  // their deadlines, and a restarted worker's first push was refused as too_many_waiting,
  // which workers do not retry).
  absl::Status WaitForTurn(int32_t worker, uint64_t incarnation, uint64_t sequence, int64_t clock,
                           absl::Time deadline);
  // ---- Parked pulls.
  // 0 means "not parked": the bound held at once.
  using WaiterId = uint64_t;
  // Called exactly once for a parked pull: OK when the bound lets it through,
  // DEADLINE_EXCEEDED at its deadline, FAILED_PRECONDITION once a newer incarnation of its
  // worker is heard from, or the status given to CancelWaiter / CloseWaiters. Runs without
  // the tracker's lock, on the thread that moved the clock or heard the new incarnation, or
  // on the timer thread: it must not block.
  using BoundCallback = std::function<void(absl::Status)>;
  // Callbacks of parked pulls taken out of the waiters under mu_; they run when this goes out
  // of scope. Declared before the MutexLock of a function, it runs them after the lock is
  // released; a caller that holds locks of its own passes one declared before them (Admit).
  class Released {
   public:
    Released() = default;
    Released(const Released&) = delete;
    Released& operator=(const Released&) = delete;
    ~Released();
    void Add(BoundCallback done, absl::Status status);

   private:
    std::vector<std::pair<BoundCallback, absl::Status>> items_;
  };
  struct ParkLimits {
    // Parked pulls of one worker, and of all workers together. REQUIRES: > 0.
    size_t per_worker = 16;
    size_t total = 1024;
    // Bytes of the requests they keep (`held_bytes` of WhenBound), of one worker and of all
    // together: a request of up to server.max_message_bytes stays in memory as long as its
    // pull is parked (up to max_pull_wait_s). REQUIRES: > 0.
    uint64_t bytes_per_worker = uint64_t{256} << 20;
    uint64_t bytes_total = uint64_t{1} << 30;
  };
  // WaitForBound without the thread: returns 0 when the bound lets a worker at `clock` read
  // now (`done` is dropped: the caller reads at once), else parks the pull of `worker`'s
  // `incarnation` and returns its id; `done` is called later (FAILED_PRECONDITION once a
  // newer incarnation of the worker is heard from). Errors (`done` dropped):
  // FAILED_PRECONDITION for an incarnation older than the worker's current one;
  // DEADLINE_EXCEEDED when `deadline` has passed; RESOURCE_EXHAUSTED beyond `limits` (with
  // `held_bytes`, what the parked pull keeps of its request, counted against the byte
  // limits; beyond a limit of all workers together, one no fault of this worker's, the status
  // carries kAllWorkersFull: the pull may be sent again); the CloseWaiters status once closed.
  // The payload type marking WhenBound's refusals for the limits of all workers together.
  static constexpr char kAllWorkersFull[] = "ps.worker_tracker.all_workers_full";
  absl::StatusOr<WaiterId> WhenBound(int32_t worker, uint64_t incarnation, int64_t clock,
                                     absl::Time deadline, const ParkLimits& limits,
                                     BoundCallback done, uint64_t held_bytes = 0);
  // Takes parked pull `id` back and calls its callback with `status` (REQUIRES: not OK);
  // nothing when it is no longer parked.
  void CancelWaiter(WaiterId id, absl::Status status);
  // Calls every parked pull's callback with `status` (REQUIRES: not OK) and refuses new ones
  // with it from now on (server shutdown).
  void CloseWaiters(absl::Status status);
  // Pulls parked now.
  size_t parked() const;
  // Deterministic-BSP pushes waiting for their turn now (WaitForTurn).
  int pushes_waiting_for_turn() const;

  // Wakes waiters so they re-check leases (called periodically by the server). Returns the
  // workers whose lease ran out since the previous call (each reported once per silence).
  std::vector<int32_t> Poke();

  // True once every participating worker has been heard from and has finished.
  bool AllFinished() const;
  int64_t MinLiveClock() const;
  int64_t max_staleness_seen() const;
  std::optional<int32_t> staleness() const { return options_.staleness; }
  void FillStats(std::vector<WorkerClock>* out) const;

  // Checkpoint state, and restore from it (replaces everything; restored workers count as
  // last seen now). `saved_at` is when the checkpoint was taken (its clock). A saved
  // incarnation that led that clock, or this one if later, by more than max_incarnation_lead
  // (a forged one that got into an older checkpoint) is dropped with its exactly-once state:
  // the worker's next real incarnation takes over. Every other restored incarnation is
  // accepted from then on even if this server's clock is now behind it (a clock set back, or
  // another host's): before 2026-12-05 a clock more than the lead behind the checkpoint's
  // dropped a real worker's exactly-once state, and refused the worker.
  std::vector<WorkerCheckpoint> Save() const;
  void Restore(const std::vector<WorkerCheckpoint>& workers,
               absl::Time saved_at = absl::InfinitePast());
  // INVALID_ARGUMENT when `incarnation` leads the clock by more than max_incarnation_lead
  // (and is above every incarnation restored from a checkpoint).
  absl::Status CheckIncarnation(int32_t worker, uint64_t incarnation) const;
  // Saved state of a worker (as Save gives it), if any.
  std::optional<WorkerCheckpoint> Get(int32_t worker) const;
  // Where a worker is (for a restarted worker, in each heartbeat's answer), if known: without
  // copying its exactly-once state, as Get does.
  struct Position {
    uint64_t incarnation = 0;
    uint64_t data_offset = 0;
    uint32_t epoch = 0;
    int64_t clock = 0;
  };
  std::optional<Position> PositionOf(int32_t worker) const;

 private:
  struct Worker {
    uint64_t incarnation = 0;
    int64_t clock = 0;
    uint64_t floor = 0;
    absl::btree_set<uint64_t> above;
    // Sequences <= floor never applied: ranges first -> last (the newest kMaxGivenUpRanges),
    // and every sequence <= unknown_through.
    absl::btree_map<uint64_t, uint64_t> given_up;
    uint64_t unknown_through = 0;
    uint64_t data_offset = 0;
    uint32_t epoch = 0;
    bool finished = false;
    bool seen = false;
    bool expiry_reported = false;
    // No push of this incarnation applied since this server took up its record (a new
    // incarnation, or one restored from a checkpoint): its next may carry any sequence up to
    // kMaxSequence, the window holding from the first one applied.
    bool window_open = false;
    absl::Time last_seen = absl::InfinitePast();
    // Deterministic BSP: the newest clock this worker has a push waiting for, and how many
    // of its pushes wait for their turn now.
    int64_t arrived = 0;
    int turn_waits = 0;
    // The pushes of this incarnation waiting for their turn, by sequence: the newest attempt's
    // number (next_turn_attempt_). A retry of a waiting push takes the older attempt's place
    // (that one ends ABORTED: its caller gave it up), and a new incarnation ends them all.
    absl::flat_hash_map<uint64_t, uint64_t> turn_attempts;
    // Pushes admitted and not applied yet (at most the worker's calls in flight).
    absl::flat_hash_set<uint64_t> applying;
  };
  static WorkerCheckpoint SaveWorker(int32_t id, const Worker& w);
  struct Waiter {
    int32_t worker;
    uint64_t incarnation;
    int64_t clock;
    absl::Time deadline;
    BoundCallback done;
    uint64_t bytes;  // of its request, kept while parked
  };
  // Parked pulls of one worker, and the bytes of their requests.
  struct Parked {
    size_t pulls = 0;
    uint64_t bytes = 0;
  };
  // Removes waiter `id` from every index; returns its callback (empty when not parked).
  BoundCallback TakeWaiter(WaiterId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the waiters the bound now lets through into `out` (and records their staleness).
  void ReleaseReady(Released* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the waiters whose deadline is at or before `now` into `out` (DEADLINE_EXCEEDED).
  void ReleaseExpired(absl::Time now, Released* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bound's DEADLINE_EXCEEDED for a worker at `clock`.
  absl::Status BoundTimeout(int32_t worker, int64_t clock) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The timer thread: expires deadlines and re-checks leases while pulls are parked.
  void TimerLoop();
  // Answers the parked pulls of `worker`'s incarnations older than its current one
  // (FAILED_PRECONDITION) into `out`.
  void ReleaseReplaced(int32_t worker, Released* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What Admit refuses of a sequence, read before Lookup records anything: INVALID_ARGUMENT
  // for sequence 0, for one past kMaxSequence and, once a push of the incarnation was applied
  // here (Worker::window_open), for one beyond the window of the highest applied;
  // OUT_OF_RANGE for a given-up one.
  absl::Status CheckSequence(int32_t worker, uint64_t incarnation, uint64_t sequence) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What Lookup refuses, recording nothing: INVALID_ARGUMENT for an id outside the job or an
  // incarnation too far ahead (CheckIncarnation), FAILED_PRECONDITION for one older than the
  // worker's current incarnation.
  absl::Status CheckWorkerIncarnation(int32_t worker, uint64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns the worker's record, switching to a newer incarnation if this is one (the old
  // one's parked pulls go into `released`).
  absl::StatusOr<Worker*> Lookup(int32_t worker, uint64_t incarnation, Released* released)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Live(const Worker& w, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `sequence` (<= w.floor) was given up: never applied, or (<= w.unknown_through) of
  // unknown fate.
  static bool GivenUp(const Worker& w, uint64_t sequence);
  // OUT_OF_RANGE for a push of a given-up `sequence`, worded for which of the two it is.
  static absl::Status GivenUpError(int32_t worker, const Worker& w, uint64_t sequence);
  // Records first..last (above every range recorded, at or below the floor) as given up.
  static void GiveUp(Worker* w, uint64_t first, uint64_t last);
  // The newest incarnation this server accepts now.
  uint64_t MaxIncarnation() const;
  // The limit of MaxIncarnation at `now`, not counting restored incarnations.
  uint64_t LeadLimit(absl::Time now) const;
  // Min clock over live participants, and the slowest one's id (-1 if none live).
  std::pair<int64_t, int32_t> MinLive(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct BoundArgs {
    const WorkerTracker* tracker;
    int64_t need;
  };
  static bool BoundHolds(BoundArgs* args) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  struct TurnArgs {
    const WorkerTracker* tracker;
    int32_t worker;
    int64_t clock;
    uint64_t sequence;
    uint64_t attempt;  // its number in the worker's turn_attempts
    int32_t blocker;   // out: the worker waited for, -1 when it is the turn
    bool superseded;   // out: a retry or a new incarnation of the worker took its place
  };
  static bool IsTurn(TurnArgs* args) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  uint64_t next_turn_attempt_ ABSL_GUARDED_BY(mu_) = 0;

  const WorkerTrackerOptions options_;
  // The highest incarnation restored from a checkpoint (accepted whatever the clock says).
  std::atomic<uint64_t> restored_incarnation_{0};
  const std::function<absl::Time()> now_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<int32_t, Worker> workers_ ABSL_GUARDED_BY(mu_);
  int64_t max_staleness_seen_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pokes_ ABSL_GUARDED_BY(mu_) = 0;

  // Parked pulls, by id, by the clock the slowest worker must reach (clock - staleness), and
  // by deadline.
  absl::flat_hash_map<WaiterId, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<int64_t, WaiterId>> by_need_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, WaiterId>> by_deadline_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int32_t, Parked> parked_per_worker_ ABSL_GUARDED_BY(mu_);
  uint64_t parked_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // over every worker
  WaiterId next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);  // not OK once CloseWaiters was called
  bool stop_timer_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar timer_cv_;
  std::thread timer_;  // started (under mu_) with the first parked pull
};

}  // namespace ps::server

#endif  // PS_SERVER_WORKER_TRACKER_H_
