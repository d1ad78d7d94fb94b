#include "common/thread_pool.h"

#include <atomic>

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

}  // namespace
}  // namespace ps::common
