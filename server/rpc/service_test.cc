// Request handling of the ParameterServer service without sockets: every bad input gets its
// precise status, is counted, and leaves the server's state exactly as it was.
#include "server/rpc/service.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/config/config.h"
#include "common/rpc/frame_testing.h"
#include "common/rpc/shared_channel.h"
#include "common/rpc/shared_memory.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The wire forms every case runs through: protobuf Push/Pull, and PushPull frames whose
// payload is one aligned slice or is cut into slices of 7 bytes at odd addresses (the shard
// then checks and applies dense values in those pieces, putting together the values cut in
// two), and frames whose payloads lie in the worker's shared-memory segment (push payload
// copied there, pull answer written there by the server). Each must refuse the same bad input
// with the same code and change nothing either.
// kSharedCalls: payloads in the segment, and the frames of worker 0 through its channel.
enum WireForm { kMessages, kFrames, kFramesInPieces, kSharedMemory, kSharedCalls };

// A frame's header length, header and payload, taken apart.
struct FrameParts {
  std::string header;
  std::string payload;
};

FrameParts PartsOf(const grpc::ByteBuffer& frame) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(frame.Dump(&slices).ok());
  std::string whole;
  for (const auto& sl : slices) whole.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  const uint32_t h = static_cast<uint8_t>(whole[0]) | static_cast<uint8_t>(whole[1]) << 8 |
                     static_cast<uint8_t>(whole[2]) << 16 | static_cast<uint8_t>(whole[3]) << 24;
  return FrameParts{whole.substr(4, h), whole.substr(4 + h)};
}

// The bytes of a frame of `header` followed by `payload`, built by hand.
std::string RawFrameBytes(const std::string& header, const std::string& payload) {
  std::string bytes(4, '\0');
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return bytes + header + payload;
}

grpc::ByteBuffer RawFrame(const std::string& header, const std::string& payload) {
  grpc::Slice slice(RawFrameBytes(header, payload));
  return grpc::ByteBuffer(&slice, 1);
}

class ServiceTest : public ::testing::TestWithParam<int> {
 protected:
  bool frames() const { return GetParam() != kMessages; }
  bool shared() const { return GetParam() == kSharedMemory || GetParam() == kSharedCalls; }
  size_t cut_every() const { return GetParam() == kFramesInPieces ? 7 : 0; }

  // Where the shared-memory form puts push payloads and answers in the segment.
  static constexpr uint64_t kPushAt = 4096;
  static constexpr uint64_t kAnswerAt = 512 * 1024;
  static constexpr uint64_t kAnswerEnd = 1 << 20;
  static constexpr uint64_t kSegmentBytes = 8 << 20;  // room for a channel at its end

  // The request frame in the test's wire form. The shared-memory form moves the payload
  // into the segment of the request's worker, as a worker would; a request of a worker with
  // no segment (a tool, a worker outside the job) goes as a plain frame, as it would too.
  grpc::ByteBuffer RequestFrame(const PushRequest* push, const PullRequest* pull) {
    grpc::ByteBuffer frame = common::FrameOf(push, pull, cut_every());
    const int32_t worker =
        push != nullptr ? push->header().worker_id() : pull->header().worker_id();
    if (!shared() || worker != 0 || segment_ == nullptr) return frame;
    FrameParts parts = PartsOf(frame);
    PushPullRequest header;
    EXPECT_TRUE(header.ParseFromString(parts.header));
    EXPECT_LE(parts.payload.size(), kAnswerAt - kPushAt);
    std::memcpy(segment_->data() + kPushAt, parts.payload.data(), parts.payload.size());
    SharedPayload* sp = header.mutable_shared();
    sp->set_segment(segment_->id());
    sp->set_push_offset(kPushAt);
    sp->set_push_bytes(parts.payload.size());
    sp->set_answer_offset(kAnswerAt);
    sp->set_answer_capacity(kAnswerEnd - kAnswerAt);
    return RawFrame(header.SerializeAsString(), "");
  }

  // The answer to a request frame, its payload back in the frame when it came in the segment.
  absl::StatusOr<PushPullResponse> Answer(const grpc::ByteBuffer& answer) {
    if (!shared()) return common::AnswerOfFrame(answer);
    FrameParts parts = PartsOf(answer);
    PushPullResponse header;
    if (!header.ParseFromString(parts.header)) return absl::InternalError("answer header");
    if (header.shared_answer_bytes() == 0) return common::AnswerOfFrame(answer);
    EXPECT_TRUE(parts.payload.empty());
    const uint64_t n = header.shared_answer_bytes();
    header.clear_shared_answer_bytes();
    return common::AnswerOfFrame(
        RawFrame(header.SerializeAsString(), std::string(segment_->data() + kAnswerAt, n)));
  }

  absl::Status DoPush(const PushRequest& request, PushResponse* response) {
    if (!frames()) return service_->HandlePush(request, response);
    grpc::ByteBuffer answer;
    RETURN_IF_ERROR(
        PushPull(RequestFrame(&request, nullptr), absl::Now() + absl::Seconds(5), &answer));
    ASSIGN_OR_RETURN(PushPullResponse decoded, Answer(answer));
    *response = decoded.push();
    return absl::OkStatus();
  }

  absl::Status DoPull(const PullRequest& request, absl::Time deadline, PullResponse* response) {
    if (!frames()) return service_->HandlePull(request, deadline, response);
    grpc::ByteBuffer answer;
    RETURN_IF_ERROR(PushPull(RequestFrame(nullptr, &request), deadline, &answer));
    ASSIGN_OR_RETURN(PushPullResponse decoded, Answer(answer));
    *response = decoded.pull();
    return absl::OkStatus();
  }

  // Worker 0 (incarnation 1) asks for a segment with a pull of nothing, and maps it.
  void OpenSegment() {
    PushPullRequest ask;
    *ask.mutable_header() = Header(0);
    ask.set_want_shared_bytes(kSegmentBytes);
    grpc::ByteBuffer answer;
    ASSERT_THAT(service_->HandlePushPull(RawFrame(ask.SerializeAsString(), ""),
                                         absl::Now() + absl::Seconds(5), &answer),
                IsOk());
    PushPullResponse header;
    ASSERT_TRUE(header.ParseFromString(PartsOf(answer).header));
    ASSERT_TRUE(header.has_shared_offer());
    const SharedSegment& offer = header.shared_offer();
    auto opened =
        common::SharedMemory::Open(offer.id(), offer.path(), offer.bytes(), offer.boot_id());
    ASSERT_THAT(opened.status(), IsOk());
    segment_ = *std::move(opened);
    if (GetParam() == kSharedCalls) {
      ASSERT_TRUE(common::SharedChannel::Fits(offer.channel_offset(), segment_->size()));
      channel_ = std::make_unique<common::SharedChannel>(segment_, offer.channel_offset());
    }
  }

  // A PushPull frame served: worker 0's through its channel in the kSharedCalls form (as a
  // worker sends them), the others (and every frame in the other forms) as a gRPC call is.
  absl::Status PushPull(const grpc::ByteBuffer& frame, absl::Time deadline,
                        grpc::ByteBuffer* answer) {
    PushPullRequest header;
    if (channel_ == nullptr || !header.ParseFromString(PartsOf(frame).header) ||
        header.header().worker_id() != 0 || header.want_shared_bytes() > 0) {
      return service_->HandlePushPull(frame, deadline, answer);
    }
    std::optional<uint32_t> slot = channel_->AcquireSlot();
    if (!slot.has_value()) return absl::InternalError("no free channel slot");
    channel_->Post(*slot, frame, deadline - absl::Now());
    return ChannelAnswer(*slot, deadline, answer);
  }

  // The answer posted `slot` gets.
  absl::Status ChannelAnswer(uint32_t slot, absl::Time deadline, grpc::ByteBuffer* answer) {
    while (true) {
      const uint32_t bell = channel_->worker_bell();
      std::optional<common::SharedChannel::Answer> a = channel_->TakeAnswer(slot);
      if (a.has_value()) {
        if (a->status.ok()) *answer = std::move(a->frame);
        return a->status;
      }
      if (channel_->Unserved(slot)) return absl::AbortedError("closed: not this worker's");
      common::SharedChannel::WaitForAnswers({channel_.get()}, {bell}, deadline + absl::Seconds(5));
      if (absl::Now() > deadline + absl::Seconds(5)) {
        return absl::DeadlineExceededError("no answer in the channel");
      }
    }
  }

  // Two servers; this is server 0. Dense "w": 10 values in blocks of 4 (blocks 0..2);
  // sparse "emb": dim 3.
  void SetUp() override {
    auto config = common::ParseJobConfigText(R"pb(
      cluster { num_servers: 2 num_workers: 1 dense_block_floats: 4 num_virtual_shards: 64 }
      tables {
        name: "w" kind: TABLE_KIND_DENSE shape: 10
        initializer { kind: UNIFORM low: -1 high: 1 }
        optimizer { kind: ADAM }
      }
      tables {
        name: "emb" kind: TABLE_KIND_SPARSE dim: 3
        initializer { kind: NORMAL stddev: 0.1 }
        optimizer { kind: ADAGRAD }
      }
    )pb", "test");
    ASSERT_THAT(config.status(), IsOk());
    config_ = *config;
    ShardOptions options;
    options.server_index = 0;
    auto shard = Shard::Create(config_, options);
    ASSERT_THAT(shard.status(), IsOk());
    shard_ = *std::move(shard);
    ServiceOptions service_options;
    service_options.max_shared_bytes_per_worker = kSegmentBytes;
    service_ =
        std::make_unique<ParameterServerService>(shard_.get(), service_options, ServiceHooks{});
    const auto* w = shard_->partitioner().FindTable("w");
    for (uint32_t b = 0; b < w->num_blocks; ++b) {
      (shard_->partitioner().ServerForBlock(*w, b) == 0 ? mine_ : theirs_).push_back(b);
    }
    ASSERT_FALSE(mine_.empty());
    ASSERT_FALSE(theirs_.empty());
    for (uint64_t k = 0; keys_.size() < 4 || other_key_ == 0; ++k) {
      if (shard_->partitioner().ServerForKey(k) == 0) {
        if (keys_.size() < 4) keys_.push_back(k);
      } else if (other_key_ == 0) {
        other_key_ = k;
      }
    }
    if (shared()) OpenSegment();
  }

  RequestHeader Header(uint64_t sequence) {
    RequestHeader h;
    h.set_worker_id(0);
    h.set_worker_incarnation(1);
    h.set_sequence(sequence);
    h.set_clock(1);
    h.set_layout_fingerprint(shard_->partitioner().layout_fingerprint());
    return h;
  }

  // Everything this server holds, as bytes, plus its update count.
  std::string State() {
    PullRequest request;
    *request.mutable_header() = Header(0);
    request.mutable_header()->set_worker_id(-1);  // a tool: no worker bookkeeping
    auto* t = request.add_tables();
    t->set_table("w");
    for (uint32_t b : mine_) t->add_block_ids(b);
    auto* e = request.add_tables();
    e->set_table("emb");
    for (uint64_t k : keys_) e->add_keys(k);
    PullResponse response;
    EXPECT_THAT(DoPull(request, absl::Now() + absl::Seconds(5), &response), IsOk());
    return absl::StrCat(response.SerializeAsString(), "/", shard_->updates_applied());
  }

  // A valid push: gradient 0.5 for every block of mine_ and every key of keys_.
  PushRequest ValidPush(uint64_t sequence) {
    PushRequest request;
    *request.mutable_header() = Header(sequence);
    auto* t = request.add_tables();
    t->set_table("w");
    for (uint32_t b : mine_) {
      auto* block = t->add_blocks();
      block->set_block_id(b);
      const auto* info = shard_->partitioner().FindTable("w");
      auto [begin, end] = shard_->partitioner().BlockRange(*info, b);
      common::EncodeFloats(std::vector<float>(end - begin, 0.5f), ENCODING_FLOAT32,
                           block->mutable_values());
    }
    auto* e = request.add_tables();
    e->set_table("emb");
    for (uint64_t k : keys_) e->add_keys(k);
    common::EncodeFloats(std::vector<float>(keys_.size() * 3, 0.5f), ENCODING_FLOAT32,
                         e->mutable_rows());
    return request;
  }

  // Pushes `request`, expects `code` with `text` in the message, and that nothing changed.
  void ExpectRejected(const PushRequest& request, absl::StatusCode code, const std::string& text) {
    const std::string before = State();
    PushResponse response;
    EXPECT_THAT(DoPush(request, &response),
                StatusIs(code, HasSubstr(text)));
    EXPECT_EQ(State(), before) << "state changed by a rejected push";
  }

  uint64_t Rejected(const std::string& reason) {
    StatsResponse stats;
    shard_->FillStats(&stats);
    auto it = stats.rejected().find(reason);
    return it == stats.rejected().end() ? 0 : it->second;
  }

  JobConfig config_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ParameterServerService> service_;
  std::vector<uint32_t> mine_, theirs_;
  std::vector<uint64_t> keys_;
  uint64_t other_key_ = 0;
  std::shared_ptr<common::SharedMemory> segment_;   // the shared-memory forms'
  std::unique_ptr<common::SharedChannel> channel_;  // kSharedCalls'
};

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

// ---- Forged requests (a client lying about who it is or where it is) ------------------

PeerIdentity Peer(PeerRole role, int32_t index) {
  PeerIdentity p;
  p.role = role;
  p.index = index;
  p.authenticated = role != PeerRole::kUnchecked;
  p.name = "test peer";
  return p;
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
       }(), "header of"},
      {RawFrame("\xff\xff\xff", payload), "does not parse"},
      {RawFrame(header, payload + "tail"), "do not add up"},
      {RawFrame(header, payload.substr(1)), "do not add up"},
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
}

// ---- Shared memory only ----------------------------------------------------------------------

using SharedMemoryTest = ServiceTest;

// A push and a pull through the segment: the payloads cross it (counted), not the frames, and
// the server ends where a server given the same push as a message ends, bit for bit.
TEST_P(SharedMemoryTest, PushAndAnswerGoThroughTheSegmentAndMatchTheMessagePath) {
  const PushRequest push = ValidPush(1);
  PullRequest pull;
  *pull.mutable_header() = Header(0);
  auto* w = pull.add_tables();
  w->set_table("w");
  for (uint32_t b : mine_) w->add_block_ids(b);
  auto* e = pull.add_tables();
  e->set_table("emb");
  for (uint64_t k : keys_) e->add_keys(k);
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
  ShardOptions options;
  options.server_index = 0;
  auto other_shard = Shard::Create(config_, options);
  ASSERT_THAT(other_shard.status(), IsOk());
  ParameterServerService other(other_shard->get(), ServiceOptions{}, ServiceHooks{});
  PushResponse pushed;
  ASSERT_THAT(other.HandlePush(push, &pushed), IsOk());
  PullResponse expected;
  ASSERT_THAT(other.HandlePull(pull, absl::Now() + absl::Seconds(5), &expected), IsOk());
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

using SharedCallsTest = ServiceTest;

TEST_P(SharedCallsTest, TheChannelRefusesWhatAWorkerMayNotSendAndChangesNothing) {
  const std::string before = State();
  grpc::ByteBuffer answer;
  auto post = [&](const grpc::ByteBuffer& frame) {
    std::optional<uint32_t> slot = channel_->AcquireSlot();
    EXPECT_TRUE(slot.has_value());
    channel_->Post(*slot, frame, absl::Seconds(5));
    return ChannelAnswer(*slot, absl::Now() + absl::Seconds(5), &answer);
  };
  // Another worker's push, in worker 0's channel (plaintext: it would pass on a socket).
  PushRequest other = ValidPush(1);
  other.mutable_header()->set_worker_id(5);
  EXPECT_THAT(post(common::FrameOf(&other, nullptr, 0)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("shared-memory channel")));
  // A call asking for a segment (its thread would replace its own).
  PushPullRequest ask;
  *ask.mutable_header() = Header(0);
  ask.set_want_shared_bytes(kSegmentBytes);
  EXPECT_THAT(post(RawFrame(ask.SerializeAsString(), "")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("asks for a segment")));
  // Bytes that are no frame.
  grpc::Slice junk(std::string("\xff\xff\xff\x7fjunk"));
  EXPECT_THAT(post(grpc::ByteBuffer(&junk, 1)), StatusIs(absl::StatusCode::kInvalidArgument));
  // A request size beyond the slot's room, written by hand (slot header: state, then size).
  std::optional<uint32_t> slot = channel_->AcquireSlot();
  ASSERT_TRUE(slot.has_value());
  char* header = segment_->data() + channel_->offset() + common::SharedChannel::kBellBytes +
                 *slot * common::SharedChannel::kSlotBytes;
  reinterpret_cast<std::atomic<uint32_t>*>(header + 4)->store(~0u);
  reinterpret_cast<std::atomic<uint32_t>*>(header)->store(1);  // posted
  channel_->RingServer();
  EXPECT_THAT(ChannelAnswer(*slot, absl::Now() + absl::Seconds(5), &answer),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("channel slot")));
  EXPECT_EQ(State(), before);
}

TEST_P(SharedCallsTest, APushPostedAgainIsAppliedOnce) {
  // The worker gave up waiting (its reply "lost") and sends the same sequence again.
  const uint64_t applied = shard_->updates_applied();
  const grpc::ByteBuffer frame =
      RequestFrame(&*std::make_unique<PushRequest>(ValidPush(1)), nullptr);
  grpc::ByteBuffer answer;
  ASSERT_THAT(PushPull(frame, absl::Now() + absl::Seconds(5), &answer), IsOk());
  const uint64_t once = shard_->updates_applied();
  EXPECT_GT(once, applied);
  ASSERT_THAT(PushPull(frame, absl::Now() + absl::Seconds(5), &answer), IsOk());
  absl::StatusOr<PushPullResponse> second = Answer(answer);
  ASSERT_THAT(second.status(), IsOk());
  EXPECT_TRUE(second->push().duplicate());
  EXPECT_EQ(shard_->updates_applied(), once);
}

std::string WireFormName(const ::testing::TestParamInfo<int>& info) {
  switch (info.param) {
    case kMessages:
      return "Messages";
    case kFrames:
      return "Frames";
    case kFramesInPieces:
      return "FramesInPieces";
    case kSharedMemory:
      return "SharedMemory";
    default:
      return "SharedCalls";
  }
}

INSTANTIATE_TEST_SUITE_P(Frames, FrameTest, ::testing::Values(kFrames), WireFormName);
INSTANTIATE_TEST_SUITE_P(Shared, SharedCallsTest, ::testing::Values(kSharedCalls), WireFormName);
INSTANTIATE_TEST_SUITE_P(Shared, SharedMemoryTest, ::testing::Values(kSharedMemory, kSharedCalls),
                         WireFormName);

INSTANTIATE_TEST_SUITE_P(WireForms, ServiceTest,
                         ::testing::Values(kMessages, kFrames, kFramesInPieces, kSharedMemory,
                                           kSharedCalls),
                         WireFormName);

}  // namespace
}  // namespace ps::server
