#include "worker/serial_executor.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SerialExecutor, RunsCallsInSubmissionOrder) {
  std::vector<int> order;  // written by the executor's one thread only
  SerialExecutor executor;
  uint64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    last = executor.Submit("call", [&order, i] {
      order.push_back(i);
      return absl::OkStatus();
    });
  }
  EXPECT_EQ(last, 5u);
  EXPECT_OK(executor.Wait(last));
  EXPECT_THAT(order, ElementsAre(0, 1, 2, 3, 4));
}

TEST(SerialExecutor, FirstErrorIsStickyAndLaterCallsAreSkipped) {
  std::atomic<int> ran{0};
  SerialExecutor executor;
  executor.Submit("step 1 push", [&] {
    ++ran;
    return absl::OkStatus();
  });
  const uint64_t failing = executor.Submit("step 2 push", [&] {
    ++ran;
    return absl::UnavailableError("server 1 down");
  });
  executor.Submit("step 3 pull", [&] {
    ++ran;
    return absl::OkStatus();
  });
  EXPECT_THAT(executor.Drain(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("step 2 push: server 1 down")));
  EXPECT_EQ(ran.load(), 2);
  // Waiting on an earlier, successful call returns the error too: the pipeline is broken.
  EXPECT_THAT(executor.Wait(1), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(executor.Wait(failing + 1), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(SerialExecutor, DestructorWaitsForTheRunningCall) {
  absl::Notification started, release;
  std::atomic<bool> finished{false};
  std::thread releaser;
  {
    SerialExecutor executor;
    executor.Submit("blocking", [&] {
      started.Notify();
      release.WaitForNotification();
      finished = true;
      return absl::OkStatus();
    });
    // Queued behind it; run or dropped depending on when the destructor begins, never after.
    executor.Submit("queued", [] { return absl::OkStatus(); });
    started.WaitForNotification();
    releaser = std::thread([&] { release.Notify(); });
  }
  EXPECT_TRUE(finished.load());
  releaser.join();
}

TEST(SerialExecutor, DrainWithNothingSubmittedIsOk) {
  SerialExecutor executor;
  EXPECT_OK(executor.Drain());
}

}  // namespace
}  // namespace ps::worker
