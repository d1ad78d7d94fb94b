// Test helpers: a worker's side of the shared-memory wire forms, without sockets. It asks a
// service for a segment as a worker does (a pull of nothing carrying want_shared_bytes), maps
// the offer, moves a frame's payload into the segment, posts frames in the segment's channel
// and takes their answers, so that tests written against PushPull frames can run through the
// segment and the channel too (service_test_fixture.h, tests/bad_input_test.cc).
#ifndef PS_SERVER_RPC_SHARED_WORKER_TESTING_H_
#define PS_SERVER_RPC_SHARED_WORKER_TESTING_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/shared_channel.h"
#include "common/rpc/shared_memory.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/ps.pb.h"
#include "server/rpc/service.h"

namespace ps::server {

// Where the helpers put a push's payload and a pull's answer in a segment, and the segment's
// size they ask for (room for a channel at its end).
inline constexpr uint64_t kTestPushAt = 4096;
inline constexpr uint64_t kTestAnswerAt = 512 * 1024;
inline constexpr uint64_t kTestAnswerEnd = 1 << 20;
inline constexpr uint64_t kTestSegmentBytes = 8 << 20;

// The worker of `header` asks `service` for a segment of kTestSegmentBytes with a pull of
// nothing, by the socket's call: its status, and the answer in *answer.
absl::Status AskForSegment(ParameterServerService& service, const RequestHeader& header,
                           grpc::ByteBuffer* answer);

// A segment a service offered, mapped, and its channel (null when the offer had none).
struct OpenedSegment {
  std::shared_ptr<common::SharedMemory> segment;
  std::unique_ptr<common::SharedChannel> channel;
};
// AskForSegment, then maps the offer. FAILED_PRECONDITION when the service offered none (a
// worker outside the job, an old incarnation, a full budget).
absl::StatusOr<OpenedSegment> OpenSegment(ParameterServerService& service,
                                          const RequestHeader& header);

// `frame` with its payload moved into `segment` at kTestPushAt and the answer's room at
// kTestAnswerAt, as a worker places a call's payloads; INVALID_ARGUMENT for a frame that does
// not parse or a payload larger than that room.
absl::StatusOr<grpc::ByteBuffer> PayloadIntoSegment(common::SharedMemory& segment,
                                                    const grpc::ByteBuffer& frame);
// The answer to a frame of PayloadIntoSegment, its payload taken back out of the segment.
absl::StatusOr<PushPullResponse> AnswerFromSegment(const common::SharedMemory& segment,
                                                   const grpc::ByteBuffer& answer);

// Posts `frame` in a free slot of `channel` and waits for its answer (ChannelAnswer).
absl::Status PostInChannel(common::SharedChannel& channel, const grpc::ByteBuffer& frame,
                           absl::Time deadline, grpc::ByteBuffer* answer);
// The answer posted `slot` of `channel` gets: its status, and its frame in *answer when OK.
// ABORTED when the server closed the slot unserved; DEADLINE_EXCEEDED 5 s past `deadline`.
absl::Status ChannelAnswer(common::SharedChannel& channel, uint32_t slot, absl::Time deadline,
                           grpc::ByteBuffer* answer);

}  // namespace ps::server

#endif  // PS_SERVER_RPC_SHARED_WORKER_TESTING_H_
