#include "common/rpc/busy_poll.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "grpcpp/alarm.h"
#include "grpcpp/completion_queue.h"

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

// With another busy thread on its core, the poller's yields hand the core over, it runs
// for less than half of its polling time, and it sleeps at once for its next waits.
TEST(BusyPollerTest, ItStopsPollingWhenAnotherThreadWantsItsCore) {
  int cpu = sched_getcpu();
  ASSERT_GE(cpu, 0);
  PinToCpu(cpu);
  std::atomic<bool> stop{false};
  std::thread burner([&] {
    PinToCpu(cpu);
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  grpc::CompletionQueue cq;
  BusyPoller poller(absl::Seconds(60));
  int tags[3];
  void* tag = nullptr;
  bool ok = false;
  {
    Event e(&cq, absl::Milliseconds(200), &tags[0]);
    ASSERT_TRUE(poller.Next(&cq, &tag, &ok));
    EXPECT_EQ(tag, &tags[0]);
  }
  EXPECT_EQ(poller.stats().contended_spins, 1u);
  EXPECT_EQ(poller.stats().events_polled, 1u);
  // The next waits sleep at once: no polls.
  const uint64_t polls = poller.stats().polls;
  for (int i = 1; i < 3; ++i) {
    Event e(&cq, absl::Milliseconds(5), &tags[i]);
    ASSERT_TRUE(poller.Next(&cq, &tag, &ok));
    EXPECT_EQ(tag, &tags[i]);
  }
  EXPECT_EQ(poller.stats().polls, polls);
  EXPECT_EQ(poller.stats().waits_backed_off, 2u);
  EXPECT_EQ(poller.stats().waits_blocked, 2u);
  stop = true;
  burner.join();
  Drain(&cq);
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
  }
  Drain(&cq);
}

}  // namespace
}  // namespace ps::common
