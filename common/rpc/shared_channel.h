// Calls through shared memory between a worker and a server on one host (docs/design.md,
// "Calls through shared memory").
//
// A server that makes a segment for a worker (common/rpc/shared_memory.h) large enough puts a
// channel at its end: kSlots slots, each with room for one request frame and its answer
// frame, and two futex words ("bells"). The worker writes a PushPull frame into a free slot,
// marks it posted and rings the server's bell; a server thread waiting on that bell takes
// the frame (copying it out, so the worker cannot change it after the server read it), serves
// it as a gRPC call would be served, writes the answer frame or the status into the slot,
// marks it answered and rings the worker's bell. A call then costs the two wake-ups any
// request and answer need, and none of gRPC's per-call work (HTTP/2 streams, call objects,
// completion-queue hops).
//
// The server trusts nothing in the slot: it reads each field once, caps sizes by the slot's
// room, and keeps its own record of which slots it is serving, so a worker that rewrites a
// slot while it is served only gets a duplicate of its own call (pushes are applied once by
// sequence). Each slot is served by one side at a time; the worker owns the free slots and
// reads answers only from slots it posted.
#ifndef PS_COMMON_RPC_SHARED_CHANNEL_H_
#define PS_COMMON_RPC_SHARED_CHANNEL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/shared_memory.h"
#include "grpcpp/support/byte_buffer.h"

namespace ps::common {

// Most channels one WaitForAnswers waits on (the kernel's FUTEX_WAITV_MAX).
inline constexpr size_t kMaxChannelWaits = 128;

class SharedChannel {
 public:
  static constexpr uint32_t kSlots = 8;
  static constexpr size_t kRequestBytes = size_t{128} << 10;
  static constexpr size_t kAnswerBytes = size_t{64} << 10;
  // Bytes of a channel (bells, then the slots), and the smallest segment that gets one.
  static constexpr size_t kSlotHeaderBytes = 64;
  static constexpr size_t kSlotBytes = kSlotHeaderBytes + kRequestBytes + kAnswerBytes;
  static constexpr size_t kBellBytes = 128;
  static constexpr size_t kBytes = kBellBytes + kSlots * kSlotBytes;
  static constexpr size_t kMinSegmentBytes = 4 * kBytes;
  // Answer flag: the server refused the call as busy (the socket's kServerBusyMetadata).
  static constexpr uint32_t kServerBusy = 1;

  // Where a channel goes in a segment of `bytes` (its end, 64-byte aligned), or nullopt
  // when the segment is too small for one.
  static std::optional<uint64_t> OffsetFor(size_t bytes);

  // The channel at `offset` of `memory`. REQUIRES: offset is OffsetFor(memory->size()), or a
  // value checked with Fits.
  SharedChannel(std::shared_ptr<SharedMemory> memory, uint64_t offset);
  // Whether a channel at `offset` lies in a segment of `bytes`, aligned.
  static bool Fits(uint64_t offset, size_t bytes);

  const std::shared_ptr<SharedMemory>& memory() const { return memory_; }
  uint64_t offset() const { return offset_; }

  // ---- Worker side.
  // The server process whose channel this is (its pid, from the segment's /proc/PID/fd/FD
  // path), so that a worker can tell when it is gone: a server that dies answers nothing and
  // never closes the channel. Reads the process's start time now (0 when it cannot).
  void WatchServer(int pid);
  // Whether the watched server process has exited (or is a zombie, or its pid now names
  // another process). False when none is watched, and when this process cannot tell (out of
  // descriptors: then only a process that no longer exists is gone). Reads /proc: call it now
  // and then, not per poll.
  bool ServerGone() const;
  // The pid in a segment path "/proc/PID/fd/FD", or nullopt.
  static std::optional<int> PidOfPath(const std::string& path);
  // A free slot, or nullopt when all are in use. A slot is free again once its answer was
  // taken: one whose call was given up stays out of use (the server may still write it).
  std::optional<uint32_t> AcquireSlot() ABSL_LOCKS_EXCLUDED(mu_);
  // Posts `frame` (REQUIRES: at most kRequestBytes) in `slot` (acquired) and rings the
  // server; `timeout`: how long the server may take (its deadline, as a gRPC call's).
  void Post(uint32_t slot, const grpc::ByteBuffer& frame, absl::Duration timeout);
  // Post as a worker that may lie: `bytes` written into the slot (REQUIRES: at most
  // kRequestBytes), the slot's size field set to `claimed_bytes` and its timeout to
  // `timeout_us`, whatever they are. For tests and fuzzers of the server's side.
  void PostBytes(uint32_t slot, absl::string_view bytes, uint32_t claimed_bytes,
                 uint64_t timeout_us);
  // The worker's bell: read it before looking for answers, then WaitForAnswers with it.
  uint32_t worker_bell() const;
  struct Answer {
    absl::Status status;
    bool server_busy = false;
    grpc::ByteBuffer frame;  // when status is OK
  };
  // The answer of posted `slot` when the server has written it (the slot is free again),
  // else nullopt.
  std::optional<Answer> TakeAnswer(uint32_t slot) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether posted `slot` will never be served: the server closed the channel (the segment
  // is no longer the worker's) before it took the call, so nothing of it was applied.
  bool Unserved(uint32_t slot) const;
  // Blocks until one of the channels' worker bells moves from `seen` (worker_bell() read
  // before the caller last looked for answers), or `deadline`. REQUIRES: the same size, 1 to
  // kMaxChannelWaits channels.
  static void WaitForAnswers(const std::vector<const SharedChannel*>& channels,
                             const std::vector<uint32_t>& seen, absl::Time deadline);

  // ---- Server side.
  uint32_t server_bell() const;
  // Blocks until the server's bell moves from `seen` or `deadline` passes.
  void WaitForRequests(uint32_t seen, absl::Time deadline) const;
  // For a thread that serves several channels: blocks until one of their server bells moves
  // from `seen` (server_bell() read before the caller last looked for requests), `*control`
  // (a word of the caller's, rung with RingControl) moves from `control_seen`, or `deadline`.
  // REQUIRES: the same size, at most kMaxChannelWaits - 1 channels (none is fine).
  static void WaitForRequests(const std::vector<const SharedChannel*>& channels,
                              const std::vector<uint32_t>& seen,
                              const std::atomic<uint32_t>* control, uint32_t control_seen,
                              absl::Time deadline);
  // Moves `*control` and wakes the thread waiting on it in WaitForRequests.
  static void RingControl(std::atomic<uint32_t>* control);
  // Rings the server's bell (to stop the thread waiting on it).
  void RingServer();
  // No request will be taken any more (no thread serves the channel now): marks
  // the channel closed and rings the worker, whose posted calls then end at once (Unserved).
  void Close();
  // A posted request of `slot`: the frame copied out, and the time the worker allows. Marks
  // the slot taken. nullopt when the slot is not posted. INVALID_ARGUMENT (slot taken
  // all the same) for a size beyond the slot's room.
  struct Request {
    absl::Status status;
    grpc::ByteBuffer frame;
    absl::Duration timeout;
  };
  std::optional<Request> TakeRequest(uint32_t slot);
  // Writes the answer of `slot` (`frame` when `status` is OK; ABORTED instead when the frame
  // does not fit) and rings the worker.
  void WriteAnswer(uint32_t slot, const absl::Status& status, const grpc::ByteBuffer* frame,
                   bool server_busy);

 private:
  struct Slot;
  struct Bells;
  void RingWorker();
  Slot* slot(uint32_t i) const;
  Bells* bells() const;

  const std::shared_ptr<SharedMemory> memory_;
  const uint64_t offset_;
  int server_pid_ = 0;  // WatchServer's
  uint64_t server_start_ = 0;
  absl::Mutex mu_;
  // Worker side: slots posted or given up.
  bool used_[kSlots] ABSL_GUARDED_BY(mu_) = {};
};

}  // namespace ps::common

#endif  // PS_COMMON_RPC_SHARED_CHANNEL_H_
