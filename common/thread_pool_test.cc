#include "common/thread_pool.h"

#include <time.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

TEST(ThreadPool, RunsEveryTask) {
  std::atomic<int> sum{0};
  {
    ThreadPool pool(3);
    for (int i = 1; i <= 100; ++i) pool.Schedule([&sum, i] { sum += i; });
  }  // the destructor drains the queue
  EXPECT_EQ(sum.load(), 5050);
}

TEST(ThreadPool, RunsTasksConcurrently) {
  ThreadPool pool(2);
  // Each task waits for the other to start: with one thread this would never finish.
  absl::Notification started[2];
  absl::BlockingCounter done(2);
  for (int i = 0; i < 2; ++i) {
    pool.Schedule([&, i] {
      started[i].Notify();
      started[1 - i].WaitForNotification();
      done.DecrementCount();
    });
  }
  done.Wait();
  EXPECT_TRUE(started[0].HasBeenNotified() && started[1].HasBeenNotified());
}

TEST(ThreadPool, ParallelForRunsEveryUnitOnce) {
  ThreadPool pool(3);
  for (size_t units : {size_t{0}, size_t{1}, size_t{2}, size_t{1000}}) {
    std::vector<std::atomic<int>> runs(units);
    pool.ParallelFor(units, 3, [&runs](size_t i) { runs[i].fetch_add(1); });
    for (size_t i = 0; i < units; ++i) EXPECT_EQ(runs[i].load(), 1) << i << " of " << units;
  }
}

TEST(ThreadPool, ParallelForUsesTheHelpers) {
  ThreadPool pool(1);
  // Unit 0 waits until unit 1 has run: the caller and the helper must hold one each.
  absl::Notification second;
  std::atomic<int> ran{0};
  pool.ParallelFor(2, 1, [&](size_t i) {
    if (i == 0) {
      second.WaitForNotification();
    } else {
      second.Notify();
    }
    ran.fetch_add(1);
  });
  EXPECT_EQ(ran.load(), 2);
}

TEST(ThreadPool, ParallelForDoesNotWaitForAHelperThatNeverStarted) {
  ThreadPool pool(1);
  // The only helper is busy until after ParallelFor returns: the caller runs every unit.
  absl::Notification release;
  pool.Schedule([&release] { release.WaitForNotification(); });
  int ran = 0;  // only this thread runs units
  pool.ParallelFor(10, 1, [&ran](size_t) { ++ran; });
  EXPECT_EQ(ran, 10);
  release.Notify();
}

TEST(ThreadPool, SpinningThreadsTakeTasksWithoutSleeping) {
  // Threads that watch for 10 s (whatever else wants the cores) never sleep in between:
  // every task is taken while watching. Threads that do not watch take none that way.
  for (absl::Duration spin : {absl::Seconds(10), absl::ZeroDuration()}) {
    ThreadPool pool(2, ThreadPool::Spin{2, spin, /*back_off=*/false});
    for (int i = 0; i < 10; ++i) {
      absl::Notification ran;
      pool.Schedule([&ran] { ran.Notify(); });
      ran.WaitForNotification();
    }
    EXPECT_EQ(pool.tasks_taken_spinning(), spin > absl::ZeroDuration() ? 10u : 0u);
  }
}

TEST(ThreadPool, WatchingThreadsJoinParallelForsWithoutQueuedTasks) {
  // Unit 0 waits for unit 1: every round needs a helper. Once the helper watches (10 s, so
  // it never sleeps), it joins through the slot and no task is queued for it.
  ThreadPool pool(1, ThreadPool::Spin{1, absl::Seconds(10), /*back_off=*/false});
  auto round = [&pool] {
    absl::Notification second;
    pool.ParallelFor(2, 1, [&](size_t i) {
      if (i == 0) {
        second.WaitForNotification();
      } else {
        second.Notify();
      }
    });
  };
  round();  // the helper has started (by a queued task or the slot) ...
  while (pool.threads_watching() != 1) std::this_thread::yield();  // ... and watches again
  const uint64_t joined = pool.parallel_fors_joined(), taken = pool.tasks_taken_spinning();
  for (int i = 0; i < 20; ++i) round();
  EXPECT_EQ(pool.parallel_fors_joined(), joined + 20);
  EXPECT_EQ(pool.tasks_taken_spinning(), taken);
}

// CPU time this thread has run.
absl::Duration ThreadCpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}

// A helper that joined through the slot and then waits long inside its unit (as behind a
// block's lock a pull holds): the caller, done with its own units, watches for it only as
// long as the pool's spin, then sleeps. Before, it yielded in a loop until the helper was out
// (all 500 ms of it on a core).
TEST(ThreadPool, ACallerWaitingForAJoinedHelpersLongUnitSleepsAfterItsSpin) {
  ThreadPool pool(1, ThreadPool::Spin{1, absl::Milliseconds(50), /*back_off=*/false});
  pool.ParallelFor(2, 1, [](size_t) {});  // the helper has started ...
  const uint64_t joined = pool.parallel_fors_joined();
  for (int attempt = 0; attempt < 20 && pool.parallel_fors_joined() == joined; ++attempt) {
    while (pool.threads_watching() != 1) std::this_thread::yield();  // ... and watches
    const std::thread::id caller = std::this_thread::get_id();
    absl::Notification helper_in;
    absl::Duration waited_from;
    const absl::Time start = absl::Now();
    pool.ParallelFor(2, 1, [&](size_t) {
      if (std::this_thread::get_id() != caller) {
        helper_in.Notify();
        absl::SleepFor(absl::Milliseconds(500));
        return;
      }
      // The caller's unit ends once the helper has the other one.
      helper_in.WaitForNotificationWithTimeout(absl::Seconds(5));
      waited_from = ThreadCpu();
    });
    if (pool.parallel_fors_joined() == joined) continue;  // the helper slept: try again
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(450));
    EXPECT_LT(ThreadCpu() - waited_from, absl::Milliseconds(250));
  }
  EXPECT_EQ(pool.parallel_fors_joined(), joined + 1);
}

TEST(ThreadPool, ParallelForWithSpinningThreadsRunsEveryUnitOnce) {
  // Some threads watch, one sleeps; the caller watches for the helpers' last units.
  ThreadPool pool(3, ThreadPool::Spin{2, absl::Milliseconds(50)});
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> runs(64);
    pool.ParallelFor(runs.size(), 3, [&runs](size_t i) { runs[i].fetch_add(1); });
    for (size_t i = 0; i < runs.size(); ++i) ASSERT_EQ(runs[i].load(), 1) << i;
  }
}

}  // namespace
}  // namespace ps::common
