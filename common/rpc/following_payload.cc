#include "common/rpc/following_payload.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/monotonic_time.h"
#include "common/stream_copy.h"
#include "common/thread_cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ps::common {
namespace {

// Spinning on the count costs nothing while the worker copies on another core, and the whole
// of the core when it copies on this one: a call spins this long at most, then yields the core
// between looks (to the worker, if it waits for this core).
constexpr absl::Duration kSpin = absl::Microseconds(50);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

}  // namespace

void CopyFollowing(absl::Span<const absl::string_view> from, char* to, bool stream,
                   std::atomic<uint64_t>* written) {
  uint64_t done = 0;
  for (absl::string_view piece : from) {
    for (size_t at = 0; at < piece.size();) {
      // Chunks end at multiples of kFollowingChunkBytes of the whole payload.
      const size_t n =
          std::min(piece.size() - at, kFollowingChunkBytes - done % kFollowingChunkBytes);
      if (stream) {
        StreamCopy(to + done, piece.data() + at, n);  // (ends with a store fence)
      } else {
        std::memcpy(to + done, piece.data() + at, n);
      }
      at += n;
      done += n;
      if (done % kFollowingChunkBytes == 0) written->store(done, std::memory_order_release);
    }
  }
  written->store(done, std::memory_order_release);
}

FollowingPayload::FollowingPayload(const std::atomic<uint64_t>* written, const char* begin,
                                   uint64_t bytes, absl::Time give_up)
    : written_(written),
      begin_(begin),
      bytes_(bytes),
      // On the monotonic clock from here: a step of the wall clock mid-wait (found in review,
      // 2026-12-06) would otherwise hold the thread for as long as the step.
      give_up_(MonotonicNow() + (give_up - absl::Now())) {}

absl::Duration FollowingPayload::MaxWait(uint64_t bytes) {
  return absl::Milliseconds(100) + absl::Microseconds(static_cast<int64_t>(bytes / 20));
}

bool FollowingPayload::Holds(const void* p, size_t n) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto b = reinterpret_cast<uintptr_t>(begin_);
  return a >= b && a - b <= bytes_ && n <= bytes_ - (a - b);
}

absl::Status FollowingPayload::WaitUntil(const void* end) {
  const auto e = reinterpret_cast<uintptr_t>(end);
  const auto b = reinterpret_cast<uintptr_t>(begin_);
  const uint64_t need = e <= b ? 0 : std::min<uint64_t>(e - b, bytes_);
  if (ready_ >= need) return absl::OkStatus();
  const absl::Time start = MonotonicNow();
  bool spin = true;
  // The wait's CPU: its spin's wall time, no more than the spin's limit (the thread may be
  // descheduled mid-spin: that time was the core's, not this wait's), then, once yielding,
  // the thread's CPU clock.
  int64_t yield_cpu_start = -1;
  auto spun = [&](absl::Time now) {
    return std::max(std::min(now, spin_until_) - start, absl::ZeroDuration());
  };
  auto count_cpu = [&](absl::Time now) {
    waited_cpu_ +=
        yield_cpu_start < 0 ? spun(now) : absl::Nanoseconds(ThreadCpuNanos() - yield_cpu_start);
  };
  for (uint64_t looks = 0;; ++looks) {
    // A count past the payload's end (a lie or a mistake) says every byte is there: the
    // check reads them as they are.
    ready_ = std::min(written_->load(std::memory_order_acquire), bytes_);
    if (ready_ >= need) break;
    // The clock every 64 looks while spinning (a look is a few nanoseconds), at every look
    // once yielding (a yield may give the core away for a whole time slice).
    if (!spin || looks % 64 == 0) {
      const absl::Time now = MonotonicNow();
      if (now >= give_up_) {
        waited_ += now - start;
        count_cpu(now);
        return absl::DeadlineExceededError(absl::StrCat(
            "the push's payload, written after its call was posted: ", ready_, " of ", bytes_,
            " bytes there when the server gave up waiting (", need, " needed)"));
      }
      if (spin_until_ == absl::InfinitePast()) spin_until_ = now + kSpin;
      if (spin && now >= spin_until_) {
        waited_cpu_ += spun(now);
        yield_cpu_start = ThreadCpuNanos();
      }
      spin = now < spin_until_;
    }
    if (spin) {
      CpuRelax();
    } else {
      sched_yield();
    }
  }
  const absl::Time now = MonotonicNow();
  waited_ += now - start;
  count_cpu(now);
  return absl::OkStatus();
}

}  // namespace ps::common
