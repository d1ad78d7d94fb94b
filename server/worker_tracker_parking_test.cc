// WorkerTracker's parked pulls (WhenBound): pulls that wait for the consistency bound without
// holding a thread, released as clocks move, at their deadline, on cancel or close, and capped.
#include "server/worker_tracker.h"

#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker_tracker_testing.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::testing::HasSubstr;
using worker_tracker_testing::FakeClock;
using worker_tracker_testing::Options;

// ---- Parked pulls (WhenBound) ---------------------------------------------------------------

// Records the status a parked pull's callback was called with.
struct Outcome {
  absl::Notification done;
  absl::Status status;
  WorkerTracker::BoundCallback callback() {
    return [this](absl::Status s) {
      status = std::move(s);
      done.Notify();
    };
  }
};

const absl::Time kLater = absl::InfiniteFuture();

TEST(WorkerTrackerParking, ABoundThatHoldsDoesNotPark) {
  WorkerTracker t(Options(2, 0));
  Outcome o;
  auto now = t.WhenBound(0, /*incarnation=*/1, 0, kLater, {}, o.callback());
  ASSERT_THAT(now.status(), IsOk());
  EXPECT_EQ(*now, 0u);
  WorkerTracker async(Options(2, std::nullopt));
  auto never = async.WhenBound(0, /*incarnation=*/1, 99, kLater, {}, o.callback());
  ASSERT_THAT(never.status(), IsOk());
  EXPECT_EQ(*never, 0u);
  EXPECT_FALSE(o.done.HasBeenNotified());
  EXPECT_EQ(t.parked(), 0u);
}

TEST(WorkerTrackerParking, ParkedPullIsReleasedWhenTheSlowestClockMoves) {
  WorkerTracker t(Options(2, 1));  // SSP 1: a pull at clock 3 needs every worker at 2
  Outcome o;
  ASSERT_THAT(t.WhenBound(0, /*incarnation=*/1, 3, kLater, {}, o.callback()).status(), IsOk());
  EXPECT_EQ(t.parked(), 1u);
  t.AdvanceClock(0, 0, 2);
  EXPECT_FALSE(o.done.HasBeenNotified());  // worker 1 is still at 0
  ASSERT_THAT(t.Admit(1, 1, 1).status(), IsOk());
  t.AdvanceClock(1, 1, 2);
  ASSERT_TRUE(o.done.HasBeenNotified());  // called on this thread, before AdvanceClock returned
  EXPECT_THAT(o.status, IsOk());
  EXPECT_EQ(t.parked(), 0u);
  EXPECT_EQ(t.max_staleness_seen(), 1);
}

// The bytes parked pulls keep are capped per worker and in all, and given back as each pull
// leaves: a pull that did not fit fits once another is answered.
TEST(WorkerTrackerParking, ParkedBytesAreCappedAndGivenBackWhenAPullLeaves) {
  WorkerTracker t(Options(3, 0));
  WorkerTracker::ParkLimits limits;
  limits.bytes_per_worker = 100;
  limits.bytes_total = 150;
  Outcome a, b, c, d;
  ASSERT_THAT(t.WhenBound(0, 1, 1, kLater, limits, a.callback(), 60).status(), IsOk());
  EXPECT_THAT(t.WhenBound(0, 1, 1, kLater, limits, b.callback(), 60).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::HasSubstr("per worker")));
  ASSERT_THAT(t.WhenBound(1, 1, 1, kLater, limits, c.callback(), 80).status(), IsOk());
  EXPECT_THAT(t.WhenBound(2, 1, 1, kLater, limits, d.callback(), 20).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::HasSubstr("in all")));
  EXPECT_EQ(t.parked(), 2u);
  // Every worker at clock 1: both parked pulls are answered, and their bytes given back.
  for (int32_t w = 0; w < 3; ++w) {
    ASSERT_THAT(t.Admit(w, 1, 1).status(), IsOk());
    t.AdvanceClock(w, 1, 1);
  }
  ASSERT_TRUE(a.done.HasBeenNotified() && c.done.HasBeenNotified());
  EXPECT_EQ(t.parked(), 0u);
  Outcome e, f;
  EXPECT_THAT(t.WhenBound(0, 1, 2, kLater, limits, e.callback(), 100).status(), IsOk());
  EXPECT_THAT(t.WhenBound(2, 1, 2, kLater, limits, f.callback(), 50).status(), IsOk());
  EXPECT_EQ(t.parked(), 2u);
  t.CloseWaiters(absl::UnavailableError("stopping"));
}

TEST(WorkerTrackerParking, AFinishedWorkerReleasesTheWaitersItHeldBack) {
  WorkerTracker t(Options(2, 0));
  ASSERT_THAT(t.Touch(1, 1), IsOk());
  t.AdvanceClock(0, 0, 1);
  Outcome o;
  ASSERT_THAT(t.WhenBound(0, /*incarnation=*/1, 1, kLater, {}, o.callback()).status(), IsOk());
  ASSERT_THAT(t.Finish(1, 1), IsOk());
  ASSERT_TRUE(o.done.HasBeenNotified());
  EXPECT_THAT(o.status, IsOk());
}

TEST(WorkerTrackerParking, AnExpiredLeaseReleasesWaitersThroughTheTimer) {
  FakeClock clock;
  WorkerTracker t(Options(2, 0), clock.fn());
  ASSERT_THAT(t.Touch(1, 1), IsOk());
  t.AdvanceClock(0, 0, 1);
  Outcome o;
  ASSERT_THAT(t.WhenBound(0, /*incarnation=*/1, 1, kLater, {}, o.callback()).status(), IsOk());
  clock.seconds += 31;  // worker 1's lease runs out; nobody pokes: the timer re-checks
  o.done.WaitForNotification();
  EXPECT_THAT(o.status, IsOk());
}

TEST(WorkerTrackerParking, DeadlineCancelCapAndClose) {
  WorkerTracker t(Options(2, 0));
  Outcome expires, cancelled, closed;
  WorkerTracker::ParkLimits limits;
  limits.per_worker = 2;
  limits.total = 3;
  ASSERT_THAT(t.WhenBound(0, /*incarnation=*/1, 1, absl::Now() + absl::Milliseconds(50), limits,
                          expires.callback())
                  .status(),
              IsOk());
  auto id = t.WhenBound(0, /*incarnation=*/1, 1, kLater, limits, cancelled.callback());
  ASSERT_THAT(id.status(), IsOk());
  Outcome refused;
  EXPECT_THAT(t.WhenBound(0, /*incarnation=*/1, 1, kLater, limits, refused.callback()),
              StatusIs(absl::StatusCode::kResourceExhausted));
  ASSERT_THAT(t.WhenBound(1, /*incarnation=*/1, 1, kLater, limits, closed.callback()).status(),
              IsOk());
  EXPECT_THAT(t.WhenBound(1, /*incarnation=*/1, 1, kLater, limits, refused.callback()),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(t.WhenBound(1, /*incarnation=*/1, 1, absl::Now() - absl::Seconds(1), limits,
                          refused.callback()),
              StatusIs(absl::StatusCode::kDeadlineExceeded));

  expires.done.WaitForNotification();
  EXPECT_THAT(expires.status, StatusIs(absl::StatusCode::kDeadlineExceeded));
  t.CancelWaiter(*id, absl::CancelledError("gone"));
  ASSERT_TRUE(cancelled.done.HasBeenNotified());
  EXPECT_THAT(cancelled.status, StatusIs(absl::StatusCode::kCancelled));
  t.CancelWaiter(*id, absl::CancelledError("twice"));  // no longer parked: nothing happens
  t.CloseWaiters(absl::UnavailableError("stopping"));
  ASSERT_TRUE(closed.done.HasBeenNotified());
  EXPECT_THAT(closed.status, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(t.WhenBound(0, /*incarnation=*/1, 1, kLater, limits, refused.callback()),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(refused.done.HasBeenNotified());
  EXPECT_EQ(t.parked(), 0u);
}

TEST(WorkerTrackerParking, ANewIncarnationAnswersItsPredecessorsParkedPulls) {
  WorkerTracker t(Options(2, 0));
  ASSERT_THAT(t.Touch(0, 1), IsOk());
  ASSERT_THAT(t.Touch(1, 1), IsOk());
  Outcome predecessor, other;
  ASSERT_THAT(t.WhenBound(0, /*incarnation=*/1, 1, kLater, {}, predecessor.callback()).status(),
              IsOk());
  ASSERT_THAT(t.WhenBound(1, /*incarnation=*/1, 1, kLater, {}, other.callback()).status(), IsOk());
  ASSERT_THAT(t.Touch(0, 1), IsOk());  // the same process again: nothing
  EXPECT_FALSE(predecessor.done.HasBeenNotified());

  ASSERT_THAT(t.Touch(0, 2), IsOk());  // a new process of worker 0
  ASSERT_TRUE(predecessor.done.HasBeenNotified());
  EXPECT_THAT(predecessor.status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                           ::testing::HasSubstr("was replaced")));
  EXPECT_FALSE(other.done.HasBeenNotified());
  EXPECT_EQ(t.parked(), 1u);
  Outcome late;  // the old process cannot park again
  EXPECT_THAT(t.WhenBound(0, /*incarnation=*/1, 1, kLater, {}, late.callback()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(late.done.HasBeenNotified());

  // A push's admission does the same: at once, or when the caller's holder goes (the shard
  // passes one declared before its locks); and so does a deterministic push's turn.
  Outcome by_push, by_held_push, by_turn;
  ASSERT_THAT(t.WhenBound(0, /*incarnation=*/2, 1, kLater, {}, by_push.callback()).status(),
              IsOk());
  ASSERT_THAT(t.Admit(0, 3, 1).status(), IsOk());
  ASSERT_TRUE(by_push.done.HasBeenNotified());
  EXPECT_THAT(by_push.status, StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(t.WhenBound(0, /*incarnation=*/3, 1, kLater, {}, by_held_push.callback()).status(),
              IsOk());
  {
    WorkerTracker::Released held;
    ASSERT_THAT(t.Admit(0, 4, 1, /*applied=*/true, &held).status(), IsOk());
    EXPECT_FALSE(by_held_push.done.HasBeenNotified());
    EXPECT_EQ(t.parked(), 1u);  // taken out of the waiters already
  }
  ASSERT_TRUE(by_held_push.done.HasBeenNotified());
  EXPECT_THAT(by_held_push.status, StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(t.WhenBound(0, /*incarnation=*/4, 1, kLater, {}, by_turn.callback()).status(),
              IsOk());
  // Worker 1 is not at clock 1 yet: the push waits for its turn, and the pull is answered
  // before that wait, not after it.
  std::thread turn([&] {
    EXPECT_THAT(t.WaitForTurn(0, 5, /*sequence=*/1, 1, absl::Now() + absl::Seconds(60)), IsOk());
  });
  const bool answered_first = by_turn.done.WaitForNotificationWithTimeout(absl::Seconds(30));
  t.AdvanceClock(1, 1, 1);  // worker 1 reaches clock 1: worker 0's turn
  turn.join();
  ASSERT_TRUE(answered_first) << "the replaced process's pull waited for the new one's turn";
  EXPECT_THAT(by_turn.status, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(other.done.HasBeenNotified());
  EXPECT_EQ(t.parked(), 1u);
  // Worker 1's pull is answered here, not by the tracker's destructor after `other` is gone.
  t.CloseWaiters(absl::UnavailableError("the test ends"));
  EXPECT_THAT(other.status, StatusIs(absl::StatusCode::kUnavailable));
}

TEST(WorkerTrackerParking, AWorkerMayHaveOnlyAFewPushesWaitingForTheirTurn) {
  WorkerTracker t(Options(2, 0));
  constexpr int kPushes = WorkerTracker::kMaxTurnWaitsPerWorker + 1;
  std::atomic<int> ok{0}, refused{0};
  absl::Notification one_refused;
  std::vector<std::thread> pushes;
  for (int i = 0; i < kPushes; ++i) {
    // Clock 5 from worker 1 (distinct pushes: a retry of one takes its place instead): its
    // turn needs worker 0 at clock 5.
    pushes.emplace_back([&, sequence = i + 1] {
      absl::Status s = t.WaitForTurn(1, 1, sequence, 5, absl::Now() + absl::Seconds(60));
      if (s.ok()) ++ok;
      if (absl::IsResourceExhausted(s)) {
        ++refused;
        one_refused.Notify();
      }
    });
  }
  // Only a push beyond the cap can be refused, and only while the others wait.
  one_refused.WaitForNotification();
  t.AdvanceClock(0, 0, 5);  // now it is worker 1's turn
  for (auto& th : pushes) th.join();
  EXPECT_EQ(refused.load(), 1);
  EXPECT_EQ(ok.load(), WorkerTracker::kMaxTurnWaitsPerWorker);
}

// Blocks until `t` has `n` pushes waiting for their turn.
void AwaitTurnWaits(const WorkerTracker& t, int n) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (t.pushes_waiting_for_turn() != n && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(t.pushes_waiting_for_turn(), n);
}

// A push sent again while an attempt of it waits for its turn takes that attempt's place: the
// older one (its caller gave it up: a dropped connection) ends ABORTED at once instead of
// holding the cap until its deadline, so retries are never refused as too_many_waiting (found
// in review, 2026-12-06: the third attempt was, and workers do not retry that). The newest
// attempt goes on when the turn comes.
TEST(WorkerTrackerParking, ARetriedPushTakesItsWaitingAttemptsPlace) {
  WorkerTracker t(Options(2, 0));
  constexpr int kAttempts = WorkerTracker::kMaxTurnWaitsPerWorker + 3;
  std::vector<absl::Status> status(kAttempts);
  std::vector<std::thread> attempts;
  for (int i = 0; i < kAttempts; ++i) {
    // Clock 5 from worker 1: its turn needs worker 0 at clock 5.
    attempts.emplace_back([&t, &status, i] {
      status[i] = t.WaitForTurn(1, 1, /*sequence=*/1, 5, absl::Now() + absl::Seconds(20));
    });
    if (i > 0) {
      attempts[i - 1].join();  // ended by this one
      EXPECT_THAT(status[i - 1],
                  StatusIs(absl::StatusCode::kAborted, HasSubstr("the newer attempt waits")));
    }
    ASSERT_NO_FATAL_FAILURE(AwaitTurnWaits(t, 1));
  }
  t.AdvanceClock(0, 0, 5);
  attempts.back().join();
  EXPECT_THAT(status.back(), IsOk());
}

// A new incarnation's first push ends the old incarnation's waits for their turn (FAILED_
// PRECONDITION) and is not refused for them (found in review, 2026-12-06: with the old
// process's two pushes still waiting, a restarted worker's first push got too_many_waiting,
// which workers do not retry).
TEST(WorkerTrackerParking, ANewIncarnationEndsTheOldOnesWaitsForTheirTurn) {
  WorkerTracker t(Options(2, 0));
  std::vector<absl::Status> old(WorkerTracker::kMaxTurnWaitsPerWorker);
  std::vector<std::thread> waits;
  for (size_t i = 0; i < old.size(); ++i) {
    waits.emplace_back([&t, &old, i] {
      old[i] = t.WaitForTurn(1, 5, /*sequence=*/i + 1, 5, absl::Now() + absl::Seconds(20));
    });
    ASSERT_NO_FATAL_FAILURE(AwaitTurnWaits(t, static_cast<int>(i) + 1));
  }
  absl::Status fresh;
  std::thread restarted(
      [&] { fresh = t.WaitForTurn(1, 6, /*sequence=*/1, 5, absl::Now() + absl::Seconds(20)); });
  for (size_t i = 0; i < waits.size(); ++i) {
    waits[i].join();
    EXPECT_THAT(old[i], StatusIs(absl::StatusCode::kFailedPrecondition,
                                 HasSubstr("a newer incarnation took over")));
  }
  ASSERT_NO_FATAL_FAILURE(AwaitTurnWaits(t, 1));
  t.AdvanceClock(0, 0, 5);
  restarted.join();
  EXPECT_THAT(fresh, IsOk());
}

}  // namespace
}  // namespace ps::server
