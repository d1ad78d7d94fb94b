// The service's shared-memory paths without sockets: payloads in a worker's segment, and calls
// through its channel (every ServiceTest case also runs in both forms: service_test.cc; the
// channel's own cases: service_shared_calls_test.cc).
#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
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

using SharedMemoryTest = ServiceTest;

// A push and a pull through the segment: the payloads cross it (counted), not the frames, and
// the server ends where a server given the same push as a message ends, bit for bit.
TEST_P(SharedMemoryTest, PushAndAnswerGoThroughTheSegmentAndMatchTheMessagePath) {
  const PushRequest push = ValidPush(1);
  const PullRequest pull = PullAll();
  grpc::ByteBuffer answer;
  ASSERT_THAT(PushPull(RequestFrame(&push, &pull), absl::Now() + absl::Seconds(5), &answer),
              IsOk());
  EXPECT_TRUE(PartsOf(answer).payload.empty());
  auto fused = Answer(answer);
  ASSERT_THAT(fused.status(), IsOk());
  const auto& counters = service_->data_path_counters();
  const size_t push_bytes = PartsOf(common::FrameOf(&push, nullptr)).payload.size();
  EXPECT_EQ(counters.bytes_shared_in.load(), push_bytes);
  uint64_t answer_bytes = 0;
  for (const TableValues& tv : fused->pull().tables()) {
    for (const DenseBlock& b : tv.blocks()) answer_bytes += b.values().size();
    answer_bytes += tv.rows().size();
  }
  EXPECT_GT(answer_bytes, 0u);
  EXPECT_EQ(counters.bytes_shared_out.load(), answer_bytes);
  EXPECT_EQ(counters.bytes_gathered.load(), 0u);

  // The same push as a message, to a second server of the same job.
  const PullResponse expected = AfterMessages({push}, pull);
  ASSERT_EQ(fused->pull().tables_size(), 2);
  for (int t = 0; t < 2; ++t) {
    const TableValues& got = fused->pull().tables(t);
    const TableValues& want = expected.tables(t);
    ASSERT_EQ(got.blocks_size(), want.blocks_size());
    for (int b = 0; b < got.blocks_size(); ++b) {
      EXPECT_EQ(got.blocks(b).values(), want.blocks(b).values()) << "block " << b;
    }
    EXPECT_EQ(got.rows(), want.rows());
  }
}

TEST_P(SharedMemoryTest, BadSharedPayloadsAreRefusedAndChangeNothing) {
  const PushRequest push = ValidPush(1);
  const FrameParts parts = PartsOf(common::FrameOf(&push, nullptr));
  std::memcpy(segment_->data() + kPushAt, parts.payload.data(), parts.payload.size());
  PushPullRequest good;
  ASSERT_TRUE(good.ParseFromString(parts.header));
  SharedPayload* sp = good.mutable_shared();
  sp->set_segment(segment_->id());
  sp->set_push_offset(kPushAt);
  sp->set_push_bytes(parts.payload.size());
  auto with = [&](auto change) {
    PushPullRequest h = good;
    change(&h);
    return h;
  };
  struct Case {
    PushPullRequest header;
    std::string payload;  // in the frame
    absl::StatusCode code;
    std::string text;
  };
  const uint64_t end = kSegmentBytes;
  const std::vector<Case> cases = {
      {with(
           [](PushPullRequest* h) { h->mutable_shared()->set_segment(h->shared().segment() + 1); }),
       "", absl::StatusCode::kAborted, "not this worker's"},
      {with([](PushPullRequest* h) { h->mutable_header()->set_worker_id(-1); }), "",
       absl::StatusCode::kAborted, "not this worker's"},
      {with([&](PushPullRequest* h) { h->mutable_shared()->set_push_offset(end - 8); }), "",
       absl::StatusCode::kInvalidArgument, "shared payload"},
      {with([](PushPullRequest* h) { h->mutable_shared()->set_push_offset(0); }), "",
       absl::StatusCode::kInvalidArgument, "shared payload"},
      {with([](PushPullRequest* h) { h->mutable_shared()->set_push_offset(~uint64_t{0} - 7); }), "",
       absl::StatusCode::kInvalidArgument, "shared payload"},
      {with([](PushPullRequest* h) { h->mutable_shared()->set_push_bytes(~uint64_t{0}); }), "",
       absl::StatusCode::kInvalidArgument, "shared payload"},
      {with([&](PushPullRequest* h) {
         h->mutable_shared()->set_answer_offset(end - 64);
         h->mutable_shared()->set_answer_capacity(128);
       }),
       "", absl::StatusCode::kInvalidArgument, "shared payload"},
      {with([&](PushPullRequest* h) {  // into the channel at the segment's end
         h->mutable_shared()->set_push_offset(*common::SharedChannel::OffsetFor(end) - 64);
       }),
       "", absl::StatusCode::kInvalidArgument, "shared payload"},
      // A following payload's count must lie 8-aligned in the line before it, and the
      // payload be at most kMaxFollowingBytes.
      {with([](PushPullRequest* h) {  // the count in the segment's reserved bytes
         h->mutable_shared()->set_push_follows(true);
         h->mutable_shared()->set_push_offset(96);
       }),
       "", absl::StatusCode::kInvalidArgument, "(following its call)"},
      {with([](PushPullRequest* h) {
         h->mutable_shared()->set_push_follows(true);
         h->mutable_shared()->set_push_offset(kPushAt + 4);
       }),
       "", absl::StatusCode::kInvalidArgument, "(following its call)"},
      {with([](PushPullRequest* h) {
         h->mutable_shared()->set_push_follows(true);
         h->mutable_shared()->set_push_bytes(common::kMaxFollowingBytes + 8);
       }),
       "", absl::StatusCode::kInvalidArgument, "(following its call)"},
      {good, parts.payload, absl::StatusCode::kInvalidArgument, "payload bytes in the frame"},
      {with([](PushPullRequest* h) {
         h->set_has_push(false);
         h->clear_push();
       }),
       "", absl::StatusCode::kInvalidArgument, "shared payload"},
      {with([](PushPullRequest* h) {
         h->mutable_shared()->set_push_bytes(h->shared().push_bytes() - 1);
       }),
       "", absl::StatusCode::kInvalidArgument, "do not add up"},
  };
  const std::string before = State();
  for (const Case& c : cases) {
    grpc::ByteBuffer answer;
    EXPECT_THAT(PushPull(RawFrame(c.header.SerializeAsString(), c.payload),
                         absl::Now() + absl::Seconds(1), &answer),
                StatusIs(c.code, HasSubstr(c.text)))
        << c.header.ShortDebugString();
    EXPECT_EQ(State(), before) << c.header.ShortDebugString();
  }
  EXPECT_EQ(Rejected("unknown_segment"), 2u);
  // A non-finite value in the segment is refused as in a frame.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(segment_->data() + kPushAt + parts.payload.size() - sizeof(float), &nan, sizeof(nan));
  grpc::ByteBuffer answer;
  EXPECT_THAT(
      PushPull(RawFrame(good.SerializeAsString(), ""), absl::Now() + absl::Seconds(1), &answer),
      StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(State(), before);
  // The good one then goes through, once.
  std::memcpy(segment_->data() + kPushAt, parts.payload.data(), parts.payload.size());
  ASSERT_THAT(
      PushPull(RawFrame(good.SerializeAsString(), ""), absl::Now() + absl::Seconds(1), &answer),
      IsOk());
  EXPECT_NE(State(), before);
}

TEST_P(SharedMemoryTest, SegmentsGoOnlyToWorkersOfTheJobAndTheirNewestIncarnation) {
  auto ask = [&](int32_t worker, uint64_t incarnation, uint64_t bytes) {
    PushPullRequest h;
    *h.mutable_header() = Header(0);
    h.mutable_header()->set_worker_id(worker);
    h.mutable_header()->set_worker_incarnation(incarnation);
    h.set_want_shared_bytes(bytes);
    grpc::ByteBuffer answer;
    PushPull(RawFrame(h.SerializeAsString(), ""), absl::Now() + absl::Seconds(1), &answer)
        .IgnoreError();
    PushPullResponse r;
    if (answer.Valid()) r.ParseFromString(PartsOf(answer).header);
    return r;
  };
  EXPECT_FALSE(ask(-1, 1, kSegmentBytes).has_shared_offer());  // a tool
  EXPECT_FALSE(ask(1, 1, kSegmentBytes).has_shared_offer());   // outside a 1-worker job
  EXPECT_FALSE(ask(0, 0, kSegmentBytes).has_shared_offer());   // older than the segment's
  EXPECT_FALSE(ask(0, 1, 64).has_shared_offer());              // no room past the id
  // An incarnation far ahead of the clock (refused as the call goes on; before, it replaced
  // the segment in use, and no later incarnation could ask again).
  EXPECT_FALSE(ask(0, std::numeric_limits<uint64_t>::max(), kSegmentBytes).has_shared_offer());
  // The segment in use still works.
  PushResponse pushed;
  ASSERT_THAT(DoPush(ValidPush(1), &pushed), IsOk());
  EXPECT_GT(service_->data_path_counters().bytes_shared_in.load(), 0u);
  // A newer incarnation's segment replaces it, capped at the server's limit.
  PushPullResponse newer = ask(0, 2, uint64_t{1} << 40);
  ASSERT_TRUE(newer.has_shared_offer());
  EXPECT_EQ(newer.shared_offer().bytes(), kSegmentBytes);
  EXPECT_NE(newer.shared_offer().id(), segment_->id());
  EXPECT_THAT(DoPush(ValidPush(2), &pushed),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("not this worker's")));
}

// A segment goes only to a worker's current incarnation: once the server has heard a newer
// one, an ask of the older (a process fenced off, whose call is then refused) gets no segment
// and replaces none, so the current one's calls through its segment go on.
TEST_P(SharedMemoryTest, AFencedOffIncarnationTakesNoSegment) {
  PushRequest newer = ValidPush(1);
  newer.mutable_header()->set_worker_incarnation(2);
  PushResponse pushed;
  ASSERT_THAT(service_->HandlePush(newer, &pushed), IsOk());  // by message: incarnation 2 heard
  // Incarnation 2, a new process, asks for a segment of its own (a channel's frames must be
  // of the incarnation it went to).
  RequestHeader current = Header(0);
  current.set_worker_incarnation(2);
  std::unique_ptr<common::SharedChannel> channel;
  AskForSegment(*service_, current, &segment_, &channel);
  if (channel_ != nullptr) {
    ASSERT_NE(channel, nullptr);
    channel_ = std::move(channel);
    channel_incarnation_ = 2;
  }
  grpc::ByteBuffer answer;
  EXPECT_THAT(Ask(*service_, Header(0), &answer),  // incarnation 1
              StatusIs(absl::StatusCode::kFailedPrecondition));
  newer = ValidPush(2);
  newer.mutable_header()->set_worker_incarnation(2);
  EXPECT_THAT(DoPush(newer, &pushed), IsOk());
  EXPECT_GT(service_->data_path_counters().bytes_shared_in.load(), 0u);
}

// A worker that finishes gives its segment back: its calls through it are refused after.
TEST_P(SharedMemoryTest, AFinishedWorkersSegmentIsDropped) {
  PushResponse pushed;
  ASSERT_THAT(DoPush(ValidPush(1), &pushed), IsOk());
  HeartbeatRequest finish;
  *finish.mutable_header() = Header(0);
  finish.set_finished(true);
  HeartbeatResponse response;
  ASSERT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kWorker, 0), finish, &response), IsOk());
  EXPECT_THAT(DoPush(ValidPush(2), &pushed),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("not this worker's")));
}

// The id of the segment `service` offers the worker of `header` asking for one of `bytes` with a
// pull of nothing; 0 when it offers none, or refuses the call.
uint64_t OfferedSegment(ParameterServerService& service, const RequestHeader& header,
                        uint64_t bytes) {
  PushPullRequest h;
  *h.mutable_header() = header;
  h.set_want_shared_bytes(bytes);
  grpc::ByteBuffer answer;
  if (!service
           .HandlePushPull(RawFrame(h.SerializeAsString(), ""), absl::Now() + absl::Seconds(5),
                           &answer)
           .ok()) {
    return 0;
  }
  PushPullResponse r;
  EXPECT_TRUE(r.ParseFromString(PartsOf(answer).header));
  return r.has_shared_offer() ? r.shared_offer().id() : 0;
}

// A segment counts against server.max_memory_bytes with its whole size while the server
// holds it; a worker whose segment would not fit gets none (its calls keep the socket).
// The values of an answer in the worker's segment are bounded by the room the call gave, but
// its header (an entry per block named, built on the server's heap) by max_answer_bytes
// still: a fused call whose pull names one block 20,000 times (320 KB of values, within the
// room; a header bound of 480 KB) is refused before its push, by the socket and through the
// channel (found in review, 2026-12-06: it was served). The same block 1,000 times is.
TEST_P(SharedMemoryTest, AnAnswerInTheSegmentStillHasItsHeaderCapped) {
  ServiceOptions options;
  options.max_answer_bytes = 64 << 10;
  auto server = MakeSegmentServer(config_, ShardOptions{}, options);
  ASSERT_THAT(server.status(), IsOk());
  absl::StatusOr<OpenedSegment> opened =
      ::ps::server::OpenSegment(*server->service, HeaderOf(*server->shard, 0, 0));
  ASSERT_THAT(opened.status(), IsOk());
  auto rejected = [&] {
    StatsResponse stats;
    server->shard->FillStats(&stats);
    auto it = stats.rejected().find("answer_too_large");
    return it == stats.rejected().end() ? 0 : it->second;
  };
  auto call = [&](int times, uint64_t sequence) {
    PushRequest push = ValidPush(sequence);
    *push.mutable_header() = HeaderOf(*server->shard, 0, sequence);
    PullRequest pull;
    *pull.mutable_header() = HeaderOf(*server->shard, 0, 0);
    auto* t = pull.add_tables();
    t->set_table("w");
    for (int i = 0; i < times; ++i) t->add_block_ids(mine_[0]);
    absl::StatusOr<grpc::ByteBuffer> frame =
        PayloadIntoSegment(*opened->segment, common::FrameOf(&push, &pull));
    EXPECT_THAT(frame.status(), IsOk());
    if (!frame.ok()) return frame.status();
    grpc::ByteBuffer answer;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    return GetParam() == kSharedCalls ? PostInChannel(*opened->channel, *frame, deadline, &answer)
                                      : server->service->HandlePushPull(*frame, deadline, &answer);
  };
  const uint64_t applied = server->shard->updates_applied();
  const absl::Status refused = call(20000, 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  if (GetParam() != kSharedCalls) {  // a channel's answer carries no message
    EXPECT_THAT(refused.message(), HasSubstr("answer header would be"));
  }
  EXPECT_EQ(rejected(), 1u);
  EXPECT_EQ(server->shard->updates_applied(), applied);
  EXPECT_THAT(call(1000, 1), IsOk());
  EXPECT_EQ(server->shard->updates_applied(), applied + 1);
}

TEST_P(SharedMemoryTest, SegmentsCountAgainstTheMemoryBudget) {
  auto offer = [&](ParameterServerService& service, uint64_t incarnation) {
    RequestHeader h = Header(0);
    h.set_worker_incarnation(incarnation);
    return OfferedSegment(service, h, kSegmentBytes) != 0;
  };
  // The fixture's server holds worker 0's segment; a newer incarnation's replaces it, and a
  // finished worker's goes.
  ShardOptions unlimited;
  auto bare = Shard::Create(config_, unlimited);
  ASSERT_THAT(bare.status(), IsOk());
  const int64_t tables = (*bare)->memory().used();
  ASSERT_GT(tables, 0);
  EXPECT_EQ(shard_->memory().used(), tables + static_cast<int64_t>(kSegmentBytes));
  ASSERT_TRUE(offer(*service_, 2));
  EXPECT_EQ(shard_->memory().used(), tables + static_cast<int64_t>(kSegmentBytes));
  HeartbeatRequest finish;
  *finish.mutable_header() = Header(0);
  finish.mutable_header()->set_worker_incarnation(2);
  finish.set_finished(true);
  HeartbeatResponse response;
  ASSERT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kWorker, 0), finish, &response), IsOk());
  EXPECT_EQ(shard_->memory().used(), tables);

  // A server whose budget lacks one byte of room for the segment makes none.
  for (const int64_t spare : {int64_t{-1}, int64_t{0}}) {
    ShardOptions options;
    options.max_memory_bytes = tables + kSegmentBytes + spare;
    auto server = MakeSegmentServer(config_, options);
    ASSERT_THAT(server.status(), IsOk());
    EXPECT_EQ(offer(*server->service, 1), spare >= 0) << spare;
    EXPECT_EQ(server->shard->memory().used(),
              tables + (spare >= 0 ? static_cast<int64_t>(kSegmentBytes) : 0));
  }
}

// With room for one segment, a worker that asks again (its calls gave the first one up, or it
// restarted) gets a new one: its old segment is let go first. The server keeps one per worker.
TEST_P(SharedMemoryTest, AWorkerAskingAgainGetsASegmentWhereTheBudgetHoldsOne) {
  ShardOptions unlimited;
  auto bare = Shard::Create(config_, unlimited);
  ASSERT_THAT(bare.status(), IsOk());
  const int64_t tables = (*bare)->memory().used();
  ShardOptions options;
  options.max_memory_bytes = tables + kSegmentBytes;
  auto server = MakeSegmentServer(config_, options);
  ASSERT_THAT(server.status(), IsOk());
  ParameterServerService& service = *server->service;
  auto offer = [&](uint64_t incarnation) {
    RequestHeader h = Header(0);
    h.set_worker_incarnation(incarnation);
    return OfferedSegment(service, h, kSegmentBytes);
  };
  const uint64_t first = offer(1);
  ASSERT_NE(first, 0u);
  const uint64_t again = offer(1);  // the same process, after a failed call
  EXPECT_NE(again, 0u);
  EXPECT_NE(again, first);
  EXPECT_NE(offer(2), 0u);  // a new process
  EXPECT_EQ(offer(1), 0u);  // never to a replaced one (its call is refused)
  EXPECT_EQ(server->shard->memory().used(), tables + static_cast<int64_t>(kSegmentBytes));
}

// A worker on another host could not open a segment: it is offered none (its ask names its
// boot id). One that cannot open the segment it was offered (another container) says so in
// its next call, and the server lets it go: before, each such worker kept a segment charged
// against server.max_memory_bytes for the whole job.
TEST_P(SharedMemoryTest, SegmentsAWorkerCannotOpenAreNotKept) {
  auto server = MakeSegmentServer(config_);
  ASSERT_THAT(server.status(), IsOk());
  ParameterServerService& service = *server->service;
  const int64_t tables = server->shard->memory().used();
  auto call = [&](const std::string& boot_id, uint64_t declined) -> uint64_t {
    PushPullRequest h;
    *h.mutable_header() = HeaderOf(*server->shard, 0, 0);
    if (!boot_id.empty()) {
      h.set_want_shared_bytes(kSegmentBytes);
      h.set_want_shared_boot_id(boot_id);
    }
    h.set_declined_shared_id(declined);
    grpc::ByteBuffer answer;
    EXPECT_THAT(service.HandlePushPull(RawFrame(h.SerializeAsString(), ""),
                                       absl::Now() + absl::Seconds(5), &answer),
                IsOk());
    PushPullResponse r;
    EXPECT_TRUE(r.ParseFromString(PartsOf(answer).header));
    return r.has_shared_offer() ? r.shared_offer().id() : 0;
  };
  EXPECT_EQ(call("another-host", 0), 0u);
  EXPECT_EQ(server->shard->memory().used(), tables);
  const uint64_t id = call(common::SharedMemory::BootId(), 0);
  ASSERT_NE(id, 0u);
  const int64_t segment = static_cast<int64_t>(kSegmentBytes);
  EXPECT_EQ(server->shard->memory().used(), tables + segment);
  EXPECT_EQ(call("", id + 1), 0u);  // not its segment: changes nothing
  EXPECT_EQ(server->shard->memory().used(), tables + segment);
  RequestHeader other = HeaderOf(*server->shard, 0, 0);
  other.set_worker_incarnation(0);  // an older process of the worker: refused, nothing dropped
  PushPullRequest stale;
  *stale.mutable_header() = other;
  stale.set_declined_shared_id(id);
  grpc::ByteBuffer answer;
  (void)service.HandlePushPull(RawFrame(stale.SerializeAsString(), ""),
                               absl::Now() + absl::Seconds(5), &answer);
  EXPECT_EQ(server->shard->memory().used(), tables + segment);
  EXPECT_EQ(call("", id), 0u);
  EXPECT_EQ(server->shard->memory().used(), tables);
}

// Workers asking at the same moment (every worker's first call of a job) each fit with the
// others' segments counted: with room for one, one gets it. The room was checked, then the
// segment made and charged, so asks that overlapped all passed and the budget was exceeded by
// a segment per extra worker, for good.
TEST_P(SharedMemoryTest, WorkersAskingAtOnceGetOnlyTheSegmentsTheBudgetHolds) {
  constexpr int kWorkers = 8;
  JobConfig config = config_;
  config.mutable_cluster()->set_num_workers(kWorkers);
  ShardOptions unlimited;
  auto bare = Shard::Create(config, unlimited);
  ASSERT_THAT(bare.status(), IsOk());
  const int64_t tables = (*bare)->memory().used();
  for (int round = 0; round < 20; ++round) {
    ShardOptions options;
    options.max_memory_bytes = tables + kSegmentBytes + kSegmentBytes / 2;
    auto server = MakeSegmentServer(config, options);
    ASSERT_THAT(server.status(), IsOk());
    std::atomic<int> ready{0};
    std::atomic<int> offered{0};
    std::vector<std::thread> threads;
    for (int w = 0; w < kWorkers; ++w) {
      threads.emplace_back([&, w] {
        const RequestHeader h = HeaderOf(*server->shard, w, 0);
        ready.fetch_add(1);
        while (ready.load() < kWorkers) {
        }
        if (OfferedSegment(*server->service, h, kSegmentBytes) != 0) offered.fetch_add(1);
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(offered.load(), 1) << "round " << round;
    EXPECT_EQ(server->shard->memory().used(), tables + static_cast<int64_t>(kSegmentBytes));
  }
}

// Parked pulls hold the segment their answer goes to. A worker asking again and again, each
// time parking pulls on its newest segment, has at most two alive (and charged): its current
// one and one replaced but held; then it gets none until one goes. Before, each ask made one
// more, up to one per parked pull.
TEST_P(SharedMemoryTest, AWorkerKeepsAtMostTwoSegmentsAliveWhateverItsParkedPulls) {
  auto server = MakeParkingSegmentServer(config_);
  ASSERT_THAT(server.status(), IsOk());
  Shard& shard = *server->shard;
  ParameterServerService& service = *server->service;
  const int64_t tables = shard.memory().used();
  auto ask = [&] { return OfferedSegment(service, HeaderOf(shard, 0, 0), kSegmentBytes); };
  std::vector<std::thread> parked;
  auto join = absl::MakeCleanup([&parked] {
    for (std::thread& t : parked) t.join();
    parked.clear();
  });
  auto park = [&](uint64_t segment) {
    PushPullRequest h = ParkingPull(shard);
    SharedPayload* sp = h.mutable_shared();
    sp->set_segment(segment);
    sp->set_answer_offset(kAnswerAt);
    sp->set_answer_capacity(kAnswerEnd - kAnswerAt);
    const size_t before = shard.workers().parked();
    parked.emplace_back([&service, frame = RawFrame(h.SerializeAsString(), "")] {
      grpc::ByteBuffer answer;
      // Parked until its deadline (5 s: long enough for the asks below).
      EXPECT_THAT(service.HandlePushPull(frame, absl::Now() + absl::Seconds(5), &answer),
                  StatusIs(absl::StatusCode::kDeadlineExceeded));
    });
    const absl::Time give_up = absl::Now() + absl::Seconds(4);
    while (shard.workers().parked() == before && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_GT(shard.workers().parked(), before) << "the pull did not park";
  };
  const int64_t segment = static_cast<int64_t>(kSegmentBytes);
  for (int i = 0; i < ParameterServerService::kMaxSegmentsHeldPerWorker; ++i) {
    const uint64_t id = ask();
    ASSERT_NE(id, 0u) << "ask " << i;
    ASSERT_NO_FATAL_FAILURE(park(id));
  }
  EXPECT_EQ(ask(), 0u);
  EXPECT_EQ(ask(), 0u);
  EXPECT_EQ(shard.memory().used(), tables + 2 * segment);
  // Once the parked pulls are answered, their segments go (each once its callback is gone,
  // which may be after its answer) and the worker gets a new one.
  std::move(join).Invoke();
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (shard.memory().used() != tables && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(shard.memory().used(), tables);
  EXPECT_NE(ask(), 0u);
  EXPECT_EQ(shard.memory().used(), tables + segment);
}

// A fused call that asks for a segment and whose pull is then refused (here: parked past its
// deadline) leaves no segment behind: the worker never heard of it and asks again on its next
// call. Before, the server kept it, charged against its budget, until that next ask replaced
// it (for good if the worker was gone).
TEST_P(SharedMemoryTest, ASegmentOfferedInARefusedAnswerIsNotKept) {
  auto server = MakeParkingSegmentServer(config_);
  ASSERT_THAT(server.status(), IsOk());
  Shard& shard = *server->shard;
  ParameterServerService& service = *server->service;
  const int64_t tables = shard.memory().used();
  PushPullRequest h = ParkingPull(shard);
  h.set_want_shared_bytes(kSegmentBytes);
  std::thread parked([&service, frame = RawFrame(h.SerializeAsString(), "")] {
    grpc::ByteBuffer answer;
    EXPECT_THAT(service.HandlePushPull(frame, absl::Now() + absl::Seconds(3), &answer),
                StatusIs(absl::StatusCode::kDeadlineExceeded));
  });
  // Offered and charged while the pull waits.
  const absl::Time parked_by = absl::Now() + absl::Milliseconds(2500);
  while (shard.workers().parked() == 0 && absl::Now() < parked_by) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const bool was_parked = shard.workers().parked() > 0;
  const int64_t charged = shard.memory().used();
  parked.join();
  ASSERT_TRUE(was_parked) << "the pull did not park";
  EXPECT_EQ(charged, tables + static_cast<int64_t>(kSegmentBytes));
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (shard.memory().used() != tables && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(shard.memory().used(), tables);
  // The worker's next ask gets one, and it stays.
  EXPECT_NE(OfferedSegment(service, HeaderOf(shard, 0, 0), kSegmentBytes), 0u);
  EXPECT_EQ(shard.memory().used(), tables + static_cast<int64_t>(kSegmentBytes));
}

INSTANTIATE_TEST_SUITE_P(Shared, SharedMemoryTest, ::testing::Values(kSharedMemory, kSharedCalls),
                         WireFormName);

}  // namespace
}  // namespace ps::server
