#include "common/rpc/busy_poll.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/alarm.h"
#include "grpcpp/completion_queue.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

void Drain(grpc::CompletionQueue* cq) {
  cq->Shutdown();
  void* tag;
  bool ok;
  while (cq->Next(&tag, &ok)) {
  }
}

// An alarm on `cq` that goes off after `d`, with `tag`.
struct Event {
  Event(grpc::CompletionQueue* cq, absl::Duration d, void* tag) { alarm.Set(cq, In(d), tag); }
  grpc::Alarm alarm;
};

TEST(BusyPollerTest, AnEventThatComesWhilePollingIsTakenWithoutSleeping) {
  grpc::CompletionQueue cq;
  int mine = 0;
  Event e(&cq, absl::Milliseconds(20), &mine);
  BusyPoller poller(absl::Seconds(60));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(poller.Next(&cq, &tag, &ok));
  EXPECT_EQ(tag, &mine);
  EXPECT_TRUE(ok);
  EXPECT_EQ(poller.stats().events_polled, 1u);
  EXPECT_EQ(poller.stats().waits_blocked, 0u);
  EXPECT_GT(poller.stats().polls, 1u);  // it polled again and again until the alarm went off
  Drain(&cq);
}

TEST(BusyPollerTest, AfterTheSpinItSleepsUntilTheEventComes) {
  grpc::CompletionQueue cq;
  int mine = 0;
  Event e(&cq, absl::Seconds(1), &mine);
  BusyPoller poller(absl::Milliseconds(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(poller.Next(&cq, &tag, &ok));
  EXPECT_EQ(tag, &mine);
  EXPECT_TRUE(ok);
  EXPECT_EQ(poller.stats().events_polled, 0u);
  EXPECT_EQ(poller.stats().waits_blocked, 1u);
  EXPECT_GE(poller.stats().polls, 1u);
  Drain(&cq);
}

// Poll: any condition (a shared-memory channel's bell), the same spin and accounting.
TEST(BusyPollerTest, PollReturnsOnceTheConditionHoldsOrTellsTheCallerToSleep) {
  BusyPoller poller(absl::Seconds(60));
  int calls = 0;
  EXPECT_TRUE(poller.Poll([&] { return ++calls == 5; }));
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(poller.stats().events_polled, 1u);
  EXPECT_EQ(poller.stats().polls, 5u);
  BusyPoller brief(absl::Milliseconds(1));
  EXPECT_FALSE(brief.Poll([] { return false; }));  // the spin ran out: the caller sleeps
  EXPECT_EQ(brief.stats().waits_blocked, 1u);
  EXPECT_GE(brief.stats().polls, 1u);
  BusyPoller off(absl::ZeroDuration());
  EXPECT_FALSE(off.Poll([] { return true; }));  // no spin: not even one look
  EXPECT_EQ(off.stats().polls, 0u);
}

TEST(BusyPollerTest, NoSpinIsThePlainBlockingNext) {
  grpc::CompletionQueue cq;
  int mine = 0;
  Event e(&cq, absl::Milliseconds(10), &mine);
  BusyPoller poller(absl::ZeroDuration());
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(poller.Next(&cq, &tag, &ok));
  EXPECT_EQ(tag, &mine);
  EXPECT_EQ(poller.stats().polls, 0u);
  EXPECT_EQ(poller.stats().waits_blocked, 1u);
  Drain(&cq);
}

TEST(BusyPollerTest, ACancelledAlarmComesOutNotOk) {
  grpc::CompletionQueue cq;
  grpc::Alarm alarm;
  int mine = 0;
  alarm.Set(&cq, In(absl::Hours(1)), &mine);
  alarm.Cancel();
  BusyPoller poller(absl::Seconds(60));
  void* tag = nullptr;
  bool ok = true;
  ASSERT_TRUE(poller.Next(&cq, &tag, &ok));
  EXPECT_EQ(tag, &mine);
  EXPECT_FALSE(ok);
  Drain(&cq);
}

TEST(BusyPollerTest, AShutDownQueueEndsTheWaitWhetherPollingOrSleeping) {
  for (absl::Duration spin : {absl::Seconds(60), absl::ZeroDuration()}) {
    grpc::CompletionQueue cq;
    cq.Shutdown();
    BusyPoller poller(spin);
    void* tag = nullptr;
    bool ok = false;
    EXPECT_FALSE(poller.Next(&cq, &tag, &ok)) << spin;
  }
}

void PinToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(set), &set), 0);
}

// CPU time of the calling thread.
absl::Duration ThreadCpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}

// Pins the calling thread to its current CPU and keeps a thread busy on the same CPU for its
// lifetime.
class CoreHog {
 public:
  CoreHog() : cpu_(std::max(0, sched_getcpu())) {
    PinToCpu(cpu_);
    burner_ = std::thread([this] {
      PinToCpu(cpu_);
      while (!stop_.load(std::memory_order_relaxed)) {
      }
    });
  }
  ~CoreHog() {
    stop_ = true;
    burner_.join();
  }

 private:
  const int cpu_;
  std::atomic<bool> stop_{false};
  std::thread burner_;
};

// With another busy thread on its core, the poller's yields hand the core over, it runs
// for less than half of its polling time; when the spin runs out without its event, it
// sleeps at once for its next waits.
TEST(BusyPollerTest, ItStopsPollingWhenAnotherThreadWantsItsCore) {
  CoreHog hog;
  grpc::CompletionQueue cq;
  BusyPoller poller(absl::Milliseconds(50));
  int tags[3];
  void* tag = nullptr;
  bool ok = false;
  {
    Event e(&cq, absl::Milliseconds(200), &tags[0]);
    ASSERT_TRUE(poller.Next(&cq, &tag, &ok));
    EXPECT_EQ(tag, &tags[0]);
  }
  EXPECT_EQ(poller.stats().contended_spins, 1u);
  EXPECT_TRUE(poller.last_spin_contended());
  EXPECT_EQ(poller.stats().cheap_contended_spins, 0u);
  EXPECT_EQ(poller.stats().events_polled, 0u);
  EXPECT_EQ(poller.stats().waits_blocked, 1u);
  // The next waits sleep at once: no polls.
  const uint64_t polls = poller.stats().polls;
  for (int i = 1; i < 3; ++i) {
    Event e(&cq, absl::Milliseconds(5), &tags[i]);
    ASSERT_TRUE(poller.Next(&cq, &tag, &ok));
    EXPECT_EQ(tag, &tags[i]);
  }
  EXPECT_EQ(poller.stats().polls, polls);
  EXPECT_EQ(poller.stats().waits_backed_off, 2u);
  EXPECT_EQ(poller.stats().waits_blocked, 3u);
  Drain(&cq);
}

// A waiter that does not judge its spins polls for the whole spin on a contended core, and
// again at the next wait: it never backs off.
TEST(BusyPollerTest, AWaiterThatDoesNotJudgeNeverBacksOff) {
  CoreHog hog;
  BusyWaiter waiter(absl::Milliseconds(50), /*judge=*/false);
  EXPECT_FALSE(waiter.Poll([] { return false; }));  // runs out, its core mostly the hog's
  const uint64_t polls = waiter.stats().polls;
  EXPECT_GT(polls, 0u);
  EXPECT_TRUE(waiter.Poll([] { return true; }));
  EXPECT_EQ(waiter.stats().polls, polls + 1);
  EXPECT_EQ(waiter.stats().contended_spins, 0u);
  EXPECT_FALSE(waiter.last_spin_contended());  // never judged
  EXPECT_EQ(waiter.stats().waits_backed_off, 0u);
}

// A contended spin that got its event but spent more CPU than kCheapSpin on it (here its
// first poll burns 150 us) cost more than the sleep it saved: it backs off as well.
TEST(BusyPollerTest, ADearContendedSpinBacksOffEvenWhenItsEventCame) {
  CoreHog hog;
  BusyPoller poller(absl::Seconds(60));
  const absl::Time until = absl::Now() + absl::Milliseconds(200);
  bool first = true;
  EXPECT_TRUE(poller.Poll([&] {
    if (first) {
      first = false;
      const absl::Duration burn_until = ThreadCpu() + absl::Microseconds(150);
      while (ThreadCpu() < burn_until) {
      }
    }
    return absl::Now() >= until;
  }));
  EXPECT_EQ(poller.stats().contended_spins, 1u);
  EXPECT_EQ(poller.stats().cheap_contended_spins, 0u);
  const uint64_t polls = poller.stats().polls;
  EXPECT_FALSE(poller.Poll([] { return true; }));  // backed off: sleeps without a look
  EXPECT_EQ(poller.stats().polls, polls);
  EXPECT_EQ(poller.stats().waits_backed_off, 1u);
}

// Runs `round` (a result of some Round type) until `done` holds for its result, at most six
// times, 50 ms apart (timing that depends on the machine's other load shows in one of them),
// and returns every round's result.
template <typename RoundFn, typename DoneFn>
auto RoundsUntil(RoundFn round, DoneFn done) {
  std::vector<decltype(round())> rounds;
  while (rounds.size() < 6 && (rounds.empty() || !done(rounds.back()))) {
    if (!rounds.empty()) absl::SleepFor(absl::Milliseconds(50));
    rounds.push_back(round());
  }
  return rounds;
}

// A peer pinned to `cpu` that serves each request (requests.store(i)) by keeping the core busy
// for `work` of wall time, then yields until the next; served counts the requests done.
class PeerOnTheSameCore {
 public:
  // Returns once the peer runs on `cpu`: a first wait that began before would also wait for
  // the thread's start and move (under ASan on a 2-vCPU AMD VM, past kCheapRequestWait in
  // every round of a CI run).
  PeerOnTheSameCore(int cpu, std::chrono::microseconds work)
      : thread_([this, cpu, work] {
          PinToCpu(cpu);
          running_.store(true, std::memory_order_release);
          int done = 0;
          while (!stop_.load(std::memory_order_relaxed)) {
            if (requests.load(std::memory_order_acquire) == done) {
              sched_yield();
              continue;
            }
            const auto until = std::chrono::steady_clock::now() + work;
            while (std::chrono::steady_clock::now() < until) {
            }
            served.store(++done, std::memory_order_release);
          }
        }) {
    while (!running_.load(std::memory_order_acquire)) sched_yield();
  }
  ~PeerOnTheSameCore() {
    stop_ = true;
    thread_.join();
  }

  // Sends request `i` from the poller's first look (so the wait, from the spin's start, lasts
  // at least `work`) and waits for it with `poller`; returns what Poll returned.
  bool Await(BusyPoller& poller, int i) {
    bool asked = false;
    return poller.Poll([&] {
      if (!asked) {
        asked = true;
        requests.store(i, std::memory_order_release);
        return false;
      }
      return served.load(std::memory_order_acquire) >= i;
    });
  }

  std::atomic<int> requests{0};
  std::atomic<int> served{0};

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> running_{false};
  std::thread thread_;  // last: it starts in the constructor
};

// Rounds of a fresh poller (`cheap_wall`) waiting kCalls times for a peer on its core that
// serves each request with `work`. Each wait is contended (the peer takes the core) and, when
// `work` is within `cheap_wall`, cheap (the poller's own CPU in it is its yields): the poller
// keeps polling. Whether a wait costs the poller under kCheapSpin of CPU also depends on what
// else the machine runs (other tests, a sanitizer's runtime; one round in a TSan run of CI
// judged its last spin dear; under both cores' load from other builds, every round judged its
// first spin dear), so the behaviour must show in one of six rounds, 50 ms apart; a poller
// that misjudges these spins fails all six.
void ExpectItKeepsPolling(std::chrono::microseconds work, absl::Duration cheap_wall) {
  int cpu = sched_getcpu();
  ASSERT_GE(cpu, 0);
  PinToCpu(cpu);
  constexpr int kCalls = 5;
  struct Round {
    int polled = 0;  // waits that ended polling
    BusyPollStats stats;
    bool Kept() const {
      constexpr uint64_t n = kCalls;
      return polled == kCalls && stats.events_polled == n && stats.waits_blocked == 0 &&
             stats.waits_backed_off == 0 && stats.contended_spins == n &&
             stats.cheap_contended_spins == n;
    }
  };
  auto round = [&] {
    PeerOnTheSameCore peer(cpu, work);
    BusyPoller poller(absl::Seconds(60), cheap_wall);
    Round r;
    for (int i = 1; i <= kCalls; ++i) {
      if (peer.Await(poller, i)) ++r.polled;
    }
    r.stats = poller.stats();
    return r;
  };
  const std::vector<Round> rounds = RoundsUntil(round, [](const Round& r) { return r.Kept(); });
  std::string seen;
  for (const Round& r : rounds) {
    absl::StrAppend(&seen, "\n  polled ", r.polled, ", events polled ", r.stats.events_polled,
                    ", blocked ", r.stats.waits_blocked, ", backed off ", r.stats.waits_backed_off,
                    ", contended ", r.stats.contended_spins, ", cheap ",
                    r.stats.cheap_contended_spins);
  }
  EXPECT_TRUE(rounds.back().Kept()) << "rounds:" << seen;
}

// A poller on a core it shares with the thread doing the work it waits for: its yields give
// that thread the core, the event comes after little CPU of its own, and it keeps polling
// (sleeping would only add a wake-up to the peer's work), however long the work takes.
TEST(BusyPollerTest, ItKeepsPollingWhileItsCoreGoesToTheWorkItWaitsFor) {
  ExpectItKeepsPolling(std::chrono::milliseconds(2), absl::InfiniteDuration());
}

// The same for a poller for requests (a server's, with kCheapRequestWait) whose requests come
// well within its limit (a client calling again at once, as in ps_bench).
TEST(BusyPollerTest, AShortContendedWaitForARequestKeepsPolling) {
  static_assert(BusyWaiter::kCheapRequestWait >= absl::Microseconds(300));
  ExpectItKeepsPolling(std::chrono::microseconds(100), BusyWaiter::kCheapRequestWait);
}

// The same peer with 2 ms of work, waited for by a poller for requests: its yields hand the
// peer the core and its own CPU stays small, but the wait lasts longer than the limit (a
// server waiting through a worker's compute); it backs off, so its next wait sleeps without a
// look. A round counts where the measured spin cost the poller under kCheapSpin of CPU and was
// contended (a loaded machine can make it dearer, which backs off for that reason alone);
// one of six rounds must count.
TEST(BusyPollerTest, ALongContendedWaitForARequestBacksOffThoughItCostLittleCpu) {
  int cpu = sched_getcpu();
  ASSERT_GE(cpu, 0);
  PinToCpu(cpu);
  static_assert(BusyWaiter::kCheapRequestWait <= absl::Milliseconds(1));
  struct Round {
    absl::Duration cpu;    // the poller's, in the measured wait
    bool first_polled;     // what the measured wait's Poll returned
    bool second_polled;    // and the next one's
    BusyPollStats first;   // after the measured wait
    BusyPollStats second;  // after the next
    bool Counts() const { return cpu < BusyWaiter::kCheapSpin && first.contended_spins == 1; }
  };
  auto round = [cpu] {
    PeerOnTheSameCore peer(cpu, std::chrono::milliseconds(2));
    // A first request, waited for apart: a fresh thread's first turn on a loaded machine is
    // the one most often dear.
    peer.requests.store(1, std::memory_order_release);
    while (peer.served.load(std::memory_order_acquire) < 1) sched_yield();
    BusyPoller poller(absl::Seconds(60), BusyWaiter::kCheapRequestWait);
    Round r;
    const absl::Duration start = ThreadCpu();
    r.first_polled = peer.Await(poller, 2);
    r.cpu = ThreadCpu() - start;
    r.first = poller.stats();
    r.second_polled = poller.Poll([] { return true; });
    r.second = poller.stats();
    return r;
  };
  const std::vector<Round> rounds = RoundsUntil(round, [](const Round& r) { return r.Counts(); });
  const Round& r = rounds.back();
  ASSERT_TRUE(r.Counts()) << "no round's wait was contended and cheap by CPU in " << rounds.size()
                          << " rounds; the last: " << r.cpu;
  EXPECT_TRUE(r.first_polled);
  EXPECT_EQ(r.first.events_polled, 1u);
  EXPECT_EQ(r.first.cheap_contended_spins, 0u);
  EXPECT_FALSE(r.second_polled);
  EXPECT_EQ(r.second.polls, r.first.polls);  // no look
  EXPECT_EQ(r.second.waits_backed_off, 1u);
}

// Alone on its core, polling is judged free: no back-off, every wait polls.
TEST(BusyPollerTest, AloneOnItsCoreItKeepsPolling) {
  grpc::CompletionQueue cq;
  BusyPoller poller(absl::Seconds(60));
  int tags[3];
  void* tag = nullptr;
  bool ok = false;
  for (int i = 0; i < 3; ++i) {
    Event e(&cq, absl::Milliseconds(30), &tags[i]);
    ASSERT_TRUE(poller.Next(&cq, &tag, &ok));
    EXPECT_EQ(tag, &tags[i]);
  }
  // On a loaded machine another process may have wanted the core now and then; the point is
  // that a wait after an uncontended spin polls again.
  EXPECT_EQ(poller.stats().events_polled + poller.stats().waits_backed_off, 3u);
  if (poller.stats().contended_spins == 0) {
    EXPECT_EQ(poller.stats().events_polled, 3u);
    EXPECT_EQ(poller.stats().waits_blocked, 0u);
    EXPECT_FALSE(poller.last_spin_contended());
  }
  Drain(&cq);
}

}  // namespace
}  // namespace ps::common
