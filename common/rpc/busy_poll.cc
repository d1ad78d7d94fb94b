#include "common/rpc/busy_poll.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>

#include "grpc/support/time.h"

namespace ps::common {
namespace {

// CPU time of the calling thread.
std::chrono::nanoseconds ThreadCpuTime() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

constexpr uint32_t kFirstBackoff = 8;
constexpr uint32_t kMaxBackoff = 1024;
// Polling stretches shorter than this say too little about who else wants the core.
constexpr std::chrono::microseconds kMinJudgedSpin(20);

}  // namespace

int BusyPoller::Spin(absl::FunctionRef<int()> poll) {
  // steady_clock is read through the vDSO: no system call per poll.
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + absl::ToChronoNanoseconds(spin_);
  const std::chrono::nanoseconds cpu_start = ThreadCpuTime();
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
  if (wall >= kMinJudgedSpin) {
    const std::chrono::nanoseconds cpu = ThreadCpuTime() - cpu_start;
    if (2 * cpu >= wall) {
      backoff_ = 0;
    } else if (result > 0 && cpu < absl::ToChronoNanoseconds(kCheapSpin)) {
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

int BusyPoller::MaybeSpin(absl::FunctionRef<int()> poll) {
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

bool BusyPoller::Next(grpc::CompletionQueue* cq, void** tag, bool* ok) {
  const gpr_timespec passed = gpr_time_0(GPR_CLOCK_MONOTONIC);  // a deadline already passed
  const int got = MaybeSpin([&] {
    switch (cq->AsyncNext(tag, ok, passed)) {
      case grpc::CompletionQueue::GOT_EVENT:
        return 1;
      case grpc::CompletionQueue::SHUTDOWN:
        return -1;
      default:
        return 0;
    }
  });
  if (got != 0) return got > 0;
  ++stats_.waits_blocked;
  return cq->Next(tag, ok);
}

bool BusyPoller::Poll(absl::FunctionRef<bool()> ready) {
  if (MaybeSpin([&] { return ready() ? 1 : 0; }) > 0) return true;
  ++stats_.waits_blocked;
  return false;
}

}  // namespace ps::common
