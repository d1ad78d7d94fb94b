// Push payloads that follow their call: a worker posts a call through its shared-memory
// channel first and copies the push's payload into its segment after, raising a count of the
// bytes written as it goes; the server checks the payload as the bytes arrive. The worker's
// copy and the server's first read of the bytes (the finite check, which takes each line from
// the worker's core) then overlap instead of running one after the other (docs/design.md,
// "Payloads that follow their call"; docs/lab/2026-12-06-following-payloads.md).
//
// The count is a 64-bit word at the start of the cache line just before the payload
// (kFollowingWordBytes). The server trusts nothing of it: it waits for a count that never comes
// no longer than FollowingPayload::MaxWait, and refuses the call then, before anything of it
// was applied; that worker's payloads must come whole from then on.
#ifndef PS_COMMON_RPC_FOLLOWING_PAYLOAD_H_
#define PS_COMMON_RPC_FOLLOWING_PAYLOAD_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ps::common {

// The line before a following payload that holds its count.
inline constexpr size_t kFollowingWordBytes = 64;
// The largest payload that may follow its call: a server waits at most MaxWait of its size.
inline constexpr uint64_t kMaxFollowingBytes = uint64_t{4} << 20;
// The smallest a worker sends that way: below, the copy is too short to be worth a wait.
inline constexpr uint64_t kMinFollowingBytes = uint64_t{64} << 10;
// The worker raises the count after each piece of this many bytes, and the server checks in
// pieces of this size.
inline constexpr size_t kFollowingChunkBytes = size_t{64} << 10;

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the count is shared between processes: it must be a plain word");

// The count word at `line` (REQUIRES: 8-byte aligned, in memory both processes map).
inline std::atomic<uint64_t>* FollowingWord(void* line) {
  return reinterpret_cast<std::atomic<uint64_t>*>(line);
}
inline const std::atomic<uint64_t>* FollowingWord(const void* line) {
  return reinterpret_cast<const std::atomic<uint64_t>*>(line);
}

// Worker: copies the consecutive pieces `from` to `to` (plain or non-temporal stores), storing
// the bytes done into `*written` (release) after each kFollowingChunkBytes and at the end.
void CopyFollowing(absl::Span<const absl::string_view> from, char* to, bool stream,
                   std::atomic<uint64_t>* written);

// Server: the bytes of one following payload, waited for as they are needed. Not thread-safe
// (one call's check uses it on one thread).
class FollowingPayload {
 public:
  // The payload of `bytes` at `begin`, its count at `written`; waits end at `give_up` (a wall
  // time, turned here into the monotonic clock the waits are timed by).
  FollowingPayload(const std::atomic<uint64_t>* written, const char* begin, uint64_t bytes,
                   absl::Time give_up);

  // The longest a server waits for a payload of `bytes`: 100 ms, plus its bytes at 20 MB/s
  // (310 ms at kMaxFollowingBytes). An honest worker copies 1 MB in well under a millisecond
  // (tens of milliseconds in a ThreadSanitizer build); this leaves room for its being
  // descheduled mid-copy on a loaded host, and caps what a worker that never writes its count
  // holds a channel thread for (once: the server takes no more following payloads from it).
  static absl::Duration MaxWait(uint64_t bytes);

  // Whether [p, p + n) lies inside the payload.
  bool Holds(const void* p, size_t n) const;
  // Blocks until the payload's bytes up to `end` (an address in it, or one past its end) are
  // written: OK; DEADLINE_EXCEEDED naming the bytes written when `give_up` passes first.
  absl::Status WaitUntil(const void* end);
  absl::Status WaitAll() { return WaitUntil(begin_ + bytes_); }
  // Whether every byte was seen written (no wait is needed any more).
  bool complete() const { return ready_ >= bytes_; }
  // The time spent waiting for bytes not yet written, over all waits so far.
  absl::Duration waited() const { return waited_; }
  // The CPU time this thread spent on those waits: polling without a system call, counted
  // by the clock up to the spin's limit (50 us from the first wait), then the yields' own, by
  // the thread's CPU clock (not the time the core went to others).
  absl::Duration waited_cpu() const { return waited_cpu_; }

 private:
  const std::atomic<uint64_t>* const written_;
  const char* const begin_;
  const uint64_t bytes_;
  const absl::Time give_up_;
  uint64_t ready_ = 0;  // the last count seen, capped at bytes_
  // Waits poll without a system call until then (the first wait sets it), then yield the
  // core between polls.
  absl::Time spin_until_ = absl::InfinitePast();
  absl::Duration waited_ = absl::ZeroDuration();
  absl::Duration waited_cpu_ = absl::ZeroDuration();
};

}  // namespace ps::common

#endif  // PS_COMMON_RPC_FOLLOWING_PAYLOAD_H_
