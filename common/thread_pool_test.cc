#include "common/thread_pool.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
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

}  // namespace
}  // namespace ps::common
