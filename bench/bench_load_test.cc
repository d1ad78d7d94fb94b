#include "bench/bench_load.h"

#include <atomic>

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
