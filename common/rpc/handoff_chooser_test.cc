#include "common/rpc/handoff_chooser.h"

#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ps::common {
namespace {

// Runs `calls` calls through `chooser`, each costing what `cost` says for its way, and
// returns how many streamed.
// Tries the other way once in `n` calls, however much dearer it is found (`max` = n), or with
// the gap doubling up to `max`.
HandoffChooser::Options WithExploreEvery(uint32_t n, uint32_t max = 0) {
  HandoffChooser::Options o;
  o.explore_every = n;
  o.max_explore_every = max == 0 ? n : max;
  return o;
}

template <typename Cost>
int RunCalls(HandoffChooser& chooser, int calls, Cost cost) {
  int streamed = 0;
  for (int i = 0; i < calls; ++i) {
    const bool stream = chooser.Stream();
    streamed += stream;
    chooser.Record(stream, cost(stream));
  }
  return streamed;
}

TEST(HandoffChooserTest, TriesEachWayFirstStreamedFirst) {
  HandoffChooser chooser;
  EXPECT_TRUE(chooser.Stream());
  EXPECT_TRUE(chooser.Stream());  // nothing recorded yet: still untried
  chooser.Record(true, 5);
  EXPECT_FALSE(chooser.Stream());
  chooser.Record(false, 7);
  EXPECT_EQ(chooser.estimate(true), 5);
  EXPECT_EQ(chooser.estimate(false), 7);
}

TEST(HandoffChooserTest, UsesTheCheaperWayAndTriesTheOtherOnceInExploreEvery) {
  for (const bool streamed_is_cheaper : {true, false}) {
    HandoffChooser chooser(WithExploreEvery(16));
    const int streamed = RunCalls(chooser, 1600, [&](bool stream) {
      return stream == streamed_is_cheaper ? 1.0 : 3.0;
    });
    // Two first calls, then 1 in 16 the other way.
    const int other = streamed_is_cheaper ? 1600 - streamed : streamed;
    EXPECT_GE(other, 100) << streamed_is_cheaper;
    EXPECT_LE(other, 102) << streamed_is_cheaper;
  }
}

TEST(HandoffChooserTest, AWayFoundFarDearerAgainIsTriedLessOften) {
  HandoffChooser chooser(WithExploreEvery(16, 128));
  RunCalls(chooser, 2, [](bool stream) { return stream ? 3.0 : 1.0; });  // each way once
  // Plain in use; streamed tried after 16, 32, 64, then every 128 calls.
  std::vector<int> tries;
  for (int i = 0; i < 1000; ++i) {
    const bool stream = chooser.Stream();
    if (stream) tries.push_back(i);
    chooser.Record(stream, stream ? 3.0 : 1.0);
  }
  ASSERT_GE(tries.size(), 4u);
  EXPECT_EQ(tries[1] - tries[0], 32);
  EXPECT_EQ(tries[2] - tries[1], 64);
  for (size_t i = 3; i < tries.size(); ++i) EXPECT_EQ(tries[i] - tries[i - 1], 128) << i;
  // A try that finds it no longer far dearer brings the gap back to 16.
  const size_t before = tries.size();
  for (int i = 1000; i < 1300; ++i) {
    const bool stream = chooser.Stream();
    if (stream) tries.push_back(i);
    chooser.Record(stream, stream ? 1.05 : 1.0);  // within the margin of plain's 1.0
  }
  ASSERT_GE(tries.size(), before + 2);
  EXPECT_EQ(tries[before + 1] - tries[before], 16);
}

TEST(HandoffChooserTest, FollowsAChangeOfPlacement) {
  HandoffChooser chooser(WithExploreEvery(8, 64));
  RunCalls(chooser, 400, [](bool stream) { return stream ? 1.0 : 4.0; });
  ASSERT_LT(chooser.estimate(true), chooser.estimate(false));
  // Now plain is 4x cheaper: the next try (within 64 calls) finds it no longer dearer, the
  // tries come every 8 calls again, and within 5 of them the chooser moves to plain and stays.
  RunCalls(chooser, 64 + 5 * 8 + 8, [](bool stream) { return stream ? 4.0 : 1.0; });
  EXPECT_LT(chooser.estimate(false), chooser.estimate(true));
  const int streamed = RunCalls(chooser, 800, [](bool stream) { return stream ? 4.0 : 1.0; });
  EXPECT_GE(streamed, 800 / 64);  // only the tries, fewer as streamed stays dearer
  EXPECT_LE(streamed, 8 + 800 / 64);
}

// Runs `calls` calls through `chooser`, Recording the cost of the weighed ones only (as the
// worker does); returns how many were weighed, and adds the streamed ones to *streamed.
template <typename Cost>
int RunWeighedCalls(HandoffChooser& chooser, int calls, Cost cost, int* streamed) {
  int weighed = 0;
  for (int i = 0; i < calls; ++i) {
    bool weigh = false;
    const bool stream = chooser.Stream(&weigh);
    *streamed += stream;
    if (weigh) {
      ++weighed;
      chooser.Record(stream, cost(stream));
    }
  }
  return weighed;
}

// Only one call of the way in use in weigh_every is weighed once its window is full, and
// every try of the other: the chooser still uses the cheaper way and still follows a change
// of placement, from a fraction of the costs.
TEST(HandoffChooserTest, WeighsOneCallInWeighEveryOfTheWayInUseAndEveryTry) {
  HandoffChooser::Options o = WithExploreEvery(16);
  o.weigh_every = 4;
  HandoffChooser chooser(o);
  int streamed = 0;
  // Streamed cheaper: each way's first call, 9 weighed to fill streamed's window, then 1 in 4
  // of the streamed calls and the 1 in 16 tries of plain.
  int weighed = RunWeighedCalls(
      chooser, 1600, [](bool s) { return s ? 1.0 : 3.0; }, &streamed);
  const int tries = 1600 - streamed;
  EXPECT_GE(tries, 99);
  EXPECT_LE(tries, 101);
  const int expected = tries + 9 + (streamed - 9) / 4;
  EXPECT_GE(weighed, expected - 2);
  EXPECT_LE(weighed, expected + 2);
  // Plain cheaper now: found within a few tries, and then in use.
  streamed = 0;
  RunWeighedCalls(
      chooser, 16 * 12, [](bool s) { return s ? 3.0 : 1.0; }, &streamed);
  EXPECT_LT(chooser.estimate(false), chooser.estimate(true));
  streamed = 0;
  RunWeighedCalls(
      chooser, 1600, [](bool s) { return s ? 3.0 : 1.0; }, &streamed);
  EXPECT_LE(streamed, 101);
  // Each call weighed with weigh_every 1 (and out of range, 0).
  for (const uint32_t every : {1u, 0u}) {
    o.weigh_every = every;
    HandoffChooser all(o);
    streamed = 0;
    EXPECT_EQ(RunWeighedCalls(
                  all, 500, [](bool s) { return s ? 1.0 : 3.0; }, &streamed),
              500);
  }
}

TEST(HandoffChooserTest, KeepsItsWayWhileTheOtherIsCheaperByLessThanTheMargin) {
  HandoffChooser::Options o = WithExploreEvery(1000);
  o.window = 1;  // each estimate is the last cost
  HandoffChooser chooser(o);
  chooser.Record(true, 1.0);
  chooser.Record(false, 0.95);  // 5% cheaper: streamed stays in use
  EXPECT_TRUE(chooser.Stream());
  EXPECT_TRUE(chooser.Stream());
  chooser.Record(false, 0.85);  // 15% cheaper: plain now
  EXPECT_FALSE(chooser.Stream());
  chooser.Record(true, 0.8);  // streamed 6% cheaper than plain: plain stays
  EXPECT_FALSE(chooser.Stream());
}

TEST(HandoffChooserTest, AnEstimateIsTheMedianOfTheWindowsLastCosts) {
  HandoffChooser::Options o;
  o.window = 5;
  HandoffChooser chooser(o);
  for (double cost : {10.0, 11.0, 12.0}) chooser.Record(true, cost);
  EXPECT_EQ(chooser.estimate(true), 11);
  // Outliers either way move it by no more than to the next cost: a pull held by the
  // staleness bound, a call that found the bytes in a cache by chance.
  chooser.Record(true, 1e9);
  EXPECT_EQ(chooser.estimate(true), 12);
  chooser.Record(true, 1e-9);
  EXPECT_EQ(chooser.estimate(true), 11);
  // Only the last 5 count: 12, 1e9, 1e-9, 3, 3.
  chooser.Record(true, 3);
  chooser.Record(true, 3);
  EXPECT_EQ(chooser.estimate(true), 3);
  chooser.Record(false, 8);
  EXPECT_EQ(chooser.estimate(false), 8);  // each way its own costs
}

// The costs of a way in use that are mostly cheap but now and then far dearer (the other
// processes on its cores) never make it look dearer than a way that is always a third dearer,
// which a running average of them did.
TEST(HandoffChooserTest, RareDearCallsDoNotSwitchWays) {
  HandoffChooser chooser;
  uint32_t n = 0;
  const int streamed = RunCalls(chooser, 20000, [&n](bool stream) {
    if (stream) return 1.3;
    return ++n % 10 == 0 ? 4.0 : 1.0;  // one plain call in ten costs 4x
  });
  // One untried first call, then only the explorations: 1 in 32.
  EXPECT_LE(streamed, 20000 / 32 + 2);
}

TEST(HandoffChooserTest, IgnoresCostsThatAreNotPositive) {
  HandoffChooser chooser;
  chooser.Record(true, 0);
  chooser.Record(true, -3);
  chooser.Record(true, std::numeric_limits<double>::quiet_NaN());
  EXPECT_LT(chooser.estimate(true), 0);
  chooser.Record(true, 2);
  chooser.Record(true, std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(chooser.estimate(true), 2);
}

TEST(HandoffChooserTest, OptionsOutOfRangeAreReplaced) {
  // explore_every 0 or 1 would explore every call (or divide by zero): taken as 2.
  HandoffChooser::Options o = WithExploreEvery(0);  // max_explore_every 0 too: taken as 2
  o.window = 0;
  o.margin = -1;
  HandoffChooser chooser(o);
  chooser.Record(true, 1);
  chooser.Record(false, 2);
  int streamed = 0;
  for (int i = 0; i < 10; ++i) streamed += chooser.Stream();
  EXPECT_EQ(streamed, 5);
  // window 0 taken as the default 9: the median of the last 9.
  for (double cost : {5.0, 5.0, 5.0, 5.0, 7.0, 7.0, 7.0, 7.0}) chooser.Record(true, cost);
  EXPECT_EQ(chooser.estimate(true), 5);
  chooser.Record(true, 7);  // 1 drops out of the 9
  EXPECT_EQ(chooser.estimate(true), 7);
  o.window = HandoffChooser::kMaxWindow + 1;
  HandoffChooser too_wide(o);
  for (double cost : {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0}) {
    too_wide.Record(false, cost);
  }
  EXPECT_EQ(too_wide.estimate(false), 6);  // the median of 2..10
}

TEST(HandoffChooserTest, ACallCostsTheCpuOfBothSidesPerByteWhenTheServerSays) {
  // 30 us of copies here and 90 us on the server for 1 MB, however long the call took.
  EXPECT_DOUBLE_EQ(HandoffChooser::CallCost(30000, 90000, 900000, 1 << 20), 120000.0 / (1 << 20));
  // A server that does not say: the call's time.
  EXPECT_DOUBLE_EQ(HandoffChooser::CallCost(30000, 0, 900000, 1 << 20), 900000.0 / (1 << 20));
  // A server's word is capped, a clock that went back counts nothing, no bytes count as one.
  EXPECT_DOUBLE_EQ(HandoffChooser::CallCost(-5, ~uint64_t{0}, 1, 2),
                   static_cast<double>(HandoffChooser::kMaxServedNs) / 2);
  EXPECT_DOUBLE_EQ(HandoffChooser::CallCost(10, 20, 1, 0), 30);
}

TEST(HandoffChooserTest, ManyThreadsAtOnce) {
  HandoffChooser chooser;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] { RunCalls(chooser, 5000, [](bool s) { return s ? 1.0 : 2.0; }); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LT(chooser.estimate(true), chooser.estimate(false));
}

}  // namespace
}  // namespace ps::common
