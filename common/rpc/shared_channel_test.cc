#include "common/rpc/shared_channel.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "common/rpc/descriptor_testing.h"
#include "common/rpc/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

std::string String(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string s;
  for (const grpc::Slice& piece : slices) {
    s.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
  }
  return s;
}

// The server's and the worker's ends of one channel: two mappings of one segment, as in two
// processes.
struct Ends {
  Ends() {
    const size_t bytes = SharedChannel::kMinSegmentBytes;
    std::shared_ptr<SharedMemory> made = *SharedMemory::Create(bytes);
    std::shared_ptr<SharedMemory> opened =
        *SharedMemory::Open(made->id(), made->path(), bytes, SharedMemory::BootId());
    const uint64_t at = *SharedChannel::OffsetFor(bytes);
    server = std::make_unique<SharedChannel>(made, at);
    worker = std::make_unique<SharedChannel>(opened, at);
  }
  std::unique_ptr<SharedChannel> server, worker;
};

TEST(SharedChannel, OnlySegmentsWithRoomGetOneAtTheirAlignedEnd) {
  EXPECT_FALSE(SharedChannel::OffsetFor(SharedChannel::kMinSegmentBytes - 1).has_value());
  const size_t bytes = SharedChannel::kMinSegmentBytes + 100;
  const uint64_t at = *SharedChannel::OffsetFor(bytes);
  EXPECT_EQ(at % 64, 0u);
  EXPECT_TRUE(SharedChannel::Fits(at, bytes));
  EXPECT_GE(bytes - at, SharedChannel::kBytes);
  EXPECT_FALSE(SharedChannel::Fits(at + 64, bytes));  // past the end
  EXPECT_FALSE(SharedChannel::Fits(at + 1, bytes));   // not aligned
  EXPECT_FALSE(SharedChannel::Fits(0, bytes));        // over the segment's id
}

TEST(SharedChannel, ARequestAndItsAnswerCrossBetweenTheMappings) {
  Ends ends;
  std::optional<uint32_t> slot = ends.worker->AcquireSlot();
  ASSERT_TRUE(slot.has_value());
  const uint32_t answered = ends.worker->worker_bell();
  std::thread server([&] {
    std::optional<SharedChannel::Request> request;
    while (!(request = ends.server->TakeRequest(*slot)).has_value()) {
      ends.server->WaitForRequests(ends.server->server_bell(), absl::Now() + absl::Seconds(1));
    }
    ASSERT_TRUE(request->status.ok());
    EXPECT_EQ(String(request->frame), "request");
    EXPECT_GT(request->timeout, absl::Seconds(4));
    EXPECT_FALSE(ends.server->TakeRequest(*slot).has_value());  // taken once
    const grpc::ByteBuffer answer = Bytes("answer");
    ends.server->WriteAnswer(*slot, absl::OkStatus(), &answer, false);
  });
  ends.worker->Post(*slot, Bytes("request"), absl::Seconds(5));
  std::optional<SharedChannel::Answer> answer;
  while (!(answer = ends.worker->TakeAnswer(*slot)).has_value()) {
    SharedChannel::WaitForAnswers({ends.worker.get()}, {answered}, absl::Now() + absl::Seconds(5));
  }
  server.join();
  ASSERT_TRUE(answer->status.ok());
  EXPECT_EQ(String(answer->frame), "answer");
  EXPECT_FALSE(ends.worker->TakeAnswer(*slot).has_value());  // read once; the slot is free
}

TEST(SharedChannel, EachSlotIsHandedOutOnceUntilItsAnswerIsTaken) {
  Ends ends;
  std::vector<uint32_t> slots;
  while (std::optional<uint32_t> s = ends.worker->AcquireSlot()) slots.push_back(*s);
  EXPECT_EQ(slots.size(), SharedChannel::kSlots);
  ends.worker->Post(slots[3], Bytes("x"), absl::Seconds(1));
  EXPECT_FALSE(ends.worker->AcquireSlot().has_value());  // posted, not answered
  ASSERT_TRUE(ends.server->TakeRequest(slots[3]).has_value());
  ends.server->WriteAnswer(slots[3], absl::NotFoundError("no table"), nullptr, false);
  std::optional<SharedChannel::Answer> answer = ends.worker->TakeAnswer(slots[3]);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status, absl::NotFoundError("no table"));
  EXPECT_EQ(ends.worker->AcquireSlot(), std::optional<uint32_t>(slots[3]));
}

// A server's status message is any bytes it writes: the worker keeps a safe one (capped,
// valid UTF-8, one line), as for answers by the socket (PeerMessage).
TEST(SharedChannel, AServersStatusMessageIsMadeSafe) {
  Ends ends;
  const uint32_t slot = *ends.worker->AcquireSlot();
  ends.worker->Post(slot, Bytes("x"), absl::Seconds(1));
  ASSERT_TRUE(ends.server->TakeRequest(slot).has_value());
  ends.server->WriteAnswer(slot, absl::UnavailableError("\xff\xfe\n" + std::string(60000, 'x')),
                           nullptr, false);
  std::optional<SharedChannel::Answer> answer = ends.worker->TakeAnswer(slot);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_LE(answer->status.message().size(), kMaxPeerMessageBytes + 40);
  EXPECT_EQ(answer->status.message().substr(0, 4), "?? x");
}

// A status without a message is answered as such (its empty message's data may be null:
// copied, it was undefined behaviour, which the channel answer fuzzer's UBSan stopped on).
TEST(SharedChannel, AStatusWithoutAMessageIsAnswered) {
  Ends ends;
  const uint32_t slot = *ends.worker->AcquireSlot();
  ends.worker->Post(slot, Bytes("x"), absl::Seconds(1));
  ASSERT_TRUE(ends.server->TakeRequest(slot).has_value());
  ends.server->WriteAnswer(slot, absl::Status(absl::StatusCode::kCancelled, ""), nullptr, false);
  std::optional<SharedChannel::Answer> answer = ends.worker->TakeAnswer(slot);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(answer->status.message(), "");
}

TEST(SharedChannel, AnAnswerTooLargeForTheSlotComesBackAborted) {
  Ends ends;
  const uint32_t slot = *ends.worker->AcquireSlot();
  ends.worker->Post(slot, Bytes("x"), absl::Seconds(1));
  ASSERT_TRUE(ends.server->TakeRequest(slot).has_value());
  const grpc::ByteBuffer big = Bytes(std::string(SharedChannel::kAnswerBytes + 1, 'a'));
  ends.server->WriteAnswer(slot, absl::OkStatus(), &big, /*server_busy=*/true);
  std::optional<SharedChannel::Answer> answer = ends.worker->TakeAnswer(slot);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(answer->server_busy);
}

TEST(SharedChannel, ClosingLeavesPostedCallsUnservedAndWakesTheWorker) {
  Ends ends;
  const uint32_t taken = *ends.worker->AcquireSlot();
  const uint32_t waiting = *ends.worker->AcquireSlot();
  ends.worker->Post(taken, Bytes("a"), absl::Seconds(1));
  ends.worker->Post(waiting, Bytes("b"), absl::Seconds(1));
  ASSERT_TRUE(ends.server->TakeRequest(taken).has_value());
  EXPECT_FALSE(ends.worker->Unserved(waiting));  // open: it may still be served
  const uint32_t bell = ends.worker->worker_bell();
  std::thread closer([&] { ends.server->Close(); });
  SharedChannel::WaitForAnswers({ends.worker.get()}, {bell}, absl::Now() + absl::Seconds(30));
  closer.join();
  EXPECT_NE(ends.worker->worker_bell(), bell);
  EXPECT_TRUE(ends.worker->Unserved(waiting));
  EXPECT_FALSE(ends.worker->Unserved(taken));  // being served: its answer still comes
}

TEST(SharedChannel, AWorkerWaitsOnSeveralChannelsAtOnce) {
  Ends a, b;
  const uint32_t slot = *b.worker->AcquireSlot();
  b.worker->Post(slot, Bytes("x"), absl::Seconds(1));
  const uint32_t bell_a = a.worker->worker_bell(), bell_b = b.worker->worker_bell();
  std::thread server([&] {
    ASSERT_TRUE(b.server->TakeRequest(slot).has_value());
    const grpc::ByteBuffer answer = Bytes("y");
    b.server->WriteAnswer(slot, absl::OkStatus(), &answer, false);
  });
  const absl::Time start = absl::Now();
  SharedChannel::WaitForAnswers({a.worker.get(), b.worker.get()}, {bell_a, bell_b},
                                absl::Now() + absl::Seconds(30));
  server.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "woken by the deadline, not the bell";
  EXPECT_TRUE(b.worker->TakeAnswer(slot).has_value());
}

TEST(SharedChannel, AWorkerTellsWhenTheServerProcessIsGone) {
  EXPECT_EQ(SharedChannel::PidOfPath("/proc/123/fd/7"), std::optional<int>(123));
  EXPECT_FALSE(SharedChannel::PidOfPath("/proc/self/fd/7").has_value());
  EXPECT_FALSE(SharedChannel::PidOfPath("/tmp/123/fd/7").has_value());
  EXPECT_FALSE(SharedChannel::PidOfPath("/proc/-4/fd/7").has_value());
  Ends ends;
  EXPECT_FALSE(ends.worker->ServerGone());  // none watched
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  ends.worker->WatchServer(child);
  EXPECT_FALSE(ends.worker->ServerGone());
  // Out of descriptors, this process cannot read /proc: a live server is not taken for gone
  // (it was before, found in review 2026-12-06: the worker then gave up its segment).
  {
    OutOfDescriptors out;
    ASSERT_TRUE(out.ok());
    EXPECT_FALSE(ends.worker->ServerGone());
  }
  kill(child, SIGKILL);
  // Dead but not reaped (a zombie) is gone already; reaped, its /proc entry is gone too.
  while (!ends.worker->ServerGone()) absl::SleepFor(absl::Milliseconds(1));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(ends.worker->ServerGone());
  // ... but one that no longer exists still is, descriptors or not.
  {
    OutOfDescriptors out;
    ASSERT_TRUE(out.ok());
    EXPECT_TRUE(ends.worker->ServerGone());
  }
  ends.worker->WatchServer(getpid());
  EXPECT_FALSE(ends.worker->ServerGone());
}

}  // namespace
}  // namespace ps::common
