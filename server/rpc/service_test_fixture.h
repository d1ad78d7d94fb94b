// The fixture of the service's request-handling tests (service_test.cc and
// service_shared_memory_test.cc): one server's shard and service without sockets, and every
// request sent in one of the wire forms. Test-only.
#ifndef PS_SERVER_RPC_SERVICE_TEST_FIXTURE_H_
#define PS_SERVER_RPC_SERVICE_TEST_FIXTURE_H_

#include <cstring>
#include <memory>
#include <optional>
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
#include "server/rpc/service.h"
#include "server/rpc/shared_worker_testing.h"

namespace ps::server {

// The wire forms every case runs through: protobuf Push/Pull, and PushPull frames whose
// payload is one aligned slice or is cut into slices of 7 bytes at odd addresses (the shard
// then checks and applies dense values in those pieces, putting together the values cut in
// two), and frames whose payloads lie in the worker's shared-memory segment (push payload
// copied there, pull answer written there by the server), those same frames of worker 0 posted
// in its segment's channel (kSharedCalls). Each must refuse the same bad input with the same
// code and change nothing either.
enum WireForm { kMessages, kFrames, kFramesInPieces, kSharedMemory, kSharedCalls };

using ::ps::common::FrameParts;
using ::ps::common::PartsOf;
using ::ps::common::RawFrame;
using ::ps::common::RawFrameBytes;

class ServiceTest : public ::testing::TestWithParam<int> {
 protected:
  bool frames() const { return GetParam() != kMessages; }
  bool shared() const { return GetParam() == kSharedMemory || GetParam() == kSharedCalls; }
  size_t cut_every() const { return GetParam() == kFramesInPieces ? 7 : 0; }

  // Where the shared-memory form puts push payloads and answers in the segment.
  static constexpr uint64_t kPushAt = kTestPushAt;
  static constexpr uint64_t kAnswerAt = kTestAnswerAt;
  static constexpr uint64_t kAnswerEnd = kTestAnswerEnd;
  static constexpr uint64_t kSegmentBytes = kTestSegmentBytes;  // room for a channel at its end

  // The request frame in the test's wire form. The shared-memory form moves the payload
  // into the segment of the request's worker, as a worker would; a request of a worker with
  // no segment (a tool, a worker outside the job) goes as a plain frame, as it would too.
  grpc::ByteBuffer RequestFrame(const PushRequest* push, const PullRequest* pull) {
    grpc::ByteBuffer frame = common::FrameOf(push, pull, cut_every());
    const int32_t worker =
        push != nullptr ? push->header().worker_id() : pull->header().worker_id();
    if (!shared() || worker != 0 || segment_ == nullptr) return frame;
    absl::StatusOr<grpc::ByteBuffer> moved = PayloadIntoSegment(*segment_, frame);
    EXPECT_THAT(moved.status(), ::ps::common::IsOk());
    return moved.ok() ? *std::move(moved) : frame;
  }

  // The answer to a request frame, its payload back in the frame when it came in the segment.
  absl::StatusOr<PushPullResponse> Answer(const grpc::ByteBuffer& answer) {
    if (!shared()) return common::AnswerOfFrame(answer);
    return AnswerFromSegment(*segment_, answer);
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

  // The worker of `header` asks `service` for a segment of kSegmentBytes with a pull of
  // nothing, by the socket's call: its status, and the answer in *answer.
  static absl::Status Ask(ParameterServerService& service, const RequestHeader& header,
                          grpc::ByteBuffer* answer) {
    return ::ps::server::AskForSegment(service, header, answer);
  }

  // The worker of `header` asks `service` for a segment with a pull of nothing, and maps it;
  // *channel gets the segment's channel (null when it has none).
  static void AskForSegment(ParameterServerService& service, const RequestHeader& header,
                            std::shared_ptr<common::SharedMemory>* segment,
                            std::unique_ptr<common::SharedChannel>* channel) {
    absl::StatusOr<OpenedSegment> opened = ::ps::server::OpenSegment(service, header);
    ASSERT_THAT(opened.status(), ::ps::common::IsOk());
    *segment = std::move(opened->segment);
    *channel = std::move(opened->channel);
  }

  // Worker 0 (incarnation 1) asks for a segment with a pull of nothing, and maps it.
  void OpenSegment() {
    std::unique_ptr<common::SharedChannel> channel;
    AskForSegment(*service_, Header(0), &segment_, &channel);
    if (GetParam() == kSharedCalls) {
      ASSERT_NE(channel, nullptr);
      channel_ = std::move(channel);
    }
  }

  // A PushPull frame served: worker 0's through its channel in the kSharedCalls form (as a
  // worker sends them), the others (and every frame in the other forms) as a gRPC call is. So
  // are worker 0's frames of another incarnation than the channel's: another process of the
  // worker has no way into the channel (its frames are refused there: SharedCallsTest).
  absl::Status PushPull(const grpc::ByteBuffer& frame, absl::Time deadline,
                        grpc::ByteBuffer* answer) {
    PushPullRequest header;
    if (channel_ == nullptr || !header.ParseFromString(PartsOf(frame).header) ||
        header.header().worker_id() != 0 ||
        header.header().worker_incarnation() != channel_incarnation_ ||
        header.want_shared_bytes() > 0) {
      return service_->HandlePushPull(frame, deadline, answer);
    }
    return PostInChannel(*channel_, frame, deadline, answer);
  }

  // The answer posted `slot` gets.
  absl::Status ChannelAnswer(uint32_t slot, absl::Time deadline, grpc::ByteBuffer* answer) {
    return ChannelAnswer(*channel_, slot, deadline, answer);
  }
  // The answer posted `slot` of `channel` gets.
  static absl::Status ChannelAnswer(common::SharedChannel& channel, uint32_t slot,
                                    absl::Time deadline, grpc::ByteBuffer* answer) {
    return ::ps::server::ChannelAnswer(channel, slot, deadline, answer);
  }

  // Two servers; this is server 0. Dense "w": 10 values in blocks of 4 (blocks 0..2);
  // sparse "emb": dim 3. Dense blocks pushed and pulled (float32) on the apply threads.
  void SetUp() override {
    auto config = common::ParseJobConfigText(
        R"pb(
          cluster { num_servers: 2 num_workers: 1 dense_block_floats: 4 num_virtual_shards: 64 }
          tables {
            name: "w"
            kind: TABLE_KIND_DENSE
            shape: 10
            initializer { kind: UNIFORM low: -1 high: 1 }
            optimizer { kind: ADAM }
          }
          tables {
            name: "emb"
            kind: TABLE_KIND_SPARSE
            dim: 3
            initializer { kind: NORMAL stddev: 0.1 }
            optimizer { kind: ADAGRAD }
          }
        )pb",
        "test");
    ASSERT_THAT(config.status(), ::ps::common::IsOk());
    config_ = *config;
    ShardOptions options;
    options.server_index = 0;
    // Every push and float32 pull through the apply threads (a block a unit here).
    options.apply_threads = 2;
    options.parallel_apply_values = 1;
    auto shard = Shard::Create(config_, options);
    ASSERT_THAT(shard.status(), ::ps::common::IsOk());
    shard_ = *std::move(shard);
    ServiceOptions service_options;
    service_options.max_shared_bytes_per_worker = kSegmentBytes;
    service_options.late_following = late_following_;
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

  RequestHeader Header(uint64_t sequence) { return HeaderOf(*shard_, 0, sequence); }
  // A server of its own for a test: a shard of `config` (`shard_options`: server 0 unless
  // they say otherwise) and a service over it that makes segments of kSegmentBytes (the rest of
  // `options` as given). The service goes before the shard.
  struct SegmentServer {
    std::unique_ptr<Shard> shard;
    std::unique_ptr<ParameterServerService> service;
  };
  static absl::StatusOr<SegmentServer> MakeSegmentServer(const JobConfig& config,
                                                         const ShardOptions& shard_options = {},
                                                         ServiceOptions options = {}) {
    SegmentServer server;
    ASSIGN_OR_RETURN(server.shard, Shard::Create(config, shard_options));
    options.max_shared_bytes_per_worker = kSegmentBytes;
    server.service =
        std::make_unique<ParameterServerService>(server.shard.get(), options, ServiceHooks{});
    return server;
  }
  // The same for `config`'s job with two workers at staleness 0: worker 1 never pushes, so
  // worker 0's pulls of clock 1 park.
  static absl::StatusOr<SegmentServer> MakeParkingSegmentServer(JobConfig config) {
    config.mutable_cluster()->set_num_workers(2);
    config.mutable_training()->set_staleness(0);
    return MakeSegmentServer(config);
  }  // Worker 0's fused pull of its blocks of "w" at clock 1, which parks on such a server until
  // its deadline.
  PushPullRequest ParkingPull(const Shard& shard) const {
    PushPullRequest h;
    *h.mutable_header() = HeaderOf(shard, 0, 0);
    h.set_pull_clock(1);
    TablePullRequest* t = h.add_pull();
    t->set_table("w");
    for (uint32_t b : mine_) t->add_block_ids(b);
    return h;
  }

  // Worker `worker`'s (incarnation 1, clock 1) for the layout of `shard`.
  static RequestHeader HeaderOf(const Shard& shard, int32_t worker, uint64_t sequence) {
    RequestHeader h;
    h.set_worker_id(worker);
    h.set_worker_incarnation(1);
    h.set_sequence(sequence);
    h.set_clock(1);
    h.set_layout_fingerprint(shard.partitioner().layout_fingerprint());
    return h;
  }

  // A pull by `worker` of every block of "w" and every key of "emb" this server holds.
  PullRequest PullAll(int32_t worker = 0) {
    PullRequest pull;
    *pull.mutable_header() = Header(0);
    pull.mutable_header()->set_worker_id(worker);
    auto* w = pull.add_tables();
    w->set_table("w");
    for (uint32_t b : mine_) w->add_block_ids(b);
    auto* e = pull.add_tables();
    e->set_table("emb");
    for (uint64_t k : keys_) e->add_keys(k);
    return pull;
  }

  // What a second server of the same job answers to `pull` after `pushes` as messages.
  PullResponse AfterMessages(const std::vector<PushRequest>& pushes, const PullRequest& pull) {
    ShardOptions options;
    options.server_index = 0;
    auto shard = Shard::Create(config_, options);
    EXPECT_THAT(shard.status(), ::ps::common::IsOk());
    PullResponse out;
    if (!shard.ok()) return out;
    ParameterServerService other(shard->get(), ServiceOptions{}, ServiceHooks{});
    PushResponse pushed;
    for (const PushRequest& p : pushes) {
      EXPECT_THAT(other.HandlePush(p, &pushed), ::ps::common::IsOk());
    }
    EXPECT_THAT(other.HandlePull(pull, absl::Now() + absl::Seconds(5), &out), ::ps::common::IsOk());
    return out;
  }

  // Everything this server holds, as bytes, plus its update count.
  std::string State() {
    const PullRequest request = PullAll(/*worker=*/-1);  // a tool: no worker bookkeeping
    PullResponse response;
    EXPECT_THAT(DoPull(request, absl::Now() + absl::Seconds(5), &response), ::ps::common::IsOk());
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
                ::ps::common::StatusIs(code, ::testing::HasSubstr(text)));
    EXPECT_EQ(State(), before) << "state changed by a rejected push";
  }

  uint64_t Rejected(const std::string& reason) {
    StatsResponse stats;
    shard_->FillStats(&stats);
    auto it = stats.rejected().find(reason);
    return it == stats.rejected().end() ? 0 : it->second;
  }

  // ServiceOptions::late_following of service_.
  absl::Duration late_following_ = absl::Milliseconds(10);
  JobConfig config_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ParameterServerService> service_;
  std::vector<uint32_t> mine_, theirs_;
  std::vector<uint64_t> keys_;
  uint64_t other_key_ = 0;
  std::shared_ptr<common::SharedMemory> segment_;   // the shared-memory forms'
  std::unique_ptr<common::SharedChannel> channel_;  // kSharedCalls'
  uint64_t channel_incarnation_ = 1;                // of the process channel_ went to
};

// ---- Forged requests (a client lying about who it is or where it is) ------------------

inline PeerIdentity Peer(PeerRole role, int32_t index) {
  PeerIdentity p;
  p.role = role;
  p.index = index;
  p.authenticated = role != PeerRole::kUnchecked;
  p.name = "test peer";
  return p;
}

// The test suffix of a wire form.
inline std::string WireFormName(const ::testing::TestParamInfo<int>& info) {
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

}  // namespace ps::server

#endif  // PS_SERVER_RPC_SERVICE_TEST_FIXTURE_H_
