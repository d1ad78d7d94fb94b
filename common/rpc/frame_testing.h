// Test helpers: PushPull frames to and from the protobuf messages they stand for, so that
// tests written against Push/Pull messages can run through the frame path too.
#ifndef PS_COMMON_RPC_FRAME_TESTING_H_
#define PS_COMMON_RPC_FRAME_TESTING_H_

#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/ps.pb.h"

namespace ps::common {

// A PushPull frame carrying `push` (its payload bytes moved behind the header) and, when
// `pull` is not null, that pull (at pull->header().clock). With cut_every > 0 the payload
// comes in slices of that many bytes, each at an odd address, as gRPC's receive slices may
// cut it anywhere (inside a value too).
grpc::ByteBuffer FrameOf(const PushRequest* push, const PullRequest* pull, size_t cut_every = 0);
// The push a PushPull request frame carries, payloads back in the bytes fields.
absl::StatusOr<PushRequest> PushOfFrame(const grpc::ByteBuffer& frame);
// The answer a PushPull response frame carries, payloads back in the bytes fields.
absl::StatusOr<PushPullResponse> AnswerOfFrame(const grpc::ByteBuffer& frame);

}  // namespace ps::common

#endif  // PS_COMMON_RPC_FRAME_TESTING_H_
