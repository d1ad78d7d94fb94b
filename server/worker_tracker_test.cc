#include "server/worker_tracker.h"

#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker_tracker_testing.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using Admission = WorkerTracker::Admission;
using ::testing::HasSubstr;
using worker_tracker_testing::FakeClock;
using worker_tracker_testing::Options;

TEST(WorkerTracker, AdmitsEachSequenceOnce) {
  WorkerTracker t(Options(2, std::nullopt));
  EXPECT_EQ(*t.Admit(0, 7, 1), Admission::kApply);
  EXPECT_EQ(*t.Admit(0, 7, 1), Admission::kDuplicate);
  // Out of order: 3 before 2, each once.
  EXPECT_EQ(*t.Admit(0, 7, 3), Admission::kApply);
  EXPECT_EQ(*t.Admit(0, 7, 2), Admission::kApply);
  EXPECT_EQ(*t.Admit(0, 7, 3), Admission::kDuplicate);
  EXPECT_EQ(*t.Admit(0, 7, 2), Admission::kDuplicate);
  EXPECT_EQ(*t.Admit(0, 7, 4), Admission::kApply);
  // Other workers have their own sequences.
  EXPECT_EQ(*t.Admit(1, 7, 1), Admission::kApply);
}

// A duplicate found while the attempt it repeats is still being applied waits for that
// attempt's AdvanceClock; one admitted after it was applied (the one pass) makes nobody wait;
// a new incarnation, or the deadline, ends the wait.
TEST(WorkerTracker, ADuplicateWaitsUntilTheAttemptItRepeatsIsApplied) {
  WorkerTracker t(Options(2, std::nullopt));
  ASSERT_EQ(*t.Admit(0, 7, 1), Admission::kApply);  // now being applied
  ASSERT_EQ(*t.Admit(0, 7, 1), Admission::kDuplicate);
  EXPECT_THAT(t.WaitUntilApplied(0, 7, 1, absl::Now() + absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  absl::Notification waited;
  std::thread duplicate([&] {
    EXPECT_THAT(t.WaitUntilApplied(0, 7, 1, absl::Now() + absl::Seconds(60)), IsOk());
    waited.Notify();
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(waited.HasBeenNotified());
  t.AdvanceClock(0, 7, /*clock=*/1, /*sequence=*/1);
  duplicate.join();
  EXPECT_THAT(t.WaitUntilApplied(0, 7, 1, absl::InfinitePast()), IsOk());
  ASSERT_EQ(*t.Admit(0, 7, 2, /*applied=*/true), Admission::kApply);
  EXPECT_THAT(t.WaitUntilApplied(0, 7, 2, absl::InfinitePast()), IsOk());
  // Worker 1's push 1 is being applied when its next incarnation comes.
  ASSERT_EQ(*t.Admit(1, 7, 1), Admission::kApply);
  std::thread old(
      [&] { EXPECT_THAT(t.WaitUntilApplied(1, 7, 1, absl::Now() + absl::Seconds(60)), IsOk()); });
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_EQ(*t.Admit(1, 8, 1), Admission::kApply);
  old.join();
}

TEST(WorkerTracker, LostSequencesDoNotGrowTheStateForever) {
  // A server restored from an older checkpoint never sees sequences 2..10 again.
  WorkerTracker t(Options(1, std::nullopt));
  ASSERT_EQ(*t.Admit(0, 1, 1), Admission::kApply);
  for (uint64_t s = 11; s < 11 + 3 * WorkerTracker::kMaxAbove; ++s) {
    ASSERT_EQ(*t.Admit(0, 1, s), Admission::kApply);
  }
  auto saved = t.Get(0);
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(saved->applied_above_size(), 0);
  EXPECT_EQ(saved->applied_floor(), 10 + 3 * WorkerTracker::kMaxAbove);
  // Recent sequences are still recognized as duplicates.
  EXPECT_EQ(*t.Admit(0, 1, 10 + 3 * WorkerTracker::kMaxAbove), Admission::kDuplicate);
  // The lost ones were never applied here: refused, not taken for duplicates.
  EXPECT_THAT(t.Admit(0, 1, 5).status(), StatusIs(absl::StatusCode::kOutOfRange));
  ASSERT_EQ(saved->given_up_size(), 1);
  EXPECT_EQ(saved->given_up(0).first(), 2u);
  EXPECT_EQ(saved->given_up(0).last(), 10u);
}

// A push left behind by kMaxAbove later ones of its worker (another thread's pushes, say,
// while it waited to be retried) is given up: a retry of it is refused OUT_OF_RANGE. It used
// to be answered as a duplicate, which acknowledged a push that was never applied.
TEST(WorkerTracker, ARetryLeftBehindByTooManyPushesIsRefusedNotAcknowledged) {
  WorkerTracker t(Options(1, std::nullopt));
  ASSERT_EQ(*t.Admit(0, 7, 1), Admission::kApply);
  // Sequence 2 is the laggard; 3 .. kMaxAbove + 2 (kMaxAbove of them) keep it remembered.
  for (uint64_t s = 3; s <= WorkerTracker::kMaxAbove + 2; ++s) {
    ASSERT_EQ(*t.Admit(0, 7, s), Admission::kApply);
  }
  EXPECT_EQ(*t.Admit(0, 7, 2), Admission::kApply);  // still in time
  for (uint64_t s = WorkerTracker::kMaxAbove + 3; s <= WorkerTracker::kMaxAbove + 5; ++s) {
    ASSERT_EQ(*t.Admit(0, 7, s), Admission::kApply);
  }
  // Sequence kMaxAbove + 6 is the laggard now; one more than kMaxAbove pass it.
  const uint64_t laggard = WorkerTracker::kMaxAbove + 6;
  for (uint64_t s = laggard + 1; s <= laggard + WorkerTracker::kMaxAbove + 1; ++s) {
    ASSERT_EQ(*t.Admit(0, 7, s), Admission::kApply);
  }
  EXPECT_THAT(t.Admit(0, 7, laggard).status(),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::HasSubstr("never applied")));
  // Its neighbours, applied, are still duplicates; the next is applied.
  EXPECT_EQ(*t.Admit(0, 7, laggard - 1), Admission::kDuplicate);
  EXPECT_EQ(*t.Admit(0, 7, laggard + 1), Admission::kDuplicate);
  EXPECT_EQ(*t.Admit(0, 7, 1), Admission::kDuplicate);
  EXPECT_EQ(*t.Admit(0, 7, laggard + WorkerTracker::kMaxAbove + 2), Admission::kApply);
  // A checkpoint keeps it given up; a new incarnation starts over.
  WorkerTracker restored(Options(1, std::nullopt));
  restored.Restore(t.Save());
  EXPECT_THAT(restored.Admit(0, 7, laggard).status(), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(*restored.Admit(0, 7, laggard - 1), Admission::kDuplicate);
  EXPECT_EQ(*restored.Admit(0, 7, laggard + 1), Admission::kDuplicate);
  EXPECT_EQ(*restored.Admit(0, 8, laggard), Admission::kApply);
}

// Given-up ranges are remembered up to kMaxGivenUpRanges; older ones are forgotten, and every
// sequence at or below them is refused as well (its fate unknown), never acknowledged.
TEST(WorkerTracker, GivenUpRangesAreBoundedAndForgottenOnesStayRefused) {
  WorkerTracker t(Options(1, std::nullopt));
  // Even sequences only: each odd one is given up once kMaxAbove later ones are applied.
  const uint64_t ranges = WorkerTracker::kMaxGivenUpRanges + 10;
  for (uint64_t i = 1; i <= ranges + WorkerTracker::kMaxAbove; ++i) {
    ASSERT_EQ(*t.Admit(0, 7, 2 * i), Admission::kApply);
  }
  auto saved = t.Get(0);
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(static_cast<size_t>(saved->given_up_size()), WorkerTracker::kMaxGivenUpRanges);
  EXPECT_EQ(saved->given_up_through(), 19u);  // ranges 1, 3, ..., 19 forgotten
  EXPECT_THAT(t.Admit(0, 7, 1).status(), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(t.Admit(0, 7, 2).status(),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::HasSubstr("unknown")));
  EXPECT_THAT(t.Admit(0, 7, 21).status(), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(*t.Admit(0, 7, 22), Admission::kDuplicate);
  // A checkpoint whose ranges are out of order, overlap or lie above the floor keeps only
  // those Save could have written.
  WorkerCheckpoint bad = *saved;
  bad.clear_given_up();
  bad.set_given_up_through(0);
  for (auto [first, last] : std::vector<std::pair<uint64_t, uint64_t>>{
           {5, 5},
           {3, 3},
           {9, 8},
           {5, 7},
           {11, 11},
           {bad.applied_floor() + 1, bad.applied_floor() + 1}}) {
    SequenceRange* r = bad.add_given_up();
    r->set_first(first);
    r->set_last(last);
  }
  WorkerTracker restored(Options(1, std::nullopt));
  restored.Restore({bad});
  EXPECT_THAT(restored.Admit(0, 7, 5).status(), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(restored.Admit(0, 7, 11).status(), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(*restored.Admit(0, 7, 3), Admission::kDuplicate);
  EXPECT_EQ(*restored.Admit(0, 7, 7), Admission::kDuplicate);
  saved = restored.Get(0);
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(saved->given_up_size(), 2);
}

// A checkpoint whose applied set holds sequences at or below its floor (Save writes none; a
// foreign or damaged one might) keeps only those above it. Before 2026-12-05 the lowest entry
// became the floor when later pushes trimmed the set, moving the floor back, and a retried push
// between the two was applied again.
TEST(WorkerTracker, AppliedSequencesAtOrBelowTheFloorInACheckpointAreLeftOut) {
  WorkerCheckpoint c;
  c.set_worker_id(0);
  c.set_incarnation(7);
  c.set_applied_floor(100);
  c.add_applied_above(50);
  c.add_applied_above(200);
  WorkerTracker t(Options(1, std::nullopt));
  t.Restore({c});
  // Enough later pushes to trim the saved set by one entry.
  for (uint64_t q = 201; q < 200 + WorkerTracker::kMaxAbove; ++q) {
    ASSERT_EQ(*t.Admit(0, 7, q), Admission::kApply) << q;
  }
  EXPECT_EQ(*t.Admit(0, 7, 80), Admission::kDuplicate);
  EXPECT_EQ(*t.Admit(0, 7, 100), Admission::kDuplicate);
  EXPECT_EQ(*t.Admit(0, 7, 200), Admission::kDuplicate);
  const auto saved = t.Get(0);
  ASSERT_TRUE(saved.has_value());
  EXPECT_GE(saved->applied_floor(), 100u);
}

TEST(WorkerTracker, RefusesWorkersOutsideTheJob) {
  // Each worker id holds exactly-once state; ids beyond num_workers would grow it unbounded.
  WorkerTracker t(Options(2, std::nullopt));
  EXPECT_THAT(t.Admit(2, 1, 1).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(t.Admit(-1, 1, 1).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(t.Touch(1000000, 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(t.Get(2).has_value());
  EXPECT_EQ(*t.Admit(1, 1, 1), Admission::kApply);
}

TEST(WorkerTracker, RejectsSequenceZero) {
  WorkerTracker t(Options(1, std::nullopt));
  EXPECT_THAT(t.Admit(0, 1, 0).status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(WorkerTracker, NewIncarnationStartsOverAndOldOneIsRefused) {
  WorkerTracker t(Options(1, std::nullopt));
  ASSERT_EQ(*t.Admit(0, 5, 1), Admission::kApply);
  ASSERT_EQ(*t.Admit(0, 6, 1), Admission::kApply);  // restarted worker
  EXPECT_THAT(t.Admit(0, 5, 2).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(t.Touch(0, 5), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(*t.Admit(0, 6, 1), Admission::kDuplicate);
}

TEST(WorkerTracker, AsynchronousNeverWaits) {
  WorkerTracker t(Options(2, std::nullopt));
  // Worker 1 never showed up; worker 0 is far ahead.
  EXPECT_THAT(t.WaitForBound(0, 1000, absl::Now()), IsOk());
}

TEST(WorkerTracker, SspHoldsFastWorkerWithinBound) {
  WorkerTracker t(Options(2, 1));
  ASSERT_EQ(*t.Admit(0, 1, 1), Admission::kApply);
  t.AdvanceClock(0, 1, 3);
  ASSERT_EQ(*t.Admit(1, 1, 1), Admission::kApply);
  t.AdvanceClock(1, 1, 1);
  // Worker 0 at clock 3 needs everyone at >= 2; worker 1 is at 1.
  EXPECT_THAT(t.WaitForBound(0, 3, absl::Now() + absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // Within the bound: clock 2 needs >= 1.
  EXPECT_THAT(t.WaitForBound(0, 2, absl::Now()), IsOk());
}

TEST(WorkerTracker, WaiterIsReleasedWhenSlowWorkerAdvances) {
  WorkerTracker t(Options(2, 0));
  ASSERT_THAT(t.Touch(0, 1), IsOk());
  ASSERT_THAT(t.Touch(1, 1), IsOk());
  ASSERT_EQ(*t.Admit(0, 1, 1), Admission::kApply);
  t.AdvanceClock(0, 1, 1);
  absl::Notification released;
  absl::Status status;
  std::thread waiter([&] {
    status = t.WaitForBound(0, 1, absl::Now() + absl::Seconds(30));
    released.Notify();
  });
  // BSP: worker 0 (clock 1) waits for worker 1 to reach 1.
  EXPECT_FALSE(released.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  ASSERT_EQ(*t.Admit(1, 1, 1), Admission::kApply);
  t.AdvanceClock(1, 1, 1);
  EXPECT_TRUE(released.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
  EXPECT_THAT(status, IsOk());
}

// A worker's done_clock (what it says it has completed) raises its clock, as a push would,
// and releases pulls parked for it; an older incarnation's raises nothing.
TEST(WorkerTracker, ATouchRaisesTheClockToTheWorkersDoneClock) {
  WorkerTracker t(Options(2, 0));
  ASSERT_THAT(t.Touch(0, 1), IsOk());
  ASSERT_THAT(t.Touch(1, 1), IsOk());
  t.AdvanceClock(0, 1, 5);
  // A pull at 5 waits for worker 1 (at 0), whose own clock no push here is going to move.
  EXPECT_THAT(t.CheckPullClock(1, 5), IsOk());
  EXPECT_THAT(t.CheckPullClock(1, 9), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(t.CheckPullClock(1, 9, /*done_clock=*/9), IsOk());
  absl::Notification released;
  absl::Status status;
  auto parked = t.WhenBound(0, /*incarnation=*/1, 5, absl::Now() + absl::Seconds(30), {},
                            [&](absl::Status s) {
                              status = std::move(s);
                              released.Notify();
                            });
  ASSERT_THAT(parked.status(), IsOk());
  ASSERT_NE(*parked, 0u);
  ASSERT_THAT(t.Touch(1, 1, /*done_clock=*/4), IsOk());
  EXPECT_FALSE(released.HasBeenNotified());
  EXPECT_THAT(t.Touch(1, 0, /*done_clock=*/9), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(t.Get(1)->clock(), 4);
  ASSERT_THAT(t.Touch(1, 1, /*done_clock=*/5), IsOk());
  EXPECT_TRUE(released.HasBeenNotified());
  EXPECT_THAT(status, IsOk());
  ASSERT_THAT(t.Touch(1, 1, /*done_clock=*/2), IsOk());  // never lowers it
  EXPECT_EQ(t.Get(1)->clock(), 5);
}

TEST(WorkerTracker, UnseenWorkerHoldsBspBack) {
  WorkerTracker t(Options(2, 0));
  ASSERT_THAT(t.Touch(0, 1), IsOk());
  t.AdvanceClock(0, 1, 1);
  EXPECT_THAT(t.WaitForBound(0, 1, absl::Now() + absl::Milliseconds(10)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

// Deterministic BSP: the pushes of one clock go in worker order, once all have arrived.
TEST(WorkerTracker, PushesOfAClockTakeTurnsInWorkerOrder) {
  WorkerTracker t(Options(3, 0));
  // Worker 0 alone: workers 1 and 2 (not heard from yet) have not arrived.
  EXPECT_THAT(t.WaitForTurn(0, 1, /*sequence=*/1, 1, absl::Now() + absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::HasSubstr("worker 1")));
  std::vector<int> order;
  absl::Mutex order_mu;
  auto push = [&](int worker) {
    ASSERT_THAT(t.WaitForTurn(worker, 1, /*sequence=*/1, 1, absl::Now() + absl::Seconds(30)),
                IsOk());
    {
      absl::MutexLock lock(&order_mu);
      order.push_back(worker);
    }
    t.AdvanceClock(worker, 1, 1);  // "applied"
  };
  // Arrivals in reverse order; applications still in worker order.
  std::thread w2(push, 2);
  std::thread w1(push, 1);
  std::thread w0(push, 0);
  w0.join();
  w1.join();
  w2.join();
  EXPECT_THAT(order, ::testing::ElementsAre(0, 1, 2));
  // A retried push of an applied clock passes at once.
  EXPECT_THAT(t.WaitForTurn(2, 1, /*sequence=*/1, 1, absl::Now() + absl::Milliseconds(20)), IsOk());
}

// Deterministic BSP: a push refused before its turn (sequence 0, one past 2^62)
// changes nothing, not even the worker's incarnation (Lookup used to switch to the push's
// newer incarnation first, and Admit refused it after the wait).
TEST(WorkerTracker, APushRefusedBeforeItsTurnChangesNothing) {
  WorkerTracker t(Options(2, 0));
  ASSERT_EQ(*t.Admit(0, 5, 1), Admission::kApply);
  EXPECT_THAT(t.WaitForTurn(0, 6, /*sequence=*/0, 1, absl::Now() + absl::Seconds(5)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      t.WaitForTurn(0, 6, WorkerTracker::kMaxSequence + 1, 1, absl::Now() + absl::Seconds(5)),
      StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(t.Get(0)->incarnation(), 5u);
  EXPECT_EQ(*t.Admit(0, 5, 2), Admission::kApply);
  // A given-up sequence is refused before it waits (it waited for worker 1 until its deadline
  // before, then Admit refused it).
  for (uint64_t s = 4; s <= WorkerTracker::kMaxAbove + 4; ++s) {
    ASSERT_EQ(*t.Admit(0, 5, s), Admission::kApply);
  }
  EXPECT_THAT(t.WaitForTurn(0, 5, /*sequence=*/3, 1, absl::Now() + absl::Seconds(60)),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::HasSubstr("never applied")));
}

// A push waiting for its turn when the server stops is answered UNAVAILABLE then (the worker
// sends it again to the restarted server), not at its deadline: the drain waits for it.
TEST(WorkerTracker, APushWaitingForItsTurnEndsWhenTheServerStops) {
  WorkerTracker t(Options(2, 0));
  absl::Status waited;
  // Worker 0 has not pushed clock 1: worker 1 waits for it.
  std::thread push([&] { waited = t.WaitForTurn(1, 5, 1, 1, absl::Now() + absl::Seconds(300)); });
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (t.pushes_waiting_for_turn() == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(t.pushes_waiting_for_turn(), 1);  // the close below finds it waiting
  t.CloseWaiters(absl::UnavailableError("the server is stopping"));
  push.join();
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(t.pushes_waiting_for_turn(), 0);
  EXPECT_THAT(t.WaitForTurn(0, 5, 1, 1, absl::Now() + absl::Seconds(5)),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(WorkerTracker, TurnsSkipFinishedAndExpiredWorkers) {
  FakeClock clock;
  WorkerTracker t(Options(3, 0), clock.fn());
  for (int w = 0; w < 3; ++w) ASSERT_THAT(t.Touch(w, 1), IsOk());
  ASSERT_THAT(t.Finish(1, 1), IsOk());
  // Worker 2 is live and has not arrived: worker 0 waits for it.
  EXPECT_THAT(t.WaitForTurn(0, 1, /*sequence=*/1, 1, absl::Now() + absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::HasSubstr("worker 2")));
  clock.seconds += 31;  // worker 2's lease runs out (worker 0 was just heard from)
  EXPECT_THAT(t.WaitForTurn(0, 1, /*sequence=*/1, 1, absl::Now() + absl::Seconds(5)), IsOk());
  EXPECT_THAT(t.WaitForTurn(0, 0, /*sequence=*/1, 2, absl::Now() + absl::Seconds(5)),
              StatusIs(absl::StatusCode::kFailedPrecondition));  // an older incarnation
}

TEST(WorkerTracker, ExpiredLeaseAndFinishedWorkersLeaveTheBound) {
  FakeClock clock;
  WorkerTracker t(Options(3, 0), clock.fn());
  for (int w = 0; w < 3; ++w) ASSERT_THAT(t.Touch(w, 1), IsOk());
  t.AdvanceClock(0, 1, 5);
  // Worker 1 finished; worker 2 goes silent past its lease.
  ASSERT_THAT(t.Finish(1, 1), IsOk());
  EXPECT_THAT(t.WaitForBound(0, 5, absl::Now() + absl::Milliseconds(10)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(t.Poke().empty());
  clock.seconds += 31;
  t.AdvanceClock(0, 1, 5);                           // worker 0 is alive
  EXPECT_THAT(t.Poke(), ::testing::ElementsAre(2));  // reported once
  EXPECT_TRUE(t.Poke().empty());
  EXPECT_THAT(t.WaitForBound(0, 5, absl::Now() + absl::Seconds(5)), IsOk());
  std::vector<WorkerClock> stats;
  t.FillStats(&stats);
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_TRUE(stats[0].live());
  EXPECT_FALSE(stats[1].live());
  EXPECT_FALSE(stats[2].live());
  // Heard from again: back in the bound.
  ASSERT_THAT(t.Touch(2, 1), IsOk());
  EXPECT_THAT(t.WaitForBound(0, 5, absl::Now() + absl::Milliseconds(10)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(WorkerTracker, AllFinishedOnlyWhenEveryWorkerFinished) {
  WorkerTracker t(Options(2, std::nullopt));
  EXPECT_FALSE(t.AllFinished());
  ASSERT_THAT(t.Touch(0, 1), IsOk());
  ASSERT_THAT(t.Finish(0, 1), IsOk());
  EXPECT_FALSE(t.AllFinished());  // worker 1 never showed up
  ASSERT_THAT(t.Touch(1, 1), IsOk());
  EXPECT_FALSE(t.AllFinished());
  ASSERT_THAT(t.Finish(1, 1), IsOk());
  EXPECT_TRUE(t.AllFinished());
  ASSERT_THAT(t.Touch(1, 2), IsOk());  // a restarted worker 1 is back
  EXPECT_FALSE(t.AllFinished());
}

// A call of a finished process served after its Finish (a retried push that waited on the
// pool, a last heartbeat) leaves it finished: it put the worker back in the bound, where it
// held BSP/SSP pulls for a lease and kept an --exit_when_done server up for good.
TEST(WorkerTracker, ALateCallOfAFinishedWorkerLeavesItFinished) {
  WorkerTracker t(Options(2, 0));
  ASSERT_THAT(t.Touch(0, 1), IsOk());
  ASSERT_THAT(t.Touch(1, 1), IsOk());
  ASSERT_EQ(*t.Admit(1, 1, 1), Admission::kApply);
  ASSERT_THAT(t.Finish(0, 1), IsOk());
  ASSERT_THAT(t.Finish(1, 1), IsOk());
  ASSERT_TRUE(t.AllFinished());
  EXPECT_EQ(*t.Admit(1, 1, 1), Admission::kDuplicate);
  EXPECT_EQ(*t.Admit(1, 1, 2), Admission::kApply);
  ASSERT_THAT(t.Touch(1, 1), IsOk());
  ASSERT_THAT(t.Touch(0, 1, 3), IsOk());
  EXPECT_TRUE(t.AllFinished());
  // Out of the bound: worker 0's pull at clock 5 waits for no one.
  EXPECT_THAT(t.WaitForBound(0, 5, absl::Now() + absl::Milliseconds(10)), IsOk());
}

// A late heartbeat of a replaced process does not move its successor's data position (it did
// before 2026-12-05: the position was set after the incarnation check, without one).
TEST(WorkerTracker, OnlyTheCurrentIncarnationSetsTheDataPosition) {
  WorkerTracker t(Options(2, std::nullopt));
  ASSERT_TRUE(t.Touch(0, 1).ok());
  ASSERT_TRUE(t.SetDataPosition(0, 1, 100, 1));
  ASSERT_TRUE(t.Touch(0, 2).ok());
  ASSERT_TRUE(t.SetDataPosition(0, 2, 300, 2));
  EXPECT_FALSE(t.SetDataPosition(0, 1, 200, 1));  // the old process, late
  EXPECT_FALSE(t.SetDataPosition(1, 1, 50, 1));   // a worker never heard from
  const auto position = t.PositionOf(0);
  ASSERT_TRUE(position.has_value());
  EXPECT_EQ(position->incarnation, 2u);
  EXPECT_EQ(position->data_offset, 300u);
  EXPECT_EQ(position->epoch, 2u);
  EXPECT_FALSE(t.PositionOf(1).has_value());
}

TEST(WorkerTracker, SaveAndRestoreKeepExactlyOnceState) {
  WorkerTracker t(Options(2, std::nullopt));
  ASSERT_EQ(*t.Admit(0, 9, 1), Admission::kApply);
  ASSERT_EQ(*t.Admit(0, 9, 2), Admission::kApply);
  ASSERT_EQ(*t.Admit(0, 9, 5), Admission::kApply);
  t.AdvanceClock(0, 9, 4);
  ASSERT_TRUE(t.SetDataPosition(0, 9, 640, 2));
  WorkerTracker restored(Options(2, std::nullopt));
  restored.Restore(t.Save());
  EXPECT_EQ(*restored.Admit(0, 9, 2), Admission::kDuplicate);
  EXPECT_EQ(*restored.Admit(0, 9, 5), Admission::kDuplicate);
  EXPECT_EQ(*restored.Admit(0, 9, 3), Admission::kApply);
  auto saved = restored.Get(0);
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(saved->clock(), 4);
  EXPECT_EQ(saved->data_offset(), 640u);
  EXPECT_EQ(saved->epoch(), 2u);
}

// ---- Forged headers: each of these locked out or fooled the server before they were
// validated.

TEST(WorkerTracker, IncarnationFarAheadOfTheClockIsRefusedAndLocksNobodyOut) {
  FakeClock clock;
  WorkerTracker t(Options(2, std::nullopt), clock.fn());
  const uint64_t now_ns = uint64_t{1000} * 1000000000;
  EXPECT_THAT(t.Admit(1, UINT64_MAX, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("ahead")));
  EXPECT_THAT(t.Touch(1, UINT64_MAX), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(t.Finish(1, UINT64_MAX), StatusIs(absl::StatusCode::kInvalidArgument));
  // The real worker 1, started now, is still welcome.
  EXPECT_EQ(*t.Admit(1, now_ns, 1), Admission::kApply);
  // An incarnation within the tolerated clock skew is a normal restart.
  EXPECT_EQ(*t.Admit(1, now_ns + 60 * uint64_t{1000000000}, 1), Admission::kApply);
}

TEST(WorkerTracker, ForgedIncarnationInACheckpointDoesNotSurviveTheRestore) {
  // A checkpoint written before incarnations were validated holds worker 1 at 2^64-1.
  WorkerCheckpoint forged;
  forged.set_worker_id(1);
  forged.set_incarnation(UINT64_MAX);
  forged.set_clock(7);
  forged.set_applied_floor(UINT64_MAX - 1);
  forged.set_data_offset(64);
  FakeClock clock;
  WorkerTracker t(Options(2, std::nullopt), clock.fn());
  t.Restore({forged});
  // The real worker's pushes are applied, and where it was is kept.
  EXPECT_EQ(*t.Admit(1, 5, 1), Admission::kApply);
  auto saved = t.Get(1);
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(saved->incarnation(), 5u);
  EXPECT_EQ(saved->clock(), 7);
  EXPECT_EQ(saved->data_offset(), 64u);
}

TEST(WorkerTracker, AClockSetBackKeepsARestoredWorkersExactlyOnceState) {
  // Worker 1 started at the checkpoint's time; the server restarts with its clock 3 h behind
  // (set back, or another host's): more than the incarnation lead of 1 h.
  FakeClock clock;
  clock.seconds = 20000;
  const uint64_t incarnation = uint64_t{20000} * 1000000000;
  WorkerTracker t(Options(2, std::nullopt), clock.fn());
  ASSERT_EQ(*t.Admit(1, incarnation, 1), Admission::kApply);
  ASSERT_EQ(*t.Admit(1, incarnation, 2), Admission::kApply);
  ASSERT_TRUE(t.SetDataPosition(1, incarnation, 96, 1));
  const std::vector<WorkerCheckpoint> saved = t.Save();
  FakeClock behind;
  behind.seconds = 20000 - 3 * 3600;
  WorkerTracker restored(Options(2, std::nullopt), behind.fn());
  restored.Restore(saved, absl::FromUnixSeconds(20000));
  // A retry of an applied push is still a duplicate, and the worker is still welcome.
  EXPECT_EQ(*restored.Admit(1, incarnation, 2), Admission::kDuplicate);
  EXPECT_EQ(*restored.Admit(1, incarnation, 3), Admission::kApply);
  EXPECT_THAT(restored.CheckIncarnation(1, incarnation), IsOk());
  auto position = restored.PositionOf(1);
  ASSERT_TRUE(position.has_value());
  EXPECT_EQ(position->incarnation, incarnation);
  EXPECT_EQ(position->data_offset, 96u);
  // Incarnations beyond both clocks' lead are still refused.
  EXPECT_THAT(restored.Admit(0, incarnation + uint64_t{2} * 3600 * 1000000000, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A checkpoint's own clock does not vouch for an incarnation that led it by more.
  WorkerCheckpoint forged = saved[0];
  forged.set_incarnation(incarnation + uint64_t{2} * 3600 * 1000000000);
  WorkerTracker again(Options(2, std::nullopt), behind.fn());
  again.Restore({forged}, absl::FromUnixSeconds(20000));
  EXPECT_EQ(again.PositionOf(1)->incarnation, 0u);
  EXPECT_EQ(again.PositionOf(1)->data_offset, 96u);
}

TEST(WorkerTracker, HugeSequencesCannotMakeTheNextRealPushADuplicate) {
  WorkerTracker t(Options(1, std::nullopt));
  ASSERT_EQ(*t.Admit(0, 3, 1), Admission::kApply);
  for (uint64_t i = 0; i <= WorkerTracker::kMaxAbove; ++i) {
    EXPECT_THAT(t.Admit(0, 3, (uint64_t{1} << 62) + i).status(),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_EQ(*t.Admit(0, 3, 2), Admission::kApply);
  // Gaps within the window are honest (pushes that had nothing for this server).
  EXPECT_EQ(*t.Admit(0, 3, 2 + WorkerTracker::kSequenceWindow), Admission::kApply);
}

// Found 2026-12-05 by a review: a server restarted without its state (no checkpoint, or a
// data dir lost with its pod) refused for good every push of a worker more than 2^24 pushes
// into its run, so a long job failed once it had pushed that much to the restarted server.
TEST(WorkerTracker, AServerWithNoRecordOfAWorkerTakesItFarIntoItsRun) {
  WorkerTracker t(Options(1, std::nullopt));
  constexpr uint64_t kFar = uint64_t{30} << 20;  // 31.5M pushes in
  EXPECT_EQ(*t.Admit(0, 3, kFar), Admission::kApply);
  // A push sent before it and still in flight, and the next ones, are each applied once.
  EXPECT_EQ(*t.Admit(0, 3, kFar - 1), Admission::kApply);
  EXPECT_EQ(*t.Admit(0, 3, kFar + 1), Admission::kApply);
  EXPECT_EQ(*t.Admit(0, 3, kFar), Admission::kDuplicate);
  EXPECT_EQ(*t.Admit(0, 3, kFar - 1), Admission::kDuplicate);
  // From that record on, the window holds.
  EXPECT_THAT(t.Admit(0, 3, kFar + 2 + WorkerTracker::kSequenceWindow).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ahead of the highest")));
  // Nothing past 2^62, with a record or without.
  WorkerTracker fresh(Options(1, std::nullopt));
  EXPECT_THAT(fresh.Admit(0, 3, WorkerTracker::kMaxSequence + 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("past 2^62")));
  EXPECT_EQ(*fresh.Admit(0, 3, WorkerTracker::kMaxSequence), Admission::kApply);
  EXPECT_THAT(fresh.Admit(0, 3, WorkerTracker::kMaxSequence + 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("past 2^62")));
}

// Found 2026-12-05 by a review: the rule above held only while the server had no record at
// all, but the worker's heartbeats and pulls, or its push waiting for its turn, make one
// before its first push is applied, and a restore brings back one that may be more than the
// window behind the worker. Each refused that push, and every later one, for good.
constexpr uint64_t kFar = uint64_t{30} << 20;  // 31.5M pushes in
constexpr uint64_t kPastWindow = kFar + 1 + WorkerTracker::kSequenceWindow;

TEST(WorkerTracker, AHeartbeatOrPullBeforeTheFirstPushLeavesItFree) {
  WorkerTracker t(Options(1, std::nullopt));
  ASSERT_THAT(t.Touch(0, 3), IsOk());
  ASSERT_OK_AND_ASSIGN(const Admission first, t.Admit(0, 3, kFar));
  EXPECT_EQ(first, Admission::kApply);
  EXPECT_EQ(*t.Admit(0, 3, kFar - 1), Admission::kApply);
  EXPECT_EQ(*t.Admit(0, 3, kFar), Admission::kDuplicate);
  EXPECT_THAT(t.Admit(0, 3, kPastWindow).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ahead of the highest")));
}

TEST(WorkerTracker, ADeterministicPushFarIntoTheRunWaitsForItsTurnAndIsApplied) {
  WorkerTracker t(Options(1, 0));
  ASSERT_THAT(t.WaitForTurn(0, 3, kFar, 1, absl::Now() + absl::Seconds(30)), IsOk());
  ASSERT_OK_AND_ASSIGN(const Admission first, t.Admit(0, 3, kFar));
  EXPECT_EQ(first, Admission::kApply);
  EXPECT_THAT(t.WaitForTurn(0, 3, kPastWindow, 2, absl::Now() + absl::Seconds(30)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ahead of the highest")));
}

// Restored from a checkpoint taken 5 pushes in; the worker went on without this server.
TEST(WorkerTracker, TheFirstPushAfterARestoreMayComeFarBeyondTheCheckpoint) {
  WorkerTracker t(Options(1, std::nullopt));
  for (uint64_t s = 1; s <= 5; ++s) ASSERT_EQ(*t.Admit(0, 3, s), Admission::kApply);
  WorkerTracker restored(Options(1, std::nullopt));
  restored.Restore(t.Save());
  EXPECT_EQ(*restored.Admit(0, 3, 5), Admission::kDuplicate);
  EXPECT_THAT(restored.Admit(0, 3, WorkerTracker::kMaxSequence + 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("past 2^62")));
  ASSERT_OK_AND_ASSIGN(const Admission first, restored.Admit(0, 3, kFar));
  EXPECT_EQ(first, Admission::kApply);
  EXPECT_EQ(*restored.Admit(0, 3, 4), Admission::kDuplicate);
  // A push sent after the checkpoint and before kFar, still in flight, is applied once.
  EXPECT_EQ(*restored.Admit(0, 3, 6), Admission::kApply);
  EXPECT_EQ(*restored.Admit(0, 3, 6), Admission::kDuplicate);
  EXPECT_THAT(restored.Admit(0, 3, kPastWindow).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ahead of the highest")));
}

// Found by fuzz/pull_push_fuzzer (UBSan): newest + lead overflowed for a pushed clock near
// INT64_MAX.
TEST(WorkerTracker, PullClockCheckSurvivesTheLargestClocks) {
  WorkerTracker t(Options(1, 0));
  ASSERT_EQ(*t.Admit(0, 3, 1), Admission::kApply);
  t.AdvanceClock(0, 3, std::numeric_limits<int64_t>::max());
  EXPECT_THAT(t.CheckPullClock(0, std::numeric_limits<int64_t>::max()), IsOk());
  EXPECT_THAT(t.CheckPullClock(0, 5), IsOk());
}

// Found by fuzz/pull_push_fuzzer: the window was checked after the worker's new incarnation
// had been recorded, so a refused push replaced the incarnation.
TEST(WorkerTracker, APushRefusedForItsSequenceChangesNothing) {
  WorkerTracker t(Options(1, std::nullopt));
  ASSERT_EQ(*t.Admit(0, 3, 1), Admission::kApply);
  EXPECT_THAT(t.Admit(0, 4, WorkerTracker::kMaxSequence + 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Incarnation 3 is still the worker's: its next push applies, and 4 starts afresh later.
  EXPECT_EQ(*t.Admit(0, 3, 2), Admission::kApply);
  EXPECT_EQ(*t.Admit(0, 3, 2), Admission::kDuplicate);
  EXPECT_EQ(*t.Admit(0, 4, 1), Admission::kApply);
}

// What a shard checks before it makes a push's rows: Admit's refusals, with Admit's codes,
// and nothing recorded (a new incarnation it lets through is not the worker's yet).
TEST(WorkerTracker, CheckAdmissionRefusesWhatAdmitRefusesAndRecordsNothing) {
  WorkerTracker t(Options(1, std::nullopt));
  ASSERT_EQ(*t.Admit(0, 3, 1), Admission::kApply);
  struct Push {
    uint64_t incarnation, sequence;
  };
  for (const Push& p :
       {Push{3, 0}, Push{3, WorkerTracker::kMaxSequence + 1},
        Push{3, 2 + WorkerTracker::kSequenceWindow}, Push{UINT64_MAX, 1}, Push{2, 1}}) {
    SCOPED_TRACE(absl::StrCat("incarnation ", p.incarnation, " sequence ", p.sequence));
    const absl::Status checked = t.CheckAdmission(0, p.incarnation, p.sequence);
    EXPECT_FALSE(checked.ok());
    EXPECT_EQ(checked, t.Admit(0, p.incarnation, p.sequence).status());
  }
  EXPECT_THAT(t.CheckAdmission(0, 3, 1), IsOk());   // a duplicate
  EXPECT_THAT(t.CheckAdmission(0, 4, 1), IsOk());   // a new incarnation...
  EXPECT_EQ(*t.Admit(0, 3, 2), Admission::kApply);  // ...not recorded: 3 is still current
}

TEST(WorkerTracker, OnlyTheCurrentIncarnationFinishesAWorker) {
  WorkerTracker t(Options(2, std::nullopt));
  ASSERT_THAT(t.Touch(0, 5), IsOk());
  ASSERT_THAT(t.Touch(1, 5), IsOk());
  // A finish that would register a new incarnation, or come from an old one, is refused.
  EXPECT_THAT(t.Finish(1, 6), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(t.Finish(1, 4), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(t.Finish(2, 5), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(t.Finish(-1, 5), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(t.Finish(0, 5), IsOk());
  EXPECT_FALSE(t.AllFinished());
  ASSERT_THAT(t.Finish(1, 5), IsOk());
  EXPECT_TRUE(t.AllFinished());
}

TEST(WorkerTracker, PullClockNoPushCanReachIsRefusedAtOnce) {
  WorkerTracker t(Options(2, 0));
  ASSERT_THAT(t.Touch(0, 1), IsOk());
  t.AdvanceClock(0, 1, 3);
  // The next step's pull (issued while the push is in flight) is legitimate...
  EXPECT_THAT(t.CheckPullClock(1, 3 + WorkerTracker::kPullClockLead), IsOk());
  // ...one that needs clocks nobody has pushed is not.
  EXPECT_THAT(t.CheckPullClock(0, 1000000),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("pushed here is 3")));
  WorkerTracker ssp(Options(2, 4));
  EXPECT_THAT(ssp.CheckPullClock(0, 4 + WorkerTracker::kPullClockLead), IsOk());
  EXPECT_THAT(ssp.CheckPullClock(0, 5 + WorkerTracker::kPullClockLead),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Asynchronous pulls never wait, so never need refusing.
  WorkerTracker async(Options(2, std::nullopt));
  EXPECT_THAT(async.CheckPullClock(0, 1000000), IsOk());
}

}  // namespace
}  // namespace ps::server
