// libFuzzer target: PushPull frames, the data path's own wire form, against
// ParameterServerService::HandlePushPull (no gRPC) and through a worker's shared-memory
// channel, over the server of fuzz_env.h, fresh for every input.
//
// Input: byte 0 picks the mode (its low two bits), the rest is its data.
//   mode 0: raw frame bytes. Byte 1 says where gRPC's receive slices cut them (0: one slice,
//           else every byte-1 bytes), the rest is the frame: [uint32 header length][header]
//           [payload]. With bit 2 of byte 0 set, a header that parses gets the right layout
//           fingerprint, so the frame gets past CheckLayout.
//   mode 1: a short sequence (1..4) of calls built field by field (fuzz/requests.h): a push,
//           a pull or both in one frame, its payload cut into slices of a drawn size at odd
//           addresses (common::FrameOf).
//   mode 2: as mode 1, but worker 0 first asks for a segment (too small for a channel), and
//           each call carries its push payload and the room for its answer in the segment, at
//           offsets and sizes drawn mostly valid, sometimes not (outside the payload area, in
//           the reserved bytes, over the other range, another segment's id, payload in the
//           frame too); now and then a worker asks for a segment again.
//   mode 3: as mode 2 with a segment that has a channel, each call posted in a slot of it as
//           a worker posts (common::SharedChannel), the slot's size and timeout drawn mostly
//           right, sometimes not, and served by the server's channel thread.
// Invariants (a violation aborts, which libFuzzer reports as a crash):
//   - every call gets a status (no crash, CHECK failure, sanitizer report or hang; a call
//     posted in a channel is answered within 10 s);
//   - a call counts at most one update; a call that counts none changes no value, no update
//     count and no exactly-once state (fuzz::State before and after; a call without a push
//     may make its worker's incarnation known);
//   - an OK answer parses; it answers the push when the frame had one, and counts one update
//     unless it says the push was a duplicate (then none); a call without a push counts none;
//     the pull's answer has every table asked for with payloads of the asked-for sizes, and
//     when it lies in the segment, it lies in the room the call gave it.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/clock.h"
#include "common/rpc/following_payload.h"
#include "common/rpc/frame_testing.h"
#include "common/rpc/shared_channel.h"
#include "common/rpc/shared_memory.h"
#include "fuzz/fuzz_env.h"
#include "fuzz/requests.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace ps::fuzz {
namespace {

constexpr size_t kSegmentBytes = size_t{256} << 10;
// Large enough for a channel (mode 3).
constexpr size_t kChannelSegmentBytes = common::SharedChannel::kMinSegmentBytes;
// Where a call puts its push payload and its answer's room in the segment, when drawn valid.
constexpr uint64_t kPushAt = 4096;
constexpr uint64_t kAnswerAt = size_t{128} << 10;

// `bytes` as a frame of slices of `cut` bytes (0: one slice).
grpc::ByteBuffer Sliced(const std::string& bytes, size_t cut) {
  if (cut == 0 || bytes.empty()) {
    grpc::Slice slice(bytes);
    return grpc::ByteBuffer(&slice, 1);
  }
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += cut) slices.emplace_back(bytes.substr(at, cut));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The answer of an OK call: its pull payload from the segment when the server wrote it there.
PushPullResponse AnswerOf(const grpc::ByteBuffer& answer, const common::SharedMemory* segment,
                          const SharedPayload& room, const absl::Status& status) {
  const common::FrameParts parts = common::PartsOf(answer);
  PushPullResponse header;
  if (!header.ParseFromString(parts.header)) Fail("an OK answer's header does not parse", status);
  grpc::ByteBuffer whole = answer;
  if (const uint64_t n = header.shared_answer_bytes(); n > 0) {
    if (segment == nullptr || room.answer_capacity() == 0) {
      Fail("an answer in a segment the call gave no room in", status);
    }
    if (n > room.answer_capacity() || !segment->Holds(room.answer_offset(), n)) {
      Fail("an answer written past the room the call gave it", status);
    }
    if (!parts.payload.empty()) Fail("an answer both in the segment and in the frame", status);
    whole = common::RawFrame(parts.header, std::string(segment->data() + room.answer_offset(), n));
  }
  absl::StatusOr<PushPullResponse> parsed = common::AnswerOfFrame(whole);
  if (!parsed.ok()) Fail("an OK answer does not parse", parsed.status());
  return *std::move(parsed);
}

// Serves a frame: its status, and its answer frame when OK.
using Serve = absl::FunctionRef<absl::Status(grpc::ByteBuffer* answer)>;

// A frame served by HandlePushPull, as a gRPC call is. A deadline of now: a pull the
// consistency bound holds back fails at once.
absl::Status ServeCall(Server& s, const grpc::ByteBuffer& frame, grpc::ByteBuffer* answer) {
  return s.service->HandlePushPull(frame, absl::Now(), answer);
}

// Serves a frame with `serve` and checks the invariants. `header`: the frame's header as the
// fuzzer made it or parsed it (nullptr: it does not parse); `keys`: the sparse keys it pushes.
void Run(Server& s, Serve serve, const PushPullRequest* header, const std::vector<uint64_t>& keys,
         const common::SharedMemory* segment) {
  // A pull makes its worker's incarnation known to the server (a restarted worker's first
  // call fences off the old one), so a call without a push may change the workers' state.
  const bool pulls_only = header != nullptr && !header->has_push();
  const std::string before = State(*s.shard, keys, /*with_workers=*/!pulls_only);
  const uint64_t updates_before = s.shard->updates_applied();
  grpc::ByteBuffer answer;
  const absl::Status status = serve(&answer);
  const uint64_t counted = s.shard->updates_applied() - updates_before;
  if (counted > 1) Fail("one call counted more than one update", status);
  if (counted == 0 && State(*s.shard, keys, !pulls_only) != before) {
    Fail("a call that applied no push changed the state", status);
  }
  if (!status.ok() || header == nullptr) return;
  const PushPullResponse got = AnswerOf(answer, segment, header->shared(), status);
  if (header->has_push()) {
    if (!got.has_push()) Fail("a push not answered", status);
    if (counted != (got.push().duplicate() ? 0u : 1u)) {
      Fail("an answered push not counted once (or a duplicate counted)", status);
    }
  } else if (counted != 0) {
    Fail("a call without a push counted an update", status);
  }
  CheckPullAnswer(header->pull(), got.pull(), /*keys_echoed=*/false);
}

// A push, a pull or both: the frame, and its header and payload taken apart.
struct Drawn {
  grpc::ByteBuffer frame;
  common::FrameParts parts;
  // Parsed from parts.header: not when a table name drawn from raw bytes is not UTF-8 (the
  // server refuses the frame as unparseable).
  bool parsed = false;
  PushPullRequest header;
  std::vector<uint64_t> keys;
};

Drawn DrawCall(FuzzedDataProvider& in, uint64_t* next_sequence, size_t cut) {
  const int kind = in.ConsumeIntegralInRange(0, 2);  // push, pull, both
  PushRequest push;
  PullRequest pull;
  if (kind != 1) push = StructuredPush(in, next_sequence);
  if (kind != 0) pull = StructuredPull(in, next_sequence);
  Drawn d;
  d.frame = common::FrameOf(kind != 1 ? &push : nullptr, kind != 0 ? &pull : nullptr, cut);
  d.parts = common::PartsOf(d.frame);
  d.parsed = d.header.ParseFromString(d.parts.header);
  d.keys = KeysOf(push);
  return d;
}

// A segment a worker was given, mapped, and its channel when it has one.
struct Segment {
  std::shared_ptr<common::SharedMemory> memory;
  std::unique_ptr<common::SharedChannel> channel;
  // Where payload ranges end: the channel's offset, or the segment's size.
  uint64_t payload_end = 0;
};

// Worker `worker` (incarnation `incarnation`) asks for a segment of `bytes`; the one offered,
// or none (memory null).
Segment AskForSegment(Server& s, int32_t worker, uint64_t incarnation, size_t bytes) {
  PushPullRequest ask;
  *ask.mutable_header() = Header(worker, 0, 0);
  ask.mutable_header()->set_worker_incarnation(incarnation);
  ask.set_want_shared_bytes(bytes);
  grpc::ByteBuffer answer;
  const absl::Status status = ServeCall(s, common::RawFrame(ask.SerializeAsString(), ""), &answer);
  if (!status.ok()) return {};
  PushPullResponse got;
  if (!got.ParseFromString(common::PartsOf(answer).header)) Fail("an offer does not parse", status);
  if (!got.has_shared_offer()) return {};
  const SharedSegment& offer = got.shared_offer();
  if (offer.bytes() > bytes) Fail("a segment larger than the cap", status);
  auto opened =
      common::SharedMemory::Open(offer.id(), offer.path(), offer.bytes(), offer.boot_id());
  if (!opened.ok()) Fail("an offered segment does not open", opened.status());
  Segment segment;
  segment.memory = *std::move(opened);
  segment.payload_end = segment.memory->size();
  if (offer.channel_offset() != 0) {
    if (!common::SharedChannel::Fits(offer.channel_offset(), offer.bytes())) {
      Fail("a channel offered outside its segment", status);
    }
    segment.channel =
        std::make_unique<common::SharedChannel>(segment.memory, offer.channel_offset());
    segment.payload_end = offer.channel_offset();
  }
  return segment;
}

// Posts `frame` in a slot of `channel` as a worker does, with the slot's size and timeout
// drawn mostly right, sometimes not (beyond the slot, short of the frame, longer than it:
// the slot's older bytes follow), and waits for the answer. A call that pulls gets at most
// 20 ms: a pull the consistency bound holds back is parked until then.
absl::Status Post(FuzzedDataProvider& in, common::SharedChannel& channel,
                  const grpc::ByteBuffer& frame, bool pulls, grpc::ByteBuffer* answer) {
  using common::SharedChannel;
  const std::optional<uint32_t> slot = channel.AcquireSlot();
  if (!slot.has_value()) Fail("no free slot: an answer was never taken", {});
  std::vector<grpc::Slice> slices;
  if (!frame.Dump(&slices).ok()) Fail("a frame that does not dump", {});
  std::string bytes;
  for (const grpc::Slice& piece : slices) {
    bytes.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
  }
  if (bytes.size() > SharedChannel::kRequestBytes) Fail("a drawn frame larger than a slot", {});
  uint32_t claimed = static_cast<uint32_t>(bytes.size());
  switch (9 - in.ConsumeIntegralInRange(0, 9)) {
    case 0:
      claimed = in.ConsumeIntegral<uint32_t>();
      break;
    case 1:
      claimed = SharedChannel::kRequestBytes + 1;
      break;
    case 2:
      claimed = in.ConsumeIntegralInRange<uint32_t>(0, claimed);
      break;
    case 3:
      claimed += in.ConsumeIntegralInRange<uint32_t>(1, 64);
      break;
    default:
      break;
  }
  const uint64_t timeout_us = pulls || in.ConsumeBool() ? in.ConsumeIntegralInRange(0, 20000)
                                                        : in.ConsumeIntegral<uint64_t>();
  channel.PostBytes(*slot, bytes, claimed, timeout_us);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (true) {
    const uint32_t bell = channel.worker_bell();
    std::optional<SharedChannel::Answer> got = channel.TakeAnswer(*slot);
    if (got.has_value()) {
      if (got->status.ok()) *answer = std::move(got->frame);
      return got->status;
    }
    if (absl::Now() > give_up) Fail("a posted call was not answered in 10 s", {});
    SharedChannel::WaitForAnswers({&channel}, {bell}, absl::Now() + absl::Milliseconds(100));
  }
}

// The drawn switches below take the valid value when the input has run out (the provider then
// gives 0).
uint64_t DrawOffset(FuzzedDataProvider& in, uint64_t valid, uint64_t other, size_t segment_bytes) {
  switch (9 - in.ConsumeIntegralInRange(0, 9)) {
    case 0:
      return in.ConsumeIntegral<uint64_t>();
    case 1:
      return segment_bytes - in.ConsumeIntegralInRange<uint64_t>(0, 64);
    case 2:
      return in.ConsumeIntegralInRange<uint64_t>(0, common::SharedMemory::kReservedBytes);
    case 3:
      return other;
    default:
      return valid;
  }
}

uint64_t DrawSize(FuzzedDataProvider& in, uint64_t valid) {
  switch (9 - in.ConsumeIntegralInRange(0, 9)) {
    case 0:
      return in.ConsumeIntegral<uint64_t>();
    case 1:
      return valid + 1;
    case 2:
      return valid > 0 ? valid - 1 : 0;
    case 3:
      return 0;
    default:
      return valid;
  }
}

// Mode 2 (`through_channel` false) and mode 3.
void RunShared(FuzzedDataProvider& in, bool through_channel) {
  const size_t bytes = through_channel ? kChannelSegmentBytes : kSegmentBytes;
  Server s = NewServer(bytes);
  Segment segment = AskForSegment(s, 0, 1, bytes);
  if (segment.memory == nullptr) Fail("no segment offered to a worker of the job", {});
  if (through_channel && segment.channel == nullptr) Fail("no channel in a segment for one", {});
  uint64_t next_sequence = 1;
  const int ops = in.ConsumeIntegralInRange(1, 4);
  for (int i = 0; i < ops && in.remaining_bytes() > 0; ++i) {
    if (in.ConsumeIntegralInRange(0, 7) == 7) {
      // Asks again: worker 0 or 1, this incarnation or another. Worker 0's calls then name
      // the newest segment it was given (an older one's id is unknown to the server, and its
      // channel is closed).
      const int32_t worker = in.ConsumeIntegralInRange(0, 1);
      Segment again = AskForSegment(s, worker, in.ConsumeIntegralInRange<uint64_t>(0, 2), bytes);
      if (worker == 0 && again.memory != nullptr) segment = std::move(again);
      continue;
    }
    Drawn d = DrawCall(in, &next_sequence, 0);
    if (!d.parsed) continue;
    const common::SharedMemory& memory = *segment.memory;
    const uint64_t end = segment.payload_end;
    const size_t n = d.parts.payload.size();
    SharedPayload* sp = d.header.mutable_shared();
    sp->set_segment(in.ConsumeIntegralInRange(0, 15) == 15 ? in.ConsumeIntegral<uint64_t>()
                                                           : memory.id());
    sp->set_push_offset(DrawOffset(in, kPushAt, kAnswerAt, end));
    sp->set_push_bytes(DrawSize(in, n));
    if (memory.Holds(sp->push_offset(), n)) {
      std::memcpy(memory.data() + sp->push_offset(), d.parts.payload.data(), n);
    }
    // Now and then a payload that follows its call: its count in the line before it, mostly
    // all of it (a short count makes the server wait, once per worker: then it refuses). The
    // bytes a short count leaves out hold zeros, finite values that a server reading ahead of
    // the count would apply: such a call must not end OK.
    bool short_count = false;
    if (in.ConsumeIntegralInRange(0, 3) == 3) {
      sp->set_push_follows(true);
      const uint64_t word = sp->push_offset() - common::kFollowingWordBytes;
      if (sp->push_offset() >= common::kFollowingWordBytes && word % 8 == 0 &&
          memory.Holds(word, sizeof(uint64_t))) {
        uint64_t count = n;
        switch (in.ConsumeIntegralInRange(0, 15)) {
          case 14:
            count = in.ConsumeIntegral<uint64_t>();  // anything, mostly past the end
            break;
          case 15:
            count = in.ConsumeIntegralInRange<uint64_t>(0, sp->push_bytes());
            break;
        }
        short_count = count < sp->push_bytes();
        const uint64_t filled = std::min<uint64_t>(n, sp->push_bytes());
        if (short_count && count < filled && memory.Holds(sp->push_offset(), filled)) {
          std::memset(memory.data() + sp->push_offset() + count, 0, filled - count);
        }
        common::FollowingWord(memory.data() + word)->store(count);
      }
    }
    sp->set_answer_offset(DrawOffset(in, kAnswerAt, kPushAt, end));
    sp->set_answer_capacity(DrawSize(in, end - kAnswerAt));
    sp->set_stream_answer(in.ConsumeBool());
    sp->set_time_call(in.ConsumeBool());
    // The payload in the frame as well as in the segment, now and then: refused.
    const std::string in_frame = in.ConsumeIntegralInRange(0, 15) == 15 ? d.parts.payload : "";
    const grpc::ByteBuffer frame = common::RawFrame(d.header.SerializeAsString(), in_frame);
    absl::Status last;
    // A frame without a push is a pull (of no table, it waits for the bound all the same).
    const bool pulls = d.header.pull_size() > 0 || !d.header.has_push();
    if (segment.channel == nullptr) {
      Run(
          s,
          [&](grpc::ByteBuffer* answer) {
            last = ServeCall(s, frame, answer);
            return last;
          },
          &d.header, d.keys, &memory);
    } else {
      common::SharedChannel& channel = *segment.channel;
      Run(
          s,
          [&](grpc::ByteBuffer* answer) {
            last = Post(in, channel, frame, pulls, answer);
            return last;
          },
          &d.header, d.keys, &memory);
    }
    if (short_count && last.ok()) Fail("a push whose following payload fell short ended OK", last);
  }
}

void RunRaw(uint8_t flags, uint8_t cut, std::string bytes) {
  Server s = NewServer(kSegmentBytes);
  PushPullRequest header;
  common::FrameParts parts;
  if (bytes.size() >= 4) parts = common::PartsOf(Sliced(bytes, 0));
  // PartsOf gives nothing for a frame shorter than its header length says.
  const bool parsed = bytes.size() >= 4 &&
                      parts.header.size() + 4 + parts.payload.size() == bytes.size() &&
                      header.ParseFromString(parts.header);
  if (parsed && (flags & 4) != 0) {
    header.mutable_header()->set_layout_fingerprint(GetLayout().fingerprint);
    bytes = common::RawFrameBytes(header.SerializeAsString(), parts.payload);
  }
  std::vector<uint64_t> keys;
  for (const TableValues& t : header.push())
    keys.insert(keys.end(), t.keys().begin(), t.keys().end());
  // The answer is checked against the header as parsed here, when it parses.
  const grpc::ByteBuffer frame = Sliced(bytes, cut);
  Run(
      s, [&](grpc::ByteBuffer* answer) { return ServeCall(s, frame, answer); },
      parsed ? &header : nullptr, keys, nullptr);
}

void RunStructured(FuzzedDataProvider& in) {
  Server s = NewServer(kSegmentBytes);
  uint64_t next_sequence = 1;
  const int ops = in.ConsumeIntegralInRange(1, 4);
  for (int i = 0; i < ops && in.remaining_bytes() > 0; ++i) {
    const size_t cut = in.ConsumeIntegralInRange(0, 3) == 0 ? in.ConsumeIntegralInRange(1, 64) : 0;
    const Drawn d = DrawCall(in, &next_sequence, cut);
    Run(
        s, [&](grpc::ByteBuffer* answer) { return ServeCall(s, d.frame, answer); },
        d.parsed ? &d.header : nullptr, d.keys, nullptr);
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> Seeds() {
  std::vector<std::pair<std::string, std::string>> seeds;
  // Raw frames (mode 0, header fixed), cut every `cut` bytes.
  auto add_frame = [&](const std::string& name, const PushRequest* push, const PullRequest* pull,
                       char cut) {
    const common::FrameParts parts = common::PartsOf(common::FrameOf(push, pull));
    seeds.emplace_back(name,
                       std::string{4, cut} + common::RawFrameBytes(parts.header, parts.payload));
  };
  PushRequest push = ValidPush(0, 1, 1, 0.5f, 2, -0.25f);
  const PullRequest pull = ValidPull(0, 1, 3, ENCODING_FP16);
  add_frame("frame_push_pull", &push, &pull, 0);
  add_frame("frame_push_pull_cut", &push, &pull, 7);
  add_frame("frame_push", &push, nullptr, 3);
  add_frame("frame_pull", nullptr, &pull, 0);
  push.set_is_delta(true);
  add_frame("frame_delta", &push, nullptr, 0);
  // Structured calls (modes 1 to 3): any bytes decode to some call sequence.
  for (int i = 0; i < 6; ++i) {
    std::string body(1, static_cast<char>(1 + i % 3));
    for (int j = 0; j < 64; ++j) body.push_back(static_cast<char>((j * 37 + i * 101) & 0xff));
    seeds.emplace_back("structured_" + std::to_string(i), body);
  }
  return seeds;
}

}  // namespace ps::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  ps::fuzz::InitializeFuzzer(ps::fuzz::Seeds());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int mode = data[0] & 3;
  if (mode == 0) {
    ps::fuzz::RunRaw(data[0], data[1],
                     std::string(reinterpret_cast<const char*>(data + 2), size - 2));
    return 0;
  }
  FuzzedDataProvider in(data + 1, size - 1);
  if (mode == 1) {
    ps::fuzz::RunStructured(in);
  } else {
    ps::fuzz::RunShared(in, /*through_channel=*/mode == 3);
  }
  return 0;
}
