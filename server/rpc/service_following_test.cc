// Push payloads that follow their call (common/rpc/following_payload.h) at the service: the
// server reads no byte before the worker's count covers it, waits a bounded time for a count
// that does not come, pauses a worker whose payload came late, and tells workers when a payload
// may follow (PushPullResponse.push_may_follow). The bad headers are among
// service_shared_memory_test's BadSharedPayloadsAreRefusedAndChangeNothing.
#include <sched.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "common/rpc/following_payload.h"
#include "common/rpc/frame_testing.h"
#include "common/rpc/shared_channel.h"
#include "common/rpc/shared_memory.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rpc/service.h"
#include "server/rpc/service_test_fixture.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::testing::HasSubstr;

class FollowingTest : public ServiceTest {
 protected:
  // The fixture's server waits for writer threads of these tests, which a loaded machine may
  // delay past the default; AnswersLetPayloadsFollowOnlyWhenTheirThreadPolled pauses one.
  FollowingTest() { late_following_ = absl::Minutes(1); }

  // Where these tests put a following payload: one line after its count, at kPushAt.
  static constexpr uint64_t kAt = kPushAt + common::kFollowingWordBytes;

  // `push`'s frame header with its payload following at kAt of `segment`; *payload gets the
  // payload's bytes, which the caller writes there.
  static PushPullRequest FollowingHeader(const PushRequest& push,
                                         const common::SharedMemory& segment,
                                         std::string* payload) {
    const FrameParts parts = PartsOf(common::FrameOf(&push, nullptr));
    PushPullRequest header;
    EXPECT_TRUE(header.ParseFromString(parts.header));
    *payload = std::string(parts.payload);
    SharedPayload* sp = header.mutable_shared();
    sp->set_segment(segment.id());
    sp->set_push_offset(kAt);
    sp->set_push_bytes(payload->size());
    sp->set_push_follows(true);
    return header;
  }

  // Blocks until `service` has taken more than `before` calls from its channels: a call
  // posted after the count was read is being served.
  static void AwaitTaken(const ParameterServerService& service, uint64_t before) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (service.data_path_counters().calls_shared.load() <= before && absl::Now() < give_up) {
      absl::SleepFor(absl::Microseconds(100));
    }
    EXPECT_GT(service.data_path_counters().calls_shared.load(), before);
  }

  // A server of its own with `options`, and worker 0's segment and channel there.
  void StartWithChannel(const ServiceOptions& options, std::optional<SegmentServer>* server,
                        std::shared_ptr<common::SharedMemory>* segment,
                        std::unique_ptr<common::SharedChannel>* channel) {
    absl::StatusOr<SegmentServer> made = MakeSegmentServer(config_, ShardOptions{}, options);
    ASSERT_THAT(made.status(), IsOk());
    server->emplace(*std::move(made));
    AskForSegment(*(*server)->service, HeaderOf(*(*server)->shard, 0, 0), segment, channel);
    ASSERT_NE(*channel, nullptr);
  }

  // Worker 0's push of `sequence` posted in `channel` of `server`, its payload following in
  // `segment`: its count written before the call is posted (`late` zero), never (`late`
  // infinite), or `late` after the server took the call. The channel's answer.
  absl::Status PushFollowing(SegmentServer& server, common::SharedMemory& segment,
                             common::SharedChannel& channel, uint64_t sequence,
                             absl::Duration late) {
    PushRequest request = ValidPush(sequence);
    *request.mutable_header() = HeaderOf(*server.shard, 0, sequence);
    std::string payload;
    const PushPullRequest header = FollowingHeader(request, segment, &payload);
    std::memcpy(segment.data() + kAt, payload.data(), payload.size());
    std::atomic<uint64_t>* written = common::FollowingWord(segment.data() + kPushAt);
    written->store(late == absl::ZeroDuration() ? payload.size() : 0, std::memory_order_release);
    const uint64_t taken = server.service->data_path_counters().calls_shared.load();
    std::optional<uint32_t> slot = channel.AcquireSlot();
    EXPECT_TRUE(slot.has_value());
    if (!slot.has_value()) return absl::InternalError("no free slot");
    channel.Post(*slot, RawFrame(header.SerializeAsString(), ""), absl::Seconds(10));
    if (late > absl::ZeroDuration() && late != absl::InfiniteDuration()) {
      AwaitTaken(*server.service, taken);
      absl::SleepFor(late);
      written->store(payload.size(), std::memory_order_release);
    }
    grpc::ByteBuffer answer;
    return ChannelAnswer(channel, *slot, absl::Now() + absl::Seconds(10), &answer);
  }

  // Whether `s` refuses a push of a paused worker.
  static bool Paused(const absl::Status& s) {
    return s.code() == absl::StatusCode::kAborted &&
           absl::StrContains(s.message(), "came late before");
  }

  // The offer worker 0 gets when it asks for a segment again (replacing its segment).
  SharedSegment AskAgain() {
    grpc::ByteBuffer answer;
    EXPECT_THAT(Ask(*service_, Header(0), &answer), IsOk());
    PushPullResponse response;
    EXPECT_TRUE(answer.Valid() && response.ParseFromString(PartsOf(answer).header));
    EXPECT_TRUE(response.has_shared_offer());
    return response.shared_offer();
  }
};

// Instantiated in the channel form only: a count raised after the call is posted.
using FollowingCallsTest = FollowingTest;

// The worker posts the call through its channel, then writes the payload and raises the count
// (by the socket a worker sends a call only once its copy is done, and the server does not
// wait: AFollowingPayloadThatNeverComesIsRefusedAndChangesNothing). The server reads no byte
// before the count covers it (the region holds NaNs until the worker writes it, after the
// server took the call: a read ahead of the count would refuse the push), and the push lands
// as the same push sent as a message does. Dense blocks only (checked as they come) and with
// sparse rows (waited for whole before the frame is cut).
TEST_P(FollowingCallsTest, AFollowingPayloadIsReadOnlyOnceItsCountCoversIt) {
  for (const bool rows : {false, true}) {
    SCOPED_TRACE(rows ? "dense and sparse" : "dense");
    PushRequest push = ValidPush(rows ? 2 : 1);
    if (!rows) push.mutable_tables()->RemoveLast();  // "emb"
    std::string payload;
    const PushPullRequest header = FollowingHeader(push, *segment_, &payload);
    std::atomic<uint64_t>* written = common::FollowingWord(segment_->data() + kPushAt);
    written->store(0);
    std::memset(segment_->data() + kAt, 0xff, payload.size());  // NaNs
    const uint64_t following = service_->data_path_counters().bytes_following.load();
    const uint64_t taken = service_->data_path_counters().calls_shared.load();
    absl::Status status;
    std::thread call([&] {
      grpc::ByteBuffer answer;
      status = PushPull(RawFrame(header.SerializeAsString(), ""), absl::Now() + absl::Seconds(10),
                        &answer);
    });
    AwaitTaken(*service_, taken);
    std::memcpy(segment_->data() + kAt, payload.data(), payload.size());
    written->store(payload.size(), std::memory_order_release);
    call.join();
    ASSERT_THAT(status, IsOk());
    EXPECT_EQ(Rejected("nonfinite"), 0u);
    EXPECT_EQ(service_->data_path_counters().bytes_following.load() - following, payload.size());
  }
  // The same two pushes as messages, to a second server of the same job: the same state.
  PushRequest dense = ValidPush(1);
  dense.mutable_tables()->RemoveLast();
  const PullRequest pull = PullAll(/*worker=*/-1);  // a tool: no worker bookkeeping
  PullResponse got;
  ASSERT_THAT(service_->HandlePull(pull, absl::Now() + absl::Seconds(5), &got), IsOk());
  EXPECT_EQ(got.SerializeAsString(),
            AfterMessages({dense, ValidPush(2)}, pull).SerializeAsString());
  EXPECT_TRUE(AskAgain().push_may_follow());
}

// A call that asks (SharedPayload.time_call) is told the CPU time the server's threads spent
// serving it, which the worker weighs its ways of handing bytes by: more than nothing for a
// push, and not the time the server polled for a following payload the worker wrote 50 ms
// after the server took the call (the thread polls on a free core meanwhile: CPU time). A
// call that does not ask is told nothing.
TEST_P(FollowingCallsTest, ATimedCallIsToldItsCpuWithoutTheWaitForItsPayload) {
  PushRequest push = ValidPush(1);
  push.mutable_tables()->RemoveLast();  // dense only
  std::string payload;
  PushPullRequest header = FollowingHeader(push, *segment_, &payload);
  header.mutable_shared()->set_time_call(true);
  std::atomic<uint64_t>* written = common::FollowingWord(segment_->data() + kPushAt);
  written->store(0);
  const uint64_t taken = service_->data_path_counters().calls_shared.load();
  absl::Status status;
  grpc::ByteBuffer answer;
  std::thread call([&] {
    status = PushPull(RawFrame(header.SerializeAsString(), ""), absl::Now() + absl::Seconds(10),
                      &answer);
  });
  AwaitTaken(*service_, taken);
  absl::SleepFor(absl::Milliseconds(50));
  std::memcpy(segment_->data() + kAt, payload.data(), payload.size());
  written->store(payload.size(), std::memory_order_release);
  call.join();
  ASSERT_THAT(status, IsOk());
  PushPullResponse response;
  ASSERT_TRUE(response.ParseFromString(PartsOf(answer).header));
  EXPECT_GT(response.served_cpu_ns(), 0u);
  EXPECT_LT(response.served_cpu_ns(), 25'000'000u) << "the 50 ms wait counted";

  // The same push sent whole: timed when asked, not when not.
  for (const bool timed : {true, false}) {
    PushPullRequest whole = header;
    whole.mutable_shared()->set_push_follows(false);
    whole.mutable_shared()->set_time_call(timed);
    whole.mutable_header()->set_sequence(header.header().sequence() + (timed ? 1 : 2));
    std::memcpy(segment_->data() + kAt, payload.data(), payload.size());
    ASSERT_THAT(
        PushPull(RawFrame(whole.SerializeAsString(), ""), absl::Now() + absl::Seconds(10), &answer),
        IsOk());
    ASSERT_TRUE(response.ParseFromString(PartsOf(answer).header));
    EXPECT_EQ(response.served_cpu_ns() > 0, timed);
    EXPECT_FALSE(response.push().duplicate());
  }
}

// A following payload whose count never covers it (a worker that lies, or dies mid-copy) holds
// the server no longer than FollowingPayload::MaxWait, well before the call's deadline (by the
// socket not at all): refused DEADLINE_EXCEEDED ("payload_late"), nothing applied. That
// worker's payloads must then come whole: a frame of it that says its payload follows is
// refused at once (ABORTED, nothing changed, even with the count there), its next segment is
// offered without push_may_follow, and the push sent whole goes through, once.
TEST_P(FollowingTest, AFollowingPayloadThatNeverComesIsRefusedAndChangesNothing) {
  std::string payload;
  PushPullRequest header = FollowingHeader(ValidPush(1), *segment_, &payload);
  std::atomic<uint64_t>* written = common::FollowingWord(segment_->data() + kPushAt);
  std::memcpy(segment_->data() + kAt, payload.data(), payload.size());
  written->store(payload.size() / 2);  // half of it, and no more
  const std::string before = State();
  const uint64_t applied = shard_->updates_applied();
  grpc::ByteBuffer answer;
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      PushPull(RawFrame(header.SerializeAsString(), ""), start + absl::Seconds(60), &answer),
      StatusIs(
          absl::StatusCode::kDeadlineExceeded,
          HasSubstr(absl::StrCat(payload.size() / 2, " of ", payload.size(), " bytes there"))));
  // Bounded by the server's own wait (MaxWait: 100 ms here), not the call's deadline (60 s;
  // generous: a loaded machine).
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(Rejected("payload_late"), 1u);
  EXPECT_EQ(State(), before);
  EXPECT_EQ(shard_->updates_applied(), applied);
  written->store(payload.size());
  EXPECT_THAT(
      PushPull(RawFrame(header.SerializeAsString(), ""), absl::Now() + absl::Seconds(5), &answer),
      StatusIs(absl::StatusCode::kAborted, HasSubstr("came late before")));
  EXPECT_EQ(Rejected("late_follower"), 1u);
  EXPECT_EQ(State(), before);
  header.mutable_shared()->set_push_follows(false);
  ASSERT_THAT(
      PushPull(RawFrame(header.SerializeAsString(), ""), absl::Now() + absl::Seconds(5), &answer),
      IsOk());
  EXPECT_NE(State(), before);
  ASSERT_THAT(
      PushPull(RawFrame(header.SerializeAsString(), ""), absl::Now() + absl::Seconds(5), &answer),
      IsOk());  // a duplicate: applied once
  EXPECT_EQ(shard_->updates_applied(), applied + 1);
  // Paused (ServiceOptions::late_following_pause): the offer says so, and that the answers
  // through the new segment will say when its payloads may follow again.
  const SharedSegment offer = AskAgain();
  EXPECT_FALSE(offer.push_may_follow());
  EXPECT_TRUE(offer.push_may_follow_later());
}

// A following payload that does not come (a worker that never writes its count, or writes
// it too late) pauses its worker for late_following_pause: its frames that say their payload
// follows are refused at once (ABORTED, nothing changed), and after the pause they are taken
// again. Late again at once: paused twice as long (the rule in full: late_pause_test). The
// pause runs on a clock of the test's (ServiceOptions::pause_clock). A payload that comes, but
// only after more than late_following of waiting (a worker that raises its count just in time,
// again and again, would hold the channel's thread that long each time), is applied and
// pauses its worker too: its count is raised 50 ms after the server took the call, within the
// server's 100 ms wait.
TEST_P(FollowingCallsTest, AFollowingPayloadThatCameLatePausesItsWorker) {
  constexpr absl::Duration kPause = absl::Seconds(10);
  absl::Mutex clock_mu;
  absl::Time now = absl::FromUnixSeconds(1000000);
  ServiceOptions options;
  options.late_following = absl::Milliseconds(1);
  options.late_following_pause = kPause;
  options.pause_clock = [&] {
    absl::MutexLock lock(&clock_mu);
    return now;
  };
  auto set_clock = [&](absl::Time t) {
    absl::MutexLock lock(&clock_mu);
    now = t;
  };
  const absl::Time start = absl::FromUnixSeconds(1000000);
  std::optional<SegmentServer> server;
  std::shared_ptr<common::SharedMemory> segment;
  std::unique_ptr<common::SharedChannel> channel;
  ASSERT_NO_FATAL_FAILURE(StartWithChannel(options, &server, &segment, &channel));
  // Worker 0's push of `sequence` through its channel, its payload following: all of it
  // written before the call is posted, none of it ever, or all of it 50 ms after the server
  // took the call.
  enum Count { kWhole, kNever, kLate };
  auto push = [&](uint64_t sequence, Count count) {
    return PushFollowing(*server, *segment, *channel, sequence,
                         count == kWhole   ? absl::ZeroDuration()
                         : count == kNever ? absl::InfiniteDuration()
                                           : absl::Milliseconds(50));
  };
  auto paused = [](const absl::Status& s) { return Paused(s); };
  auto refused = [&] {
    StatsResponse stats;
    server->shard->FillStats(&stats);
    auto it = stats.rejected().find("late_follower");
    return it == stats.rejected().end() ? 0 : it->second;
  };
  const uint64_t applied = server->shard->updates_applied();
  EXPECT_THAT(push(1, kNever), StatusIs(absl::StatusCode::kDeadlineExceeded));  // paused at start
  EXPECT_TRUE(paused(push(1, kWhole)));
  set_clock(start + kPause - absl::Nanoseconds(1));
  EXPECT_TRUE(paused(push(1, kWhole)));
  EXPECT_EQ(server->shard->updates_applied(), applied);
  EXPECT_EQ(refused(), 2u);

  set_clock(start + kPause);
  EXPECT_THAT(push(1, kWhole), IsOk());  // follows again
  EXPECT_EQ(server->shard->updates_applied(), applied + 1);
  EXPECT_THAT(push(2, kNever), StatusIs(absl::StatusCode::kDeadlineExceeded));  // late again
  set_clock(start + 2 * kPause);  // past a pause as long as the first, not past twice that
  EXPECT_TRUE(paused(push(2, kWhole)));
  set_clock(start + 3 * kPause);
  EXPECT_THAT(push(2, kWhole), IsOk());
  EXPECT_EQ(server->shard->updates_applied(), applied + 2);
  set_clock(start + 100 * kPause);      // long quiet
  EXPECT_THAT(push(3, kLate), IsOk());  // applied, and paused
  EXPECT_EQ(server->shard->updates_applied(), applied + 3);
  EXPECT_TRUE(paused(push(4, kWhole)));
  EXPECT_EQ(server->shard->updates_applied(), applied + 3);
  EXPECT_EQ(refused(), 4u);
}

// A worker that raises its count a while after each call, never as late as late_following
// (here 50 ms; each wait about 8 ms), is paused once its waits beyond honest copies add up to
// more than late_following (found in review, 2026-12-06: it was never paused, and held the
// channel's thread most of the time). The debt drains with the pause clock, stopped here. A
// worker whose payloads are there when its calls are taken owes nothing: never paused.
TEST_P(FollowingCallsTest, WaitsJustShortOfLateAddUpToAPause) {
  ServiceOptions options;
  options.late_following = absl::Milliseconds(50);
  const absl::Time frozen = absl::FromUnixSeconds(1000000);
  options.pause_clock = [frozen] { return frozen; };
  std::optional<SegmentServer> server;
  std::shared_ptr<common::SharedMemory> segment;
  std::unique_ptr<common::SharedChannel> channel;
  ASSERT_NO_FATAL_FAILURE(StartWithChannel(options, &server, &segment, &channel));
  auto push = [&](uint64_t sequence, absl::Duration late) {
    return PushFollowing(*server, *segment, *channel, sequence, late);
  };
  auto paused = [](const absl::Status& s) { return Paused(s); };
  uint64_t sequence = 0;
  for (int i = 0; i < 50; ++i) ASSERT_THAT(push(++sequence, absl::ZeroDuration()), IsOk()) << i;
  // Each wait adds at least about 8 ms: 50 ms is passed by the seventh (sooner on a slow host).
  int calls = 0;
  absl::Status status;
  while (!paused(status) && calls < 12) {
    status = push(++sequence, absl::Milliseconds(8));
    ++calls;
  }
  EXPECT_TRUE(paused(status)) << status;
  EXPECT_LE(calls, 9);
}

// An answer through a channel says the worker's next payload may follow its call only when the
// thread that served the call found it while polling on a core no other thread wanted: never
// with polling off, nor with two other busy threads on the channel thread's core; with polling
// on and that core free, calls posted back to back from another core are found so. The
// channel's thread starts on the first of this process's cores (it takes the test thread's
// affinity when the segment is made), and the test thread then posts from the second. A
// machine busy with other tests can leave the thread no uncontended spin for 3 s, and it is
// then right to say no: that case is then skipped (CI's sanitizer run once found none in 50
// calls with both threads free to share a core). The hogged case's first answer is not
// counted: the spin it judges may have begun before the hogs ran (an AddressSanitizer run
// once found one of 50 answers saying yes, with the hogs not waited for). Nor, after the free
// case found a yes, while the worker is paused for a payload that did not come
// (ServiceOptions::late_following_pause): then none in 3 s, under the same conditions.
TEST_P(FollowingCallsTest, AnswersLetPayloadsFollowOnlyWhenTheirThreadPolled) {
  cpu_set_t original;
  ASSERT_EQ(sched_getaffinity(0, sizeof(original), &original), 0);
  absl::Cleanup restore = [&original] { sched_setaffinity(0, sizeof(original), &original); };
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &original)) cpus.push_back(c);
  }
  auto pin = [](int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return sched_setaffinity(0, sizeof(one), &one) == 0;
  };
  enum Case { kNoPolling, kHogged, kFree, kPaused };
  for (const Case c : {kNoPolling, kHogged, kFree, kPaused}) {
    SCOPED_TRACE(c);
    const absl::Duration poll = c == kNoPolling ? absl::ZeroDuration() : absl::Seconds(10);
    if (c == kHogged && cpus.size() < 2) continue;
    ServiceOptions options;
    options.channel_busy_poll = poll;
    options.late_following_pause = absl::Minutes(1);
    auto server = MakeSegmentServer(config_, ShardOptions{}, options);
    ASSERT_THAT(server.status(), IsOk());
    std::shared_ptr<common::SharedMemory> segment;
    std::unique_ptr<common::SharedChannel> channel;
    const bool two_cores = cpus.size() == 2 && pin(cpus[0]);
    AskForSegment(*server->service, HeaderOf(*server->shard, 0, 0), &segment, &channel);
    ASSERT_NE(channel, nullptr);
    std::atomic<bool> stop{false};
    std::vector<std::thread> hogs;
    absl::Cleanup end_hogs = [&] {
      stop = true;
      for (std::thread& t : hogs) t.join();
    };
    if (c == kHogged) {
      ASSERT_TRUE(two_cores);
      std::atomic<int> started{0};
      for (int h = 0; h < 2; ++h) {
        hogs.emplace_back([&] {  // on the channel thread's core, as the pin above left it
          started.fetch_add(1);
          while (!stop.load(std::memory_order_relaxed)) {
          }
        });
      }
      while (started.load() < 2) absl::SleepFor(absl::Milliseconds(1));
    }
    if (two_cores) {
      ASSERT_TRUE(pin(cpus[1]));
    }
    int may_follow = 0;
    if (c == kPaused) {
      // A following payload whose count never comes: refused payload_late, its worker paused.
      PushRequest request = ValidPush(1);
      *request.mutable_header() = HeaderOf(*server->shard, 0, 1);
      std::string payload;
      const PushPullRequest header = FollowingHeader(request, *segment, &payload);
      common::FollowingWord(segment->data() + kPushAt)->store(0);
      std::optional<uint32_t> slot = channel->AcquireSlot();
      ASSERT_TRUE(slot.has_value());
      channel->Post(*slot, RawFrame(header.SerializeAsString(), ""), absl::Seconds(5));
      grpc::ByteBuffer answer;
      ASSERT_THAT(ChannelAnswer(*channel, *slot, absl::Now() + absl::Seconds(5), &answer),
                  StatusIs(absl::StatusCode::kDeadlineExceeded));
    }
    const int calls = c == kFree || c == kPaused ? 5000 : 50;
    const absl::Time until = absl::Now() + absl::Seconds(3);
    for (int i = 1; i <= calls && (c != kFree || may_follow == 0) && absl::Now() < until; ++i) {
      PushRequest request = ValidPush(i);
      *request.mutable_header() = HeaderOf(*server->shard, 0, i);
      grpc::ByteBuffer frame = common::FrameOf(&request, nullptr);
      PushPullRequest header;
      ASSERT_TRUE(header.ParseFromString(PartsOf(frame).header));
      const std::string payload(PartsOf(frame).payload);
      std::memcpy(segment->data() + kPushAt, payload.data(), payload.size());
      SharedPayload* sp = header.mutable_shared();
      sp->set_segment(segment->id());
      sp->set_push_offset(kPushAt);
      sp->set_push_bytes(payload.size());
      std::optional<uint32_t> slot = channel->AcquireSlot();
      ASSERT_TRUE(slot.has_value());
      channel->Post(*slot, RawFrame(header.SerializeAsString(), ""), absl::Seconds(5));
      grpc::ByteBuffer answer;
      ASSERT_THAT(ChannelAnswer(*channel, *slot, absl::Now() + absl::Seconds(5), &answer), IsOk());
      PushPullResponse response;
      ASSERT_TRUE(response.ParseFromString(PartsOf(answer).header));
      // (The first answer of the hogged case may judge a spin begun before the hogs ran.)
      if (c != kHogged || i > 1) may_follow += response.push_may_follow() ? 1 : 0;
    }
    if (c != kFree) {
      EXPECT_EQ(may_follow, 0);
    } else if (may_follow == 0) {
      GTEST_SKIP() << "every spin of the channel's thread was contended for 3 s";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shared, FollowingCallsTest, ::testing::Values(kSharedCalls), WireFormName);
INSTANTIATE_TEST_SUITE_P(Shared, FollowingTest, ::testing::Values(kSharedMemory, kSharedCalls),
                         WireFormName);

}  // namespace
}  // namespace ps::server
