#include "bench/bench_load.h"

#include <atomic>
#include <deque>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::bench {
namespace {

LoadOptions Short(int threads) {
  LoadOptions o;
  o.threads = threads;
  o.warmup = absl::ZeroDuration();
  o.duration = absl::Milliseconds(20);
  return o;
}

TEST(RunLoad, CountsEveryMeasuredCallOfEveryThread) {
  std::atomic<int> calls{0};
  absl::StatusOr<LoadResult> r = RunLoad(
      Short(3), [&](int) { ++calls; return absl::OkStatus(); }, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  // Warm-up makes at least one call per thread that is not counted.
  EXPECT_EQ(r->calls + 3, static_cast<uint64_t>(calls.load()));
  EXPECT_EQ(r->latencies_ms.size(), r->calls);
  EXPECT_GT(r->calls_per_second, 0);
}

TEST(RunLoad, ReturnsTheFirstError) {
  absl::StatusOr<LoadResult> r = RunLoad(
      Short(2), [](int) { return absl::UnavailableError("server down"); }, nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
}

TEST(RunLoad, StopsWhenCancelled) {
  std::atomic<bool> cancel{true};
  absl::StatusOr<LoadResult> r =
      RunLoad(Short(1), [](int) { return absl::OkStatus(); }, &cancel);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
}

// Windowed calls that end in the order they started (one FIFO per thread), recording how
// many each thread had in flight at most and which slots were in flight twice.
struct FifoWindow {
  explicit FifoWindow(int threads) : in_flight(threads), most(threads, 0) {}
  WindowCalls Calls() {
    return WindowCalls{[this](int t, int slot) {
                         for (int s : in_flight[t]) {
                           if (s == slot) reused = true;
                         }
                         in_flight[t].push_back(slot);
                         most[t] = std::max<int>(most[t], in_flight[t].size());
                         return absl::OkStatus();
                       },
                       [this](int t) -> absl::StatusOr<int> {
                         const int slot = in_flight[t].front();
                         in_flight[t].pop_front();
                         ++reaped;
                         return slot;
                       }};
  }
  std::vector<std::deque<int>> in_flight;  // per thread; each thread touches only its own
  std::vector<int> most;
  std::atomic<bool> reused{false};
  std::atomic<uint64_t> reaped{0};
};

TEST(RunWindowLoad, KeepsTheWindowFullAndCountsMeasuredCalls) {
  FifoWindow w(2);
  absl::StatusOr<LoadResult> r = RunWindowLoad(Short(2), 4, w.Calls(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(w.most, ::testing::ElementsAre(4, 4));
  EXPECT_FALSE(w.reused) << "a slot was started while its call was in flight";
  for (const auto& q : w.in_flight) EXPECT_TRUE(q.empty()) << "calls left in flight";
  EXPECT_GT(r->calls, 0u);
  EXPECT_LT(r->calls, w.reaped.load());  // warm-up and drained calls are not counted
  EXPECT_EQ(r->latencies_ms.size(), r->calls);
}

TEST(RunWindowLoad, ReturnsTheFirstErrorAndDrains) {
  FifoWindow w(1);
  WindowCalls calls = w.Calls();
  const auto reap = calls.reap;
  calls.reap = [&](int t) -> absl::StatusOr<int> {
    absl::StatusOr<int> slot = reap(t);
    if (w.reaped > 10) return absl::UnavailableError("server down");
    return slot;
  };
  absl::StatusOr<LoadResult> r = RunWindowLoad(Short(1), 3, calls, nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(w.in_flight[0].empty());
}

TEST(LoadResult, PercentileIsNearestRank) {
  LoadResult r;
  for (int i = 1; i <= 100; ++i) r.latencies_ms.push_back(i);
  EXPECT_EQ(r.Percentile(0.5), 50);
  EXPECT_EQ(r.Percentile(0.99), 99);
  EXPECT_EQ(r.Percentile(1.0), 100);
  EXPECT_EQ(LoadResult().Percentile(0.5), 0);
}

}  // namespace
}  // namespace ps::bench
