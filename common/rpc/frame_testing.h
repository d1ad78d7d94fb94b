// Test helpers: PushPull frames to and from the protobuf messages they stand for, so that
// tests written against Push/Pull messages can run through the frame path too.
#ifndef PS_COMMON_RPC_FRAME_TESTING_H_
#define PS_COMMON_RPC_FRAME_TESTING_H_

#include <string>

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

// A frame's serialized header and its payload bytes, taken apart (both empty when the frame
// is shorter than its header length says).
struct FrameParts {
  std::string header;
  std::string payload;
};
FrameParts PartsOf(const grpc::ByteBuffer& frame);
// The bytes of a frame of `header` followed by `payload`, built by hand (no check that the
// header parses), and those bytes as a frame of one slice.
std::string RawFrameBytes(const std::string& header, const std::string& payload);
grpc::ByteBuffer RawFrame(const std::string& header, const std::string& payload);

}  // namespace ps::common

#endif  // PS_COMMON_RPC_FRAME_TESTING_H_
