#include "server/rpc/shared_worker_testing.h"

#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "common/rpc/frame_testing.h"
#include "common/status_macros.h"

namespace ps::server {

using ::ps::common::FrameParts;
using ::ps::common::PartsOf;
using ::ps::common::RawFrame;

absl::Status AskForSegment(ParameterServerService& service, const RequestHeader& header,
                           grpc::ByteBuffer* answer) {
  PushPullRequest ask;
  *ask.mutable_header() = header;
  ask.set_want_shared_bytes(kTestSegmentBytes);
  return service.HandlePushPull(RawFrame(ask.SerializeAsString(), ""),
                                absl::Now() + absl::Seconds(5), answer);
}

absl::StatusOr<OpenedSegment> OpenSegment(ParameterServerService& service,
                                          const RequestHeader& header) {
  grpc::ByteBuffer answer;
  RETURN_IF_ERROR(AskForSegment(service, header, &answer));
  PushPullResponse response;
  if (!response.ParseFromString(PartsOf(answer).header)) {
    return absl::InternalError("the answer to an ask does not parse");
  }
  if (!response.has_shared_offer()) return absl::FailedPreconditionError("no segment offered");
  const SharedSegment& offer = response.shared_offer();
  OpenedSegment opened;
  ASSIGN_OR_RETURN(opened.segment, common::SharedMemory::Open(offer.id(), offer.path(),
                                                              offer.bytes(), offer.boot_id()));
  if (offer.channel_offset() != 0) {
    if (!common::SharedChannel::Fits(offer.channel_offset(), opened.segment->size())) {
      return absl::InternalError("the offered channel does not fit its segment");
    }
    opened.channel =
        std::make_unique<common::SharedChannel>(opened.segment, offer.channel_offset());
  }
  return opened;
}

absl::StatusOr<grpc::ByteBuffer> PayloadIntoSegment(common::SharedMemory& segment,
                                                    const grpc::ByteBuffer& frame) {
  FrameParts parts = PartsOf(frame);
  PushPullRequest header;
  if (!header.ParseFromString(parts.header)) return absl::InvalidArgumentError("frame header");
  if (parts.payload.size() > kTestAnswerAt - kTestPushAt) {
    return absl::InvalidArgumentError("payload larger than the room the helpers give it");
  }
  std::memcpy(segment.data() + kTestPushAt, parts.payload.data(), parts.payload.size());
  SharedPayload* sp = header.mutable_shared();
  sp->set_segment(segment.id());
  sp->set_push_offset(kTestPushAt);
  sp->set_push_bytes(parts.payload.size());
  sp->set_answer_offset(kTestAnswerAt);
  sp->set_answer_capacity(kTestAnswerEnd - kTestAnswerAt);
  return RawFrame(header.SerializeAsString(), "");
}

absl::StatusOr<PushPullResponse> AnswerFromSegment(const common::SharedMemory& segment,
                                                   const grpc::ByteBuffer& answer) {
  FrameParts parts = PartsOf(answer);
  PushPullResponse header;
  if (!header.ParseFromString(parts.header)) return absl::InternalError("answer header");
  if (header.shared_answer_bytes() == 0) return common::AnswerOfFrame(answer);
  if (!parts.payload.empty()) return absl::InternalError("an answer in the segment and the frame");
  const uint64_t n = header.shared_answer_bytes();
  if (n > kTestAnswerEnd - kTestAnswerAt) return absl::InternalError("answer past its room");
  header.clear_shared_answer_bytes();
  return common::AnswerOfFrame(
      RawFrame(header.SerializeAsString(), std::string(segment.data() + kTestAnswerAt, n)));
}

absl::Status PostInChannel(common::SharedChannel& channel, const grpc::ByteBuffer& frame,
                           absl::Time deadline, grpc::ByteBuffer* answer) {
  std::optional<uint32_t> slot = channel.AcquireSlot();
  if (!slot.has_value()) return absl::InternalError("no free channel slot");
  channel.Post(*slot, frame, deadline - absl::Now());
  return ChannelAnswer(channel, *slot, deadline, answer);
}

absl::Status ChannelAnswer(common::SharedChannel& channel, uint32_t slot, absl::Time deadline,
                           grpc::ByteBuffer* answer) {
  while (true) {
    const uint32_t bell = channel.worker_bell();
    std::optional<common::SharedChannel::Answer> a = channel.TakeAnswer(slot);
    if (a.has_value()) {
      if (a->status.ok()) *answer = std::move(a->frame);
      return a->status;
    }
    if (channel.Unserved(slot)) return absl::AbortedError("closed: not this worker's");
    common::SharedChannel::WaitForAnswers({&channel}, {bell}, deadline + absl::Seconds(5));
    if (absl::Now() > deadline + absl::Seconds(5)) {
      return absl::DeadlineExceededError("no answer in the channel");
    }
  }
}

}  // namespace ps::server
