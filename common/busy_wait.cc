#include "common/busy_wait.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

#include "common/thread_cpu.h"

namespace ps::common {
namespace {

// CPU time of the calling thread.
std::chrono::nanoseconds ThreadCpuTime() { return std::chrono::nanoseconds(ThreadCpuNanos()); }

constexpr uint32_t kFirstBackoff = 8;
constexpr uint32_t kMaxBackoff = 1024;
// Polling stretches shorter than this say too little about who else wants the core.
constexpr std::chrono::microseconds kMinJudgedSpin(20);

}  // namespace

int BusyWaiter::Spin(absl::FunctionRef<int()> poll) {
  // steady_clock is read through the vDSO: no system call per poll.
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + absl::ToChronoNanoseconds(spin_);
  const std::chrono::nanoseconds cpu_start = judge_ ? ThreadCpuTime() : std::chrono::nanoseconds(0);
  int result = 0;
  auto now = start;
  while (true) {
    ++stats_.polls;
    result = poll();
    now = std::chrono::steady_clock::now();
    if (result != 0 || now >= until) break;
    sched_yield();
  }
  const auto wall = now - start;
  if (judge_ && wall >= kMinJudgedSpin) {
    const std::chrono::nanoseconds cpu = ThreadCpuTime() - cpu_start;
    last_contended_ = 2 * cpu < wall;
    if (2 * cpu >= wall) {
      backoff_ = 0;
    } else if (result > 0 && cpu < absl::ToChronoNanoseconds(kCheapSpin) &&
               absl::FromChrono(wall) < cheap_wall_) {
      ++stats_.contended_spins;
      ++stats_.cheap_contended_spins;
      backoff_ = 0;
    } else {
      ++stats_.contended_spins;
      backoff_ = backoff_ == 0 ? kFirstBackoff : std::min(kMaxBackoff, 2 * backoff_);
      skip_waits_ = backoff_;
    }
  }
  return result;
}

int BusyWaiter::MaybeSpin(absl::FunctionRef<int()> poll) {
  if (spin_ <= absl::ZeroDuration()) return 0;
  if (skip_waits_ > 0) {
    --skip_waits_;
    ++stats_.waits_backed_off;
    return 0;
  }
  const int got = Spin(poll);
  if (got > 0) ++stats_.events_polled;
  return got;
}

bool BusyWaiter::Poll(absl::FunctionRef<bool()> ready) {
  if (MaybeSpin([&] { return ready() ? 1 : 0; }) > 0) return true;
  CountBlockedWait();
  return false;
}

}  // namespace ps::common
