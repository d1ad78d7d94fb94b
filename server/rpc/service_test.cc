// Request handling of the ParameterServer service without sockets: every bad input gets its
// precise status, is counted, and leaves the server's state exactly as it was.
#include "server/rpc/service.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/rpc/frame_testing.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rpc/service_test_fixture.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST_P(ServiceTest, ValidPushChangesStateOnce) {
  const std::string before = State();
  PushResponse response;
  ASSERT_THAT(DoPush(ValidPush(1), &response), IsOk());
  EXPECT_FALSE(response.duplicate());
  const std::string after = State();
  EXPECT_NE(after, before);
  ASSERT_THAT(DoPush(ValidPush(1), &response), IsOk());
  EXPECT_TRUE(response.duplicate());
  EXPECT_EQ(State(), after);
}

// A fused call whose pull is to be refused (a negative clock or done_clock) applies nothing of
// its push, and a segment it asks for is not made: refused before anything changes.
TEST_P(ServiceTest, AFusedCallWhosePullIsRefusedChangesNothing) {
  if (!frames()) GTEST_SKIP() << "PushPull is a frame";
  PullRequest pull;
  *pull.mutable_header() = Header(0);
  auto* t = pull.add_tables();
  t->set_table("w");
  for (uint32_t b : mine_) t->add_block_ids(b);
  const std::string before = State();
  for (const bool done_clock : {false, true}) {
    PullRequest bad = pull;
    if (done_clock) {
      bad.mutable_header()->set_done_clock(-1);
    } else {
      bad.mutable_header()->set_clock(-1);
    }
    grpc::ByteBuffer answer;
    if (!done_clock) {  // (a fused frame's done_clock is its push's, which refuses it itself)
      const PushRequest push = ValidPush(1);
      EXPECT_THAT(PushPull(RequestFrame(&push, &bad), absl::Now() + absl::Seconds(5), &answer),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not in [0, ")));
      EXPECT_EQ(State(), before);
    }
    // A pull of nothing asking for a segment, refused for its clock: the worker's segment stays.
    PushPullRequest ask;
    *ask.mutable_header() = bad.header();
    ask.set_pull_clock(bad.header().clock());
    ask.set_want_shared_bytes(kSegmentBytes);
    const int64_t memory = shard_->memory().used();
    EXPECT_THAT(service_->HandlePushPull(RawFrame(ask.SerializeAsString(), ""),
                                         absl::Now() + absl::Seconds(5), &answer),
                StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_EQ(shard_->memory().used(), memory);
  }
  EXPECT_EQ(Rejected("bad_clock"), 3u);
  // The worker's segment (in the shared-memory forms) still carries its calls.
  PushResponse pushed;
  EXPECT_THAT(DoPush(ValidPush(1), &pushed), IsOk());
  EXPECT_NE(State(), before);
}

// A Push refused for the frame fields it carries (payload_bytes, rows_bytes) is counted once,
// however many it has (found in review, 2026-12-06: once per field).
TEST_P(ServiceTest, APushWithFrameFieldsIsCountedOnce) {
  if (frames()) GTEST_SKIP() << "payload_bytes and rows_bytes are a frame's own fields";
  PushRequest request = ValidPush(1);
  TableValues* w = request.mutable_tables(0);
  *w->add_blocks() = w->blocks(0);
  for (DenseBlock& block : *w->mutable_blocks()) block.set_payload_bytes(4);
  w->set_rows_bytes(4);
  ExpectRejected(request, absl::StatusCode::kInvalidArgument, "is for frames (PushPull)");
  EXPECT_EQ(Rejected("unparseable"), 1u);
}

TEST_P(ServiceTest, UnknownTableIsNotFound) {
  PushRequest request = ValidPush(1);
  request.add_tables()->set_table("nope");
  ExpectRejected(request, absl::StatusCode::kNotFound, "table 'nope'");
  PullRequest pull;
  *pull.mutable_header() = Header(0);
  pull.add_tables()->set_table("nope");
  PullResponse response;
  EXPECT_THAT(DoPull(pull, absl::Now() + absl::Seconds(1), &response),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_EQ(Rejected("unknown_table"), 2u);
}

TEST_P(ServiceTest, BlockOutOfRangeIsInvalidArgument) {
  PushRequest request = ValidPush(1);
  request.mutable_tables(0)->mutable_blocks(0)->set_block_id(17);
  ExpectRejected(request, absl::StatusCode::kInvalidArgument, "block 17: out of range");
}

TEST_P(ServiceTest, WrongPayloadSizeNamesExpectedAndActual) {
  PushRequest request = ValidPush(1);
  const uint32_t b = mine_[0];
  request.mutable_tables(0)->mutable_blocks(0)->set_values(std::string(8, '\0'));
  const auto* info = shard_->partitioner().FindTable("w");
  auto [begin, end] = shard_->partitioner().BlockRange(*info, b);
  ExpectRejected(request, absl::StatusCode::kInvalidArgument,
                 absl::StrCat("block ", b, ": expected ", end - begin, " values, got 2"));
  EXPECT_GE(Rejected("bad_size"), 1u);
}

TEST_P(ServiceTest, MalformedBytesAreInvalidArgument) {
  PushRequest request = ValidPush(1);
  request.mutable_tables(0)->mutable_blocks(0)->set_values("abcde");
  ExpectRejected(request, absl::StatusCode::kInvalidArgument, "not a whole number");
  PushRequest bad_encoding = ValidPush(1);
  bad_encoding.mutable_tables(1)->set_encoding(static_cast<Encoding>(42));
  ExpectRejected(bad_encoding, absl::StatusCode::kInvalidArgument, "encoding 42");
}

TEST_P(ServiceTest, BlockOfAnotherServerIsFailedPrecondition) {
  PushRequest request = ValidPush(1);
  request.mutable_tables(0)->mutable_blocks(0)->set_block_id(theirs_[0]);
  ExpectRejected(request, absl::StatusCode::kFailedPrecondition, "belongs to server 1");
}

TEST_P(ServiceTest, SparseKeyOfAnotherServerIsFailedPrecondition) {
  PushRequest request = ValidPush(1);
  request.mutable_tables(1)->set_keys(0, other_key_);
  ExpectRejected(request, absl::StatusCode::kFailedPrecondition,
                 absl::StrCat("key ", other_key_, " belongs to server 1"));
}

TEST_P(ServiceTest, SparseRowCountOrWidthMismatchIsInvalidArgument) {
  PushRequest fewer_rows = ValidPush(1);
  fewer_rows.mutable_tables(1)->mutable_rows()->resize((keys_.size() - 1) * 3 * 4);
  ExpectRejected(fewer_rows, absl::StatusCode::kInvalidArgument,
                 absl::StrCat(keys_.size(), " keys of dim 3 need ", keys_.size() * 3));
  PushRequest wider = ValidPush(1);
  common::EncodeFloats(std::vector<float>(keys_.size() * 4, 0.5f), ENCODING_FLOAT32,
                       wider.mutable_tables(1)->mutable_rows());
  ExpectRejected(wider, absl::StatusCode::kInvalidArgument, "need");
}

TEST_P(ServiceTest, NonFiniteGradientIsRejectedAndCounted) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    PushRequest request = ValidPush(1);
    std::vector<float> rows(keys_.size() * 3, 0.5f);
    rows[4] = bad;
    common::EncodeFloats(rows, ENCODING_FLOAT32, request.mutable_tables(1)->mutable_rows());
    ExpectRejected(request, absl::StatusCode::kInvalidArgument, "first at index 4");
  }
  EXPECT_EQ(Rejected("nonfinite"), 2u);
}

TEST_P(ServiceTest, NonFiniteDeltaIsRejectedToo) {
  PushRequest request = ValidPush(1);
  request.set_is_delta(true);
  std::vector<float> rows(keys_.size() * 3, 0.5f);
  rows[1] = std::numeric_limits<float>::quiet_NaN();
  common::EncodeFloats(rows, ENCODING_FLOAT32, request.mutable_tables(1)->mutable_rows());
  ExpectRejected(request, absl::StatusCode::kInvalidArgument, "first at index 1");
}

TEST_P(ServiceTest, WorkerOutsideTheJobIsInvalidArgument) {
  PushRequest request = ValidPush(1);
  request.mutable_header()->set_worker_id(1000);
  ExpectRejected(request, absl::StatusCode::kInvalidArgument, "not in this job");
  PullRequest pull;
  *pull.mutable_header() = Header(0);
  pull.mutable_header()->set_worker_id(1000);
  PullResponse response;
  EXPECT_THAT(DoPull(pull, absl::Now() + absl::Seconds(1), &response),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not in this job")));
  EXPECT_EQ(Rejected("bad_worker"), 2u);
}

TEST_P(ServiceTest, LayoutMismatchIsFailedPrecondition) {
  PushRequest request = ValidPush(1);
  request.mutable_header()->set_layout_fingerprint(12345);
  ExpectRejected(request, absl::StatusCode::kFailedPrecondition, "layout mismatch");
  PullRequest pull;
  *pull.mutable_header() = Header(0);
  pull.mutable_header()->set_layout_fingerprint(12345);
  PullResponse response;
  EXPECT_THAT(DoPull(pull, absl::Now() + absl::Seconds(1), &response),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_P(ServiceTest, WrongKindOfAddressIsInvalidArgument) {
  PushRequest keys_on_dense = ValidPush(1);
  keys_on_dense.mutable_tables(0)->add_keys(keys_[0]);
  ExpectRejected(keys_on_dense, absl::StatusCode::kInvalidArgument, "'w' is dense");
  PushRequest blocks_on_sparse = ValidPush(1);
  blocks_on_sparse.mutable_tables(1)->add_blocks()->set_block_id(0);
  ExpectRejected(blocks_on_sparse, absl::StatusCode::kInvalidArgument, "'emb' is sparse");
}

TEST_P(ServiceTest, SequenceZeroAndOldIncarnationAreRefused) {
  ExpectRejected(ValidPush(0), absl::StatusCode::kInvalidArgument, "start at 1");
  PushResponse response;
  PushRequest newer = ValidPush(1);
  newer.mutable_header()->set_worker_incarnation(5);
  ASSERT_THAT(DoPush(newer, &response), IsOk());
  ExpectRejected(ValidPush(2), absl::StatusCode::kFailedPrecondition, "older");
}

TEST_P(ServiceTest, PushWithoutAWorkerSlotIsRefused) {
  // A negative id used to skip exactly-once admission: the same bytes applied every time.
  PushRequest request = ValidPush(0);
  request.mutable_header()->set_worker_id(-1);
  ExpectRejected(request, absl::StatusCode::kInvalidArgument, "negative ids may only read");
  ExpectRejected(request, absl::StatusCode::kInvalidArgument, "negative ids may only read");
  EXPECT_EQ(Rejected("bad_worker"), 2u);
}

TEST_P(ServiceTest, IncarnationFarAheadIsRefusedAndLocksNobodyOut) {
  PushRequest forged = ValidPush(1);
  forged.mutable_header()->set_worker_incarnation(UINT64_MAX);
  ExpectRejected(forged, absl::StatusCode::kInvalidArgument, "ahead of this server's clock");
  PushResponse response;
  ASSERT_THAT(service_->HandlePush(ValidPush(1), &response), IsOk());
  EXPECT_FALSE(response.duplicate());
}

TEST_P(ServiceTest, HugeSequencesDoNotMakeTheRealNextPushADuplicate) {
  PushResponse response;
  ASSERT_THAT(service_->HandlePush(ValidPush(1), &response), IsOk());
  for (uint64_t i = 0; i <= WorkerTracker::kMaxAbove; ++i) {
    ASSERT_THAT(service_->HandlePush(ValidPush((uint64_t{1} << 62) + i), &response),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ahead of the highest")));
  }
  const std::string before = State();
  ASSERT_THAT(service_->HandlePush(ValidPush(2), &response), IsOk());
  EXPECT_FALSE(response.duplicate());
  EXPECT_NE(State(), before);
}

TEST_P(ServiceTest, ShutdownNeedsTheOperatorAndAReason) {
  int stops = 0;
  ServiceHooks hooks;
  hooks.shutdown = [&stops](bool) { ++stops; };
  ParameterServerService service(shard_.get(), ServiceOptions{}, hooks);
  ShutdownRequest empty;
  EXPECT_THAT(service.HandleShutdown(Peer(PeerRole::kOperator, -1), empty),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reason")));
  ShutdownRequest request;
  request.set_reason("maintenance");
  EXPECT_THAT(service.HandleShutdown(Peer(PeerRole::kWorker, 0), request),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(service.HandleShutdown(Peer(PeerRole::kUnknown, -1), request),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(stops, 0);
  EXPECT_THAT(service.HandleShutdown(Peer(PeerRole::kOperator, -1), request), IsOk());
  EXPECT_EQ(stops, 1);
}

TEST_P(ServiceTest, EmptyShutdownIsRefusedEvenInPlaintext) {
  int stops = 0;
  ServiceHooks hooks;
  hooks.shutdown = [&stops](bool) { ++stops; };
  ServiceOptions options;
  options.auth.check_identities = false;
  ParameterServerService service(shard_.get(), options, hooks);
  EXPECT_THAT(service.HandleShutdown(Peer(PeerRole::kUnchecked, -1), ShutdownRequest()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(stops, 0);
}

TEST_P(ServiceTest, HeartbeatsCannotFinishAnotherWorker) {
  HeartbeatRequest hello;
  *hello.mutable_header() = Header(0);
  HeartbeatResponse response;
  ASSERT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kWorker, 0), hello, &response), IsOk());
  HeartbeatRequest finish = hello;
  finish.set_finished(true);
  // Another worker's certificate, or one naming no worker.
  EXPECT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kWorker, 1), finish, &response),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kUnknown, -1), finish, &response),
              StatusIs(absl::StatusCode::kPermissionDenied));
  // A tool's id finishes nobody; (unchecked) a new incarnation announced with its finish is
  // refused.
  HeartbeatRequest tool = finish;
  tool.mutable_header()->set_worker_id(-1);
  EXPECT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kUnchecked, -1), tool, &response),
              IsOk());  // changes nothing: a tool has no worker to finish
  HeartbeatRequest newer = finish;
  newer.mutable_header()->set_worker_incarnation(2);
  EXPECT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kUnchecked, -1), newer, &response),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(shard_->workers().AllFinished());
  ASSERT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kWorker, 0), finish, &response), IsOk());
  EXPECT_TRUE(shard_->workers().AllFinished());
}

TEST_P(ServiceTest, AHeartbeatRaisesTheWorkersClockToItsDoneClockAndNeverLowersIt) {
  HeartbeatRequest beat;
  *beat.mutable_header() = Header(0);
  beat.mutable_header()->set_done_clock(7);
  HeartbeatResponse response;
  ASSERT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kWorker, 0), beat, &response), IsOk());
  EXPECT_EQ(response.clock(), 7);
  beat.mutable_header()->set_done_clock(3);
  ASSERT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kWorker, 0), beat, &response), IsOk());
  EXPECT_EQ(response.clock(), 7);
  // Refused, and nothing changes: a negative clock, or an incarnation already replaced.
  beat.mutable_header()->set_done_clock(-1);
  EXPECT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kWorker, 0), beat, &response),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("done_clock -1")));
  HeartbeatRequest newer = beat;
  newer.mutable_header()->set_worker_incarnation(beat.header().worker_incarnation() + 1);
  newer.mutable_header()->set_done_clock(8);
  ASSERT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kWorker, 0), newer, &response), IsOk());
  beat.mutable_header()->set_done_clock(50);
  EXPECT_THAT(service_->HandleHeartbeat(Peer(PeerRole::kWorker, 0), beat, &response),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(shard_->workers().Get(0)->clock(), 8);
}

TEST(ServiceBoundTest, PullAtAClockNoPushCanReachIsRefusedAtOnce) {
  auto config = common::ParseJobConfigText(R"pb(
    cluster { num_servers: 1 num_workers: 2 }
    tables { name: "w" kind: TABLE_KIND_DENSE shape: 4 optimizer { kind: SGD } }
    training { staleness: 0 }
  )pb", "test");
  ASSERT_THAT(config.status(), IsOk());
  auto shard = Shard::Create(*config, ShardOptions{});
  ASSERT_THAT(shard.status(), IsOk());
  ParameterServerService service(shard->get(), ServiceOptions{}, ServiceHooks{});
  PullRequest pull;
  pull.mutable_header()->set_worker_id(0);
  pull.mutable_header()->set_worker_incarnation(1);
  pull.mutable_header()->set_clock(1000000);
  pull.mutable_header()->set_layout_fingerprint((*shard)->partitioner().layout_fingerprint());
  pull.add_tables()->set_table("w");
  pull.mutable_tables(0)->add_block_ids(0);
  PullResponse response;
  // Under BSP this pull used to wait (holding a thread) for its whole deadline.
  const absl::Time deadline = absl::InfiniteFuture();
  EXPECT_THAT(service.HandlePull(pull, deadline, &response),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no push can")));
  // The first step's pull is fine.
  pull.mutable_header()->set_clock(0);
  EXPECT_THAT(service.HandlePull(pull, deadline, &response), IsOk());
}

TEST_P(ServiceTest, PullsInFp16AndBf16DecodeToTheSameValuesApproximately) {
  std::vector<std::vector<float>> got;
  for (Encoding e : {ENCODING_FLOAT32, ENCODING_FP16, ENCODING_BF16}) {
    PullRequest pull;
    *pull.mutable_header() = Header(0);
    auto* t = pull.add_tables();
    t->set_table("w");
    t->set_encoding(e);
    t->add_block_ids(mine_[0]);
    PullResponse response;
    ASSERT_THAT(DoPull(pull, absl::Now() + absl::Seconds(1), &response), IsOk());
    const auto& values = response.tables(0).blocks(0).values();
    std::vector<float> decoded(values.size() / common::BytesPerValue(e));
    ASSERT_THAT(common::DecodeFloats(values, e, absl::MakeSpan(decoded)), IsOk());
    got.push_back(decoded);
  }
  ASSERT_EQ(got[1].size(), got[0].size());
  for (size_t i = 0; i < got[0].size(); ++i) {
    EXPECT_NEAR(got[1][i], got[0][i], 1e-3);
    EXPECT_NEAR(got[2][i], got[0][i], 1e-2);
  }
  // The float32 pull was read in place on the apply threads; the 16-bit ones, encoded from a
  // scratch buffer, were not.
  EXPECT_EQ(shard_->parallel_pulls(), 1u);
}

// ---- Frames only ----------------------------------------------------------------------------

using FrameTest = ServiceTest;

TEST_P(FrameTest, UnparseableFramesAreRefusedCountedAndChangeNothing) {
  const std::string before = State();
  PushRequest valid = ValidPush(1);
  // The valid push's header and payload, to damage one way or another.
  const FrameParts parts = PartsOf(common::FrameOf(&valid, nullptr));
  const std::string& header = parts.header;
  const std::string& payload = parts.payload;
  const std::string whole = RawFrameBytes(header, payload);
  PushPullRequest with_values;
  ASSERT_TRUE(with_values.ParseFromString(header));
  with_values.mutable_push(0)->mutable_blocks(0)->set_values("x");
  // Lengths that add up to the payload only modulo 2^64: one more byte for a block, 2^64 - 1
  // of rows.
  PushPullRequest wrapping;
  ASSERT_TRUE(wrapping.ParseFromString(header));
  DenseBlock* first = wrapping.mutable_push(0)->mutable_blocks(0);
  first->set_payload_bytes(first->payload_bytes() + 1);
  wrapping.mutable_push(0)->set_rows_bytes(~uint64_t{0});
  const std::vector<std::pair<grpc::ByteBuffer, std::string>> cases = {
      {grpc::ByteBuffer(), "no message"},
      {[] {
         grpc::Slice s(std::string("ab"));
         return grpc::ByteBuffer(&s, 1);
       }(),
       "fewer than a header length"},
      {[&] {
         std::string b = whole;
         b[3] = 0x7f;  // a header length beyond the frame
         grpc::Slice s(b);
         return grpc::ByteBuffer(&s, 1);
       }(),
       "header of"},
      {RawFrame("\xff\xff\xff", payload), "does not parse"},
      // 8 MiB of empty pull entries, over 256 MiB parsed: refused before it is parsed (found
      // in review, 2026-12-06: a frame header was parsed whole, up to 256 MiB of them).
      {[&] {
         std::string empty_pulls;
         for (int i = 0; i < (4 << 20); ++i) empty_pulls.append("\x2a\x00", 2);
         return RawFrame(empty_pulls, payload);
       }(),
       "bytes parsed"},
      {RawFrame(header, payload + "tail"), "do not add up"},
      {RawFrame(header, payload.substr(1)), "do not add up"},
      {RawFrame(wrapping.SerializeAsString(), payload), "do not add up"},
      {RawFrame(with_values.SerializeAsString(), payload), "values field is not empty"},
  };
  uint64_t refused = 0;
  for (const auto& [frame, text] : cases) {
    grpc::ByteBuffer answer;
    EXPECT_THAT(PushPull(frame, absl::Now() + absl::Seconds(1), &answer),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(text)));
    EXPECT_EQ(Rejected("unparseable"), ++refused) << text;
  }
  EXPECT_EQ(State(), before);
}

TEST_P(FrameTest, FusedPullSeesThePushAndABadPullChangesNothing) {
  PullRequest pull;
  *pull.mutable_header() = Header(0);
  auto* t = pull.add_tables();
  t->set_table("w");
  for (uint32_t b : mine_) t->add_block_ids(b);
  PushRequest push = ValidPush(1);
  PullResponse alone;
  ASSERT_THAT(DoPull(pull, absl::Now() + absl::Seconds(1), &alone), IsOk());
  // A fused call whose pull names an unknown table: refused before the push is applied.
  PullRequest bad = pull;
  bad.add_tables()->set_table("nope");
  const std::string before = State();
  grpc::ByteBuffer answer;
  EXPECT_THAT(PushPull(common::FrameOf(&push, &bad), absl::Now() + absl::Seconds(1), &answer),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(State(), before);
  // The valid fused call reads after its push: what a push then a pull would read.
  ASSERT_THAT(PushPull(common::FrameOf(&push, &pull), absl::Now() + absl::Seconds(1), &answer),
              IsOk());
  auto fused = common::AnswerOfFrame(answer);
  ASSERT_THAT(fused.status(), IsOk());
  EXPECT_FALSE(fused->push().duplicate());
  PullResponse after;
  ASSERT_THAT(DoPull(pull, absl::Now() + absl::Seconds(1), &after), IsOk());
  EXPECT_EQ(fused->pull().tables(0).SerializeAsString(), after.tables(0).SerializeAsString());
  EXPECT_NE(alone.tables(0).SerializeAsString(), after.tables(0).SerializeAsString());
  // A retry of the fused call is a duplicate push and the same read.
  ASSERT_THAT(PushPull(common::FrameOf(&push, &pull), absl::Now() + absl::Seconds(1), &answer),
              IsOk());
  auto retried = common::AnswerOfFrame(answer);
  ASSERT_THAT(retried.status(), IsOk());
  EXPECT_TRUE(retried->push().duplicate());
  EXPECT_EQ(retried->pull().tables(0).SerializeAsString(), after.tables(0).SerializeAsString());
}

// The zero-copy hook: a push's payload lying in one slice is used in place (no byte copied)
// and answers come from reused buffers (no allocation after the first call of a size).
TEST_P(FrameTest, PayloadsAreUsedInPlaceAndBuffersReused) {
  PullRequest pull;
  *pull.mutable_header() = Header(0);
  auto* t = pull.add_tables();
  t->set_table("w");
  for (uint32_t b : mine_) t->add_block_ids(b);
  const auto& counters = service_->data_path_counters();
  grpc::ByteBuffer answer;
  uint64_t allocated = 0;
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    PushRequest push = ValidPush(seq);
    ASSERT_THAT(PushPull(common::FrameOf(&push, &pull), absl::Now() + absl::Seconds(1), &answer),
                IsOk());
    answer.Clear();  // gRPC lets go of the answer: its buffer goes back to the pool
    if (seq == 1) allocated = counters.buffers_allocated.load();
  }
  EXPECT_EQ(counters.bytes_gathered.load(), 0u);
  EXPECT_GT(counters.bytes_in_place.load(), 0u);
  EXPECT_EQ(counters.buffers_allocated.load(), allocated) << "a call allocated a new buffer";
  // Calls that pull nothing leave the reused buffers where they are (each took one out of the
  // pool for good before 2026-12-06, found in review).
  PullRequest nothing;
  *nothing.mutable_header() = Header(0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_THAT(
        PushPull(common::FrameOf(nullptr, &nothing), absl::Now() + absl::Seconds(1), &answer),
        IsOk());
    answer.Clear();
  }
  PushRequest push = ValidPush(6);
  ASSERT_THAT(PushPull(common::FrameOf(&push, &pull), absl::Now() + absl::Seconds(1), &answer),
              IsOk());
  answer.Clear();
  EXPECT_EQ(counters.buffers_allocated.load(), allocated) << "a call allocated a new buffer";
}

INSTANTIATE_TEST_SUITE_P(Frames, FrameTest, ::testing::Values(kFrames), WireFormName);
INSTANTIATE_TEST_SUITE_P(WireForms, ServiceTest,
                         ::testing::Values(kMessages, kFrames, kFramesInPieces, kSharedMemory,
                                           kSharedCalls),
                         WireFormName);

}  // namespace
}  // namespace ps::server
