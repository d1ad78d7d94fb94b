// A closed-loop load generator for benchmarks: T threads each call a function in a loop, first
// for a warm-up period, then (after every thread has finished warming up) for a measured
// period. Each thread finishes the call it has in flight when the period ends; that call counts.
//
// Throughput is the sum over threads of (calls of the thread / the thread's own measured
// time), which stays right when a single call is long compared with the period (e.g. one
// 64 MB push per second): a thread that started its last call just before the end is not
// charged for the others' idle tail.
#ifndef PS_BENCH_BENCH_LOAD_H_
#define PS_BENCH_BENCH_LOAD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ps::bench {

struct LoadOptions {
  // Threads calling concurrently. REQUIRES: > 0.
  int threads = 1;
  // Each thread calls for this long (at least once) before the measurement starts.
  absl::Duration warmup = absl::Milliseconds(500);
  // Length of the measurement; each thread makes at least one measured call.
  absl::Duration duration = absl::Seconds(2);
};

struct LoadResult {
  // Calls completed in the measured period, all threads together.
  uint64_t calls = 0;
  // Sum of the per-thread call rates (see the file comment).
  double calls_per_second = 0;
  // The longest per-thread measured time, seconds.
  double seconds = 0;
  // Latency of every measured call, milliseconds, sorted ascending.
  std::vector<double> latencies_ms;

  // Nearest-rank percentile of latencies_ms, q in [0, 1]; 0 when there is none.
  double Percentile(double q) const;
};

// One call of thread `thread` (0..threads-1). Must be safe to run concurrently with the
// other threads' calls.
using LoadCall = std::function<absl::Status(int thread)>;

// Runs the load. Returns the first error a call returns (the other threads stop after their
// current call) or CANCELLED when `*cancel` becomes true (may be null).
absl::StatusOr<LoadResult> RunLoad(const LoadOptions& options, const LoadCall& call,
                                   const std::atomic<bool>* cancel);

// A closed loop of `window` calls in flight per thread, kept by the thread itself (an
// asynchronous client): start(thread, slot) starts a call in one of the thread's slots
// 0..window-1; reap(thread) waits for one of its calls to end and returns that call's slot,
// or the call's error. Each thread starts a call in every slot, then starts a new one in each
// slot it reaps. Both must be safe to run concurrently with the other threads' calls.
struct WindowCalls {
  std::function<absl::Status(int thread, int slot)> start;
  std::function<absl::StatusOr<int>(int thread)> reap;
};

// RunLoad for windowed calls (options.threads threads of `window` calls): the calls that end
// in a thread's measured period count, at the thread's time of its last one; latency is from
// a call's start to its reaping. When the period ends each thread reaps what it still has in
// flight (not counted). REQUIRES: window > 0.
absl::StatusOr<LoadResult> RunWindowLoad(const LoadOptions& options, int window,
                                         const WindowCalls& calls,
                                         const std::atomic<bool>* cancel);

}  // namespace ps::bench

#endif  // PS_BENCH_BENCH_LOAD_H_
