// A server on the worker's host that lies through the shared-memory channel of the segments it
// offers (common/rpc/shared_channel.h), for channel_answer_fuzzer: it answers by the socket
// (honestly, offering a segment with a channel to a worker that asks) and serves the posted
// slots of every channel it offered with a thread of its own, each slot as the next Action
// says: answers and statuses written as a server writes them, or the slot's fields and bells
// written raw. It may also ring the worker's bells without end, and flip bytes of the latest
// answer while the worker reads it.
#ifndef PS_FUZZ_RPC_LYING_CHANNEL_H_
#define PS_FUZZ_RPC_LYING_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/partitioner.h"
#include "common/rpc/shared_channel.h"
#include "common/rpc/shared_memory.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/ps.pb.h"

namespace ps::fuzz {

// What the server thread does with the next posted slot it finds.
enum Act : uint8_t {
  kHonest,          // the pull's values in the frame or in the answer's room in the segment
  kLie,             // the values said to lie in the segment in a size of its own
  kGarbage,         // raw bytes as the frame
  kCut,             // the honest frame cut short, or a byte of it flipped
  kTooLarge,        // more than kAnswerBytes: written as ABORTED ("send it by the socket")
  kStatus,          // a status, code 1..16, any message bytes
  kRaw,             // the slot's answer fields written raw, state kAnswered
  kClose,           // the channel closed, the request left posted (Unserved)
  kCloseThenServe,  // closed, then taken and answered honestly
  kSilent,          // taken, never answered
  kIgnore,          // never taken
  kLate,            // answered honestly after the worker's deadline
  kSwap,            // the answer of the call served before
  kDie,             // the server process (the stand-in thread offers name) exits
  kActs
};

struct Action {
  Act act = kHonest;
  bool busy = false;         // the answer's server_busy flag
  bool in_segment = false;   // an honest answer's values in the segment, where they fit
  bool take_first = false;   // kRaw: the request taken before the fields are written
  bool honest_area = false;  // kRaw: the honest frame in the answer area, not `bytes`
  // kLie: the size said (value & 3: the honest one + 1, the room's + 1, UINT64_MAX, value >>
  // 2); kCut: where; kTooLarge: bytes past the slot's room.
  uint64_t value = 0;
  // kCut: XORed into the byte at `value` (0: the frame cut there); kLie: bit 0, 16 bytes of
  // values in the frame too.
  uint8_t flip = 0;
  // kRaw: the answer_bytes field: 0 the area's size, 1 zero, 2 kAnswerBytes, 3 one more, 4
  // UINT32_MAX, else any_bytes.
  uint8_t answer_bytes = 0;
  uint32_t any_bytes = 0;
  int32_t code = 0;    // kStatus: 1..16; kRaw: any
  uint32_t flags = 0;  // kRaw
  std::string bytes;   // kGarbage: the frame; kStatus: the message; kRaw: the area
};

struct LyingChannelOptions {
  // The worker's deadline per attempt: a kLate answer comes after it.
  absl::Duration deadline = absl::Milliseconds(10);
  // Offers name a thread of this process as the server (/proc/TID/fd/FD opens the same
  // file), which kDie ends: the worker's ServerGone sees it.
  bool stand_in = false;
  // A thread rings the worker's bell of every channel offered, without end.
  bool ring_bells = false;
  // A thread XORs `pattern` (not empty) into the latest answer's area in its slot and its
  // room in the segment, again and again, and `scribble_fields`: into its answer fields.
  bool scribble = false;
  bool scribble_fields = false;
  std::string pattern = "\x01";
  // The channel this many 64-byte lines below where OffsetFor puts it (modulo the lines
  // there are): any offset SharedChannel::Fits accepts.
  uint32_t channel_below = 0;
  // Taken in the order the server thread finds posted slots; after them it is honest.
  std::vector<Action> actions;
};

// Aborts unless this library's copy of the channel's slot and bell layout (shared_channel.cc
// keeps its own private) matches what SharedChannel writes: a change there must stop the
// fuzzer rather than have it write the wrong words.
void CheckChannelLayout();

// One input's server. Starts its threads when made, joins them when destroyed.
// Thread-safe.
class LyingChannel {
 public:
  LyingChannel(LyingChannelOptions options, const common::Partitioner* partitioner);
  ~LyingChannel();
  LyingChannel(const LyingChannel&) = delete;
  LyingChannel& operator=(const LyingChannel&) = delete;

  // The answer to a frame that came by the socket: honest, with an offer of a new segment (8
  // MiB, its channel where the options say) when the frame asks for one.
  grpc::ByteBuffer AnswerBySocket(const PushPullRequest& asked);
  // Stops the bell ringer and the scribbler.
  void StopNoise();
  // The server thread answers honestly from now on.
  void BeHonest() { honest_ = true; }

 private:
  struct Offered;
  struct Late;
  struct Target;

  void Serve();
  Action NextAction();
  void Handle(Offered* o, uint32_t slot, const Action& a);
  bool Die();
  bool AnswerLate();
  void Aim(const Offered* o, uint32_t slot, const SharedPayload& room);
  void RingBells();
  void Scribble();

  const LyingChannelOptions options_;
  const common::Partitioner* const partitioner_;  // Not owned.
  std::atomic<bool> stop_{false};
  std::atomic<bool> quiet_{false};
  std::atomic<bool> honest_{false};
  std::atomic<uint32_t> control_{0};  // rung when a segment is offered, and to stop
  class StandIn;
  std::unique_ptr<StandIn> stand_in_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Offered>> offered_ ABSL_GUARDED_BY(mu_);
  int stand_in_tid_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none, or it exited
  std::unique_ptr<Target> target_ ABSL_GUARDED_BY(mu_);
  // The server thread's own.
  size_t next_action_ = 0;
  std::vector<Late> late_;
  std::string last_frame_;
  std::thread server_;
  std::thread ringer_;
  std::thread scribbler_;
};

}  // namespace ps::fuzz

#endif  // PS_FUZZ_RPC_LYING_CHANNEL_H_
