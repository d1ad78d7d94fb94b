// The staleness knob end to end through the shard core: a fast and a deliberately slow
// worker train together; under SSP(k) the fast one is never more than k clocks ahead when
// its pull returns, under BSP never ahead, and asynchronous training never waits.
#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/status_matchers.h"
#include "gtest/gtest.h"
#include "server/in_process_store.h"
#include "server/shard.h"

namespace ps {
namespace {

using ::ps::common::IsOk;

struct Outcome {
  int64_t max_gap = 0;  // fast clock - slow clock (server's view) when the fast pull returned
  int64_t slow_done_when_fast_finished = 0;
  int64_t server_max_staleness = 0;
};

Outcome RunWorkers(std::optional<int> staleness, int steps, absl::Duration slow_step) {
  std::string text = R"pb(
    cluster { num_servers: 1 num_workers: 2 }
    tables { name: "w" kind: TABLE_KIND_DENSE shape: 4 optimizer { kind: SGD learning_rate: 0.1 } }
  )pb";
  if (staleness.has_value()) absl::StrAppend(&text, "training { staleness: ", *staleness, " }");
  auto config = common::ParseJobConfigText(text, "test");
  EXPECT_TRUE(config.ok()) << config.status();
  auto shard = *server::Shard::Create(*config, server::ShardOptions{});
  std::atomic<int64_t> done[2] = {0, 0};
  Outcome outcome;
  auto worker = [&](int id) {
    server::InProcessStoreOptions options;
    options.worker_id = id;
    options.worker_incarnation = 1;
    auto store = *server::InProcessParameterStore::Create({shard.get()}, options);
    std::vector<float> w(4), g(4, 1.0f);
    for (int c = 0; c < steps; ++c) {
      common::PullBatch pull;
      pull.dense.push_back({"w", absl::MakeSpan(w)});
      ASSERT_THAT(store->Pull(pull, {c}), IsOk());
      if (id == 0) {
        // The slow worker's clock as the server knows it: what the bound is computed from.
        auto slow_state = shard->workers().Get(1);
        const int64_t slow_clock = slow_state.has_value() ? slow_state->clock() : 0;
        outcome.max_gap = std::max<int64_t>(outcome.max_gap, c - slow_clock);
      }
      if (id == 1) absl::SleepFor(slow_step);  // the slow worker's "compute"
      common::PushBatch push;
      push.dense.push_back({"w", g});
      ASSERT_THAT(store->Push(push, {c + 1, false}), IsOk());
      done[id] = c + 1;
    }
    if (id == 0) {
      // The server's view again: the slow thread may not have stored done[1] yet.
      auto slow_state = shard->workers().Get(1);
      outcome.slow_done_when_fast_finished = slow_state.has_value() ? slow_state->clock() : 0;
    }
    ASSERT_THAT(store->Finish(), IsOk());
  };
  std::thread fast(worker, 0), slow(worker, 1);
  fast.join();
  slow.join();
  StatsResponse stats;
  shard->FillStats(&stats);
  outcome.server_max_staleness = stats.max_staleness_seen();
  return outcome;
}

TEST(Consistency, SspBoundHoldsAFastWorkerBack) {
  Outcome o = RunWorkers(1, 12, absl::Milliseconds(15));
  EXPECT_LE(o.max_gap, 1);
  EXPECT_EQ(o.max_gap, 1) << "SSP(1) should let the fast worker run one clock ahead";
  EXPECT_LE(o.server_max_staleness, 1);
  EXPECT_GE(o.slow_done_when_fast_finished, 12 - 2);
}

TEST(Consistency, BspKeepsWorkersInLockstep) {
  Outcome o = RunWorkers(0, 8, absl::Milliseconds(10));
  EXPECT_LE(o.max_gap, 0);
  EXPECT_EQ(o.server_max_staleness, 0);
}

TEST(Consistency, AsynchronousNeverWaits) {
  // The fast worker finishes all its steps while the slow one has done only a few.
  Outcome o = RunWorkers(std::nullopt, 12, absl::Milliseconds(100));
  EXPECT_GE(o.max_gap, 8);
  EXPECT_LE(o.slow_done_when_fast_finished, 4);
}

TEST(Consistency, DeadWorkerLeavesTheBspBoundWhenItsLeaseRunsOut) {
  auto config = common::ParseJobConfigText(R"pb(
    cluster { num_servers: 1 num_workers: 2 }
    tables { name: "w" kind: TABLE_KIND_DENSE shape: 4 optimizer { kind: SGD learning_rate: 0.1 } }
    training { staleness: 0 }
    server { worker_lease_s: 0.5 }
  )pb", "test");
  ASSERT_THAT(config.status(), IsOk());
  auto shard = *server::Shard::Create(*config, server::ShardOptions{});
  // The server's housekeeping: leases run out with time, so waiting pulls are re-checked.
  std::atomic<bool> done{false};
  std::thread poker([&] {
    while (!done) {
      shard->workers().Poke();
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  auto step = [&](server::InProcessParameterStore* store, int64_t c) {
    std::vector<float> w(4), g(4, 1.0f);
    common::PullBatch pull;
    pull.dense.push_back({"w", absl::MakeSpan(w)});
    absl::Status s = store->Pull(pull, {c});
    if (!s.ok()) return s;
    common::PushBatch push;
    push.dense.push_back({"w", g});
    return store->Push(push, {c + 1, false});
  };
  auto a = *server::InProcessParameterStore::Create({shard.get()}, {0, 1});
  auto b = *server::InProcessParameterStore::Create({shard.get()}, {1, 1});
  // Both train two steps in lockstep, then worker 1 dies without a word.
  for (int64_t c = 0; c < 2; ++c) {
    std::thread tb([&] { ASSERT_THAT(step(b.get(), c), IsOk()); });
    ASSERT_THAT(step(a.get(), c), IsOk());
    tb.join();
  }
  const absl::Time start = absl::Now();
  for (int64_t c = 2; c < 6; ++c) ASSERT_THAT(step(a.get(), c), IsOk());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400)) << "worker 0 did not wait for the lease";
  StatsResponse stats;
  shard->FillStats(&stats);
  ASSERT_EQ(stats.worker_clocks_size(), 2);
  EXPECT_FALSE(stats.worker_clocks(1).live());
  EXPECT_EQ(stats.worker_clocks(1).clock(), 2);
  done = true;
  poker.join();
}

}  // namespace
}  // namespace ps
