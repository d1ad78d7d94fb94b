#include "common/rpc/handoff_chooser.h"

#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ps::common {
namespace {

// Runs `calls` calls through `chooser`, each costing what `cost` says for its way, and
// returns how many streamed.
HandoffChooser::Options WithExploreEvery(uint32_t n) {
  HandoffChooser::Options o;
  o.explore_every = n;
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

TEST(HandoffChooserTest, FollowsAChangeOfPlacement) {
  HandoffChooser chooser(WithExploreEvery(8));
  RunCalls(chooser, 400, [](bool stream) { return stream ? 1.0 : 4.0; });
  ASSERT_LT(chooser.estimate(true), chooser.estimate(false));
  // Now plain is 4x cheaper: within a few explorations the chooser moves to it and stays.
  RunCalls(chooser, 200, [](bool stream) { return stream ? 4.0 : 1.0; });
  EXPECT_LT(chooser.estimate(false), chooser.estimate(true));
  const int streamed = RunCalls(chooser, 800, [](bool stream) { return stream ? 4.0 : 1.0; });
  EXPECT_EQ(streamed, 100);  // only the explorations
}

TEST(HandoffChooserTest, KeepsItsWayWhileTheOtherIsCheaperByLessThanTheMargin) {
  HandoffChooser chooser(WithExploreEvery(1000));
  chooser.Record(true, 1.0);
  chooser.Record(false, 0.95);  // 5% cheaper: streamed stays in use
  EXPECT_TRUE(chooser.Stream());
  EXPECT_TRUE(chooser.Stream());
  chooser.Record(false, 0.3);  // plain's estimate 0.95 -> 0.7875, 21% below: plain now
  EXPECT_FALSE(chooser.Stream());
  chooser.Record(true, 0.8);  // streamed 1.0 -> 0.95, not 10% below 0.7875: plain stays
  EXPECT_FALSE(chooser.Stream());
}

TEST(HandoffChooserTest, OneOutlierMovesAnEstimateByAtMostItsWeightTimesThree) {
  HandoffChooser::Options o;
  o.weight = 0.5;
  HandoffChooser chooser(o);
  chooser.Record(true, 10);
  chooser.Record(true, 1e9);  // a pull held by the staleness bound
  EXPECT_DOUBLE_EQ(chooser.estimate(true), 10 + 0.5 * (40 - 10));
  chooser.Record(false, 8);
  chooser.Record(false, 1e-9);
  EXPECT_DOUBLE_EQ(chooser.estimate(false), 8 + 0.5 * (2 - 8));
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
  HandoffChooser::Options o = WithExploreEvery(0);
  o.weight = 7;
  o.margin = -1;
  HandoffChooser chooser(o);
  chooser.Record(true, 1);
  chooser.Record(false, 2);
  int streamed = 0;
  for (int i = 0; i < 10; ++i) streamed += chooser.Stream();
  EXPECT_EQ(streamed, 5);
  chooser.Record(true, 3);  // weight 7 taken as the default 0.25
  EXPECT_DOUBLE_EQ(chooser.estimate(true), 1 + 0.25 * (3 - 1));
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
