// GrpcParameterStore's shared-memory links against a fake server: asks, offers it takes or
// declines, and when its payloads follow their calls.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/rpc/descriptor_testing.h"
#include "common/rpc/frame.h"
#include "common/rpc/frame_testing.h"
#include "common/rpc/shared_channel.h"
#include "common/rpc/shared_memory.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "worker/rpc/grpc_store.h"
#include "worker/rpc/grpc_store_test_fixture.h"

namespace ps::worker {
namespace {

// A push's answer that offers `segment`, as a server that made it for this worker.
PushPullResponse OfferOf(const common::SharedMemory& segment) {
  PushPullResponse answer;
  answer.mutable_push();
  SharedSegment* offer = answer.mutable_shared_offer();
  offer->set_id(segment.id());
  offer->set_path(segment.path());
  offer->set_bytes(segment.size());
  offer->set_boot_id(common::SharedMemory::BootId());
  return answer;
}

// A call that asked for shared memory and failed is retried without the ask: each ask makes
// a server replace the worker's segment, so a repeated one could replace the segment a later
// call's ask got. The next call asks (this server answered no offer: the link stays unasked,
// not off, after the retry).
TEST_F(GrpcStoreTest, AFailedAskIsNotRepeatedByItsRetries) {
  GrpcStoreOptions options = FastRetries();
  options.shared_memory_bytes = 1 << 20;
  Start(/*fail_pushes=*/1, options);
  ASSERT_TRUE(PushOnce(1).ok());
  ASSERT_TRUE(PushOnce(2).ok());
  EXPECT_EQ(service_->asks(), (std::vector<uint64_t>{1 << 20, 0, 1 << 20}));
}

// An offer this process cannot open (here: more bytes than it asked for, which a lying server
// could use to have it map any size; elsewhere another host's or container's segment) is not
// used, and the next call to that server says so (declined_shared_id), so that the server lets
// it go: before, a worker in another container left its segment charged against the server's
// memory budget for the whole job. The ask carries the worker's boot id.
TEST_F(GrpcStoreTest, AnOfferThatCannotBeOpenedHereIsDeclinedInTheNextCall) {
  GrpcStoreOptions options = FastRetries();
  options.shared_memory_bytes = 1 << 20;
  Start(/*fail_pushes=*/0, options);
  auto segment = common::SharedMemory::Create(2 << 20);
  ASSERT_TRUE(segment.ok()) << segment.status();
  service_->Answer(common::FrameBuilder(OfferOf(**segment)).Build());
  ASSERT_TRUE(PushOnce(1).ok());
  ASSERT_TRUE(PushOnce(2).ok());
  ASSERT_TRUE(PushOnce(3).ok());
  EXPECT_EQ(service_->asks(), (std::vector<uint64_t>{1 << 20, 0, 0}));
  EXPECT_EQ(service_->ask_boot_ids()[0], common::SharedMemory::BootId());
  EXPECT_EQ(service_->declines(), (std::vector<uint64_t>{0, (*segment)->id(), 0}));
  EXPECT_EQ(service_->shared(), (std::vector<bool>{false, false, false}));
}

// An offer this process cannot map for now, for want of descriptors (EMFILE: here no
// descriptor can be made while the call is answered), is declined in the
// next call as another host's would be, but asked for again once the wait after a declined ask
// has passed, and the new segment is used. Before, a passing EMFILE counted as a segment this
// host can never open, and the worker sent every payload by the socket for the rest of the job.
TEST_F(GrpcStoreTest, AnOfferNotMappedForWantOfDescriptorsIsAskedForAgain) {
  GrpcStoreOptions options = FastRetries();
  options.shared_memory_bytes = 1 << 20;
  options.shared_memory_reask = absl::Milliseconds(1);
  Start(/*fail_pushes=*/0, options);
  auto first = common::SharedMemory::Create(1 << 20);
  auto second = common::SharedMemory::Create(1 << 20);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  // The first call, answered without an offer, makes the store's call machinery (whatever
  // descriptors it needs) before the limit is lowered.
  ASSERT_TRUE(PushOnce(1).ok());
  absl::SleepFor(absl::Milliseconds(20));
  service_->Answer(common::FrameBuilder(OfferOf(**first)).Build());
  absl::Status answered;
  {
    common::OutOfDescriptors out;
    ASSERT_TRUE(out.ok());
    answered = PushOnce(2);
  }
  ASSERT_TRUE(answered.ok()) << answered;
  absl::SleepFor(absl::Milliseconds(20));
  service_->Answer(common::FrameBuilder(OfferOf(**second)).Build());
  ASSERT_TRUE(PushOnce(3).ok());
  ASSERT_TRUE(PushOnce(4).ok());
  EXPECT_EQ(service_->asks(), (std::vector<uint64_t>{1 << 20, 1 << 20, 1 << 20, 0}));
  EXPECT_EQ(service_->declines(), (std::vector<uint64_t>{0, 0, (*first)->id(), 0}));
  EXPECT_EQ(service_->shared(), (std::vector<bool>{false, false, false, true}));
}

// A call that fails at one server gives up the shared memory of that server only: the other
// server answered, so it is done with its part of the segment, and the next call goes
// through that segment without asking again. Before, every link the call used was given up,
// and each server was asked for a new segment (made and first touched again, and the buffers
// lent in the old one revoked).
TEST_F(GrpcStoreTest, ACallFailingAtOneServerKeepsTheOtherServersSegment) {
  service_ = std::make_unique<RecordingServer>(0, grpc::StatusCode::INVALID_ARGUMENT, false);
  JobConfig config;
  config.mutable_cluster()->set_num_servers(2);
  config.mutable_cluster()->add_servers("in-process");
  config.mutable_cluster()->add_servers("in-process");
  config.mutable_cluster()->set_num_workers(1);
  config.mutable_cluster()->set_dense_block_floats(1024);  // one block on each server
  TableConfig* g = config.add_tables();
  g->set_name("g");
  g->add_shape(2048);
  ASSERT_TRUE(common::ExpandModelTables(&config).ok());
  GrpcStoreOptions options = FastRetries();
  options.shared_memory_bytes = 1 << 20;
  StartInProcess(service_.get(), 2, config, options, &server_, &store_);
  // Both servers offer (this fake one) segment; each link maps it for itself.
  auto segment = common::SharedMemory::Create(1 << 20);
  ASSERT_TRUE(segment.ok()) << segment.status();
  service_->Answer(common::FrameBuilder(OfferOf(**segment)).Build());
  const std::vector<float> gradient(2048, 1e-3f);
  auto push = [&](int64_t clock) {
    common::PushBatch batch;
    batch.dense.push_back({"g", gradient});
    return store_->Push(batch, common::PushOptions{clock, false});
  };
  ASSERT_TRUE(push(1).ok());  // both ask, by the socket
  service_->FailPushes(1);
  EXPECT_EQ(push(2).code(), absl::StatusCode::kInvalidArgument);  // one frame refused
  ASSERT_TRUE(push(3).ok());
  ASSERT_TRUE(push(4).ok());
  const std::vector<uint64_t> asks = service_->asks();
  const std::vector<bool> shared = service_->shared();
  ASSERT_EQ(asks.size(), 8u);
  // Two frames a call, in the order they arrived: the first call's both ask, the second's
  // both go through the segments, and in the third only the refused server is asked again.
  EXPECT_EQ(std::vector<uint64_t>(asks.begin(), asks.begin() + 4),
            (std::vector<uint64_t>{1 << 20, 1 << 20, 0, 0}));
  EXPECT_EQ(std::vector<bool>(shared.begin(), shared.begin() + 4),
            (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ((asks[4] != 0) + (asks[5] != 0), 1);
  EXPECT_EQ(shared[4] + shared[5], 1);
  EXPECT_EQ(std::vector<bool>(shared.begin() + 6, shared.end()), (std::vector<bool>{true, true}));
}

// An answer the worker refuses (here: a payload byte no block accounts for) does not steer
// it, whatever it offers: the offer is not taken, and the next call asks again by the socket.
// Before, the offer was mapped before the answer's lengths were checked, and the next calls
// went through that segment.
TEST_F(GrpcStoreTest, AnOfferInARefusedAnswerIsNotTaken) {
  GrpcStoreOptions options = FastRetries();
  options.shared_memory_bytes = 1 << 20;
  Start(/*fail_pushes=*/0, options);
  auto segment = common::SharedMemory::Create(1 << 20);
  ASSERT_TRUE(segment.ok()) << segment.status();
  common::FrameBuilder refused(OfferOf(**segment));
  refused.AddSlice(grpc::Slice(std::string("x")));
  service_->Answer(refused.Build());
  EXPECT_EQ(PushOnce(1).code(), absl::StatusCode::kInternal);
  service_->Answer(common::FrameBuilder(PushPullResponse()).Build());
  ASSERT_TRUE(PushOnce(2).ok());
  EXPECT_EQ(service_->asks(), (std::vector<uint64_t>{1 << 20, 1 << 20}));
  EXPECT_EQ(service_->shared(), (std::vector<bool>{false, false}));
}

// A server that paused this worker for a payload that came late offers its next segment with
// push_may_follow_later and without push_may_follow: the worker's payloads then go whole until
// an answer through the segment says they may follow, and follow after it. An offer with
// neither (a server that takes no payload after its call) is never followed on, whatever its
// answers say. The test serves the segment's channel itself, every answer saying yes.
TEST_F(GrpcStoreTest, APausedWorkerFollowsOnceAnAnswerSaysItMay) {
  for (const bool later : {true, false}) {
    SCOPED_TRACE(later);
    TearDown();
    Start(/*fail_pushes=*/0);
    JobConfig config;
    config.mutable_cluster()->set_num_servers(1);
    config.mutable_cluster()->add_servers("in-process");
    config.mutable_cluster()->set_num_workers(1);
    TableConfig* g = config.add_tables();
    g->set_name("g");
    g->add_shape(65536);  // 256 KB: a payload that may follow its call
    ASSERT_TRUE(common::ExpandModelTables(&config).ok());
    auto segment = common::SharedMemory::Create(16 << 20);
    ASSERT_TRUE(segment.ok()) << segment.status();
    const std::optional<uint64_t> at = common::SharedChannel::OffsetFor((*segment)->size());
    ASSERT_TRUE(at.has_value());
    common::SharedChannel channel(*segment, *at);
    PushPullResponse answer = OfferOf(**segment);
    SharedSegment* offer = answer.mutable_shared_offer();
    offer->set_channel_offset(*at);
    offer->set_push_may_follow(false);
    offer->set_push_may_follow_later(later);
    service_->Answer(common::FrameBuilder(answer).Build());

    GrpcStoreOptions options = FastRetries();
    options.shared_memory_bytes = 16 << 20;
    auto store = GrpcParameterStore::CreateWithChannels(
        config, options, {server_->InProcessChannel(grpc::ChannelArguments())});
    ASSERT_TRUE(store.ok()) << store.status();

    // The channel's server: answers every call at once, saying the next payload may follow,
    // and notes whether each call's payload followed it.
    std::atomic<bool> stop{false};
    absl::Mutex mu;
    std::vector<bool> followed;
    std::thread server([&] {
      PushPullResponse yes;
      yes.mutable_push();
      yes.set_push_may_follow(true);
      const grpc::ByteBuffer frame = common::FrameBuilder(yes).Build();
      while (!stop.load()) {
        const uint32_t bell = channel.server_bell();
        for (uint32_t slot = 0; slot < common::SharedChannel::kSlots; ++slot) {
          std::optional<common::SharedChannel::Request> request = channel.TakeRequest(slot);
          if (!request.has_value()) continue;
          PushPullRequest header;
          EXPECT_TRUE(header.ParseFromString(common::PartsOf(request->frame).header));
          {
            absl::MutexLock lock(&mu);
            followed.push_back(header.shared().push_follows());
          }
          channel.WriteAnswer(slot, absl::OkStatus(), &frame, /*server_busy=*/false);
        }
        channel.WaitForRequests(bell, absl::Now() + absl::Milliseconds(10));
      }
    });
    const std::vector<float> gradient(65536, 1e-3f);
    for (int64_t clock = 1; clock <= 4; ++clock) {
      common::PushBatch batch;
      batch.dense.push_back({"g", gradient});
      EXPECT_TRUE((*store)->Push(batch, common::PushOptions{clock, false}).ok());
    }
    stop = true;
    channel.RingServer();
    server.join();
    EXPECT_EQ(service_->asks().size(), 1u);  // the first call, by the socket: the offer
    absl::MutexLock lock(&mu);
    const std::vector<bool> expected =
        later ? std::vector<bool>{false, true, true} : std::vector<bool>{false, false, false};
    EXPECT_EQ(followed, expected);
  }
}

}  // namespace
}  // namespace ps::worker
