// GrpcParameterStore's shared-memory links against a fake server: asks, offers it takes or
// declines.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/rpc/frame.h"
#include "common/rpc/shared_memory.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "worker/rpc/grpc_store.h"
#include "worker/rpc/grpc_store_test_fixture.h"

namespace ps::worker {
namespace {

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
  PushPullResponse answer;
  answer.mutable_push();
  SharedSegment* offer = answer.mutable_shared_offer();
  offer->set_id((*segment)->id());
  offer->set_path((*segment)->path());
  offer->set_bytes((*segment)->size());
  offer->set_boot_id(common::SharedMemory::BootId());
  service_->Answer(common::FrameBuilder(answer).Build());
  ASSERT_TRUE(PushOnce(1).ok());
  ASSERT_TRUE(PushOnce(2).ok());
  ASSERT_TRUE(PushOnce(3).ok());
  EXPECT_EQ(service_->asks(), (std::vector<uint64_t>{1 << 20, 0, 0}));
  EXPECT_EQ(service_->ask_boot_ids()[0], common::SharedMemory::BootId());
  EXPECT_EQ(service_->declines(), (std::vector<uint64_t>{0, (*segment)->id(), 0}));
  EXPECT_EQ(service_->shared(), (std::vector<bool>{false, false, false}));
}

}  // namespace
}  // namespace ps::worker
