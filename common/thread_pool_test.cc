#include "common/thread_pool.h"

#include <atomic>

#include "absl/synchronization/blocking_counter.h"
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
  // Both tasks must be running at once for either to finish.
  absl::BlockingCounter both_started(2);
  absl::BlockingCounter done(2);
  for (int i = 0; i < 2; ++i) {
    pool.Schedule([&] {
      both_started.DecrementCount();
      both_started.Wait();
      done.DecrementCount();
    });
  }
  done.Wait();
  SUCCEED();
}

}  // namespace
}  // namespace ps::common
