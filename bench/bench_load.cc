#include "bench/bench_load.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace ps::bench {
namespace {

struct ThreadResult {
  uint64_t calls = 0;
  double seconds = 0;
  std::vector<double> latencies_ms;
};

}  // namespace

double LoadResult::Percentile(double q) const {
  if (latencies_ms.empty()) return 0;
  const double rank = std::ceil(q * static_cast<double>(latencies_ms.size()));
  const size_t i = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return latencies_ms[std::min(i, latencies_ms.size() - 1)];
}

absl::StatusOr<LoadResult> RunLoad(const LoadOptions& options, const LoadCall& call,
                                   const std::atomic<bool>* cancel) {
  const int n = std::max(1, options.threads);
  std::vector<ThreadResult> results(n);
  std::atomic<bool> failed{false};
  absl::Mutex error_mu;
  absl::Status error;
  absl::BlockingCounter warmed_up(n);
  absl::Notification go;
  absl::Time start;  // written before `go` is notified, read after
  const absl::Time warmup_end = absl::Now() + options.warmup;

  auto stopping = [&] {
    return failed.load(std::memory_order_relaxed) ||
           (cancel != nullptr && cancel->load(std::memory_order_relaxed));
  };
  auto fail = [&](absl::Status s) {
    absl::MutexLock lock(&error_mu);
    if (error.ok()) error = std::move(s);
    failed = true;
  };

  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      // Warm-up: connections, first-touch allocations, server-side lazy work.
      do {
        if (stopping()) break;
        absl::Status s = call(t);
        if (!s.ok()) fail(std::move(s));
      } while (absl::Now() < warmup_end);
      warmed_up.DecrementCount();
      go.WaitForNotification();
      ThreadResult& r = results[t];
      absl::Time last = start;
      do {
        if (stopping()) break;
        const absl::Time before = absl::Now();
        absl::Status s = call(t);
        last = absl::Now();
        if (!s.ok()) {
          fail(std::move(s));
          break;
        }
        ++r.calls;
        r.latencies_ms.push_back(absl::ToDoubleMilliseconds(last - before));
      } while (last < start + options.duration);
      r.seconds = absl::ToDoubleSeconds(last - start);
    });
  }
  warmed_up.Wait();
  start = absl::Now();
  go.Notify();
  for (auto& th : threads) th.join();

  if (!error.ok()) return error;
  if (cancel != nullptr && cancel->load()) return absl::CancelledError("cancelled");
  LoadResult out;
  for (ThreadResult& r : results) {
    out.calls += r.calls;
    if (r.seconds > 0) out.calls_per_second += static_cast<double>(r.calls) / r.seconds;
    out.seconds = std::max(out.seconds, r.seconds);
    out.latencies_ms.insert(out.latencies_ms.end(), r.latencies_ms.begin(),
                            r.latencies_ms.end());
  }
  std::sort(out.latencies_ms.begin(), out.latencies_ms.end());
  return out;
}

namespace {

// One thread of RunWindowLoad: its calls, from the first start to the last reap.
class WindowThread {
 public:
  WindowThread(int thread, int window, const WindowCalls& calls)
      : thread_(thread), calls_(calls), started_(window) {}

  absl::Status StartAll() {
    for (int slot = 0; slot < static_cast<int>(started_.size()); ++slot) {
      started_[slot] = absl::Now();
      absl::Status s = calls_.start(thread_, slot);
      if (!s.ok()) return s;
      ++in_flight_;
    }
    return absl::OkStatus();
  }
  // Reaps one call and restarts its slot (unless `restart` is false). Returns the reaped
  // call's latency.
  absl::StatusOr<absl::Duration> Turn(bool restart) {
    absl::StatusOr<int> slot = calls_.reap(thread_);
    --in_flight_;
    if (!slot.ok()) return slot.status();
    const absl::Time now = absl::Now();
    const absl::Duration latency = now - started_[*slot];
    if (restart) {
      started_[*slot] = now;
      absl::Status s = calls_.start(thread_, *slot);
      if (!s.ok()) return s;
      ++in_flight_;
    }
    return latency;
  }
  // Reaps what is left in flight (errors dropped: the run's outcome is decided).
  void Drain() {
    while (in_flight_ > 0) Turn(false).status().IgnoreError();
  }

 private:
  const int thread_;
  const WindowCalls& calls_;
  std::vector<absl::Time> started_;  // per slot
  int in_flight_ = 0;
};

}  // namespace

absl::StatusOr<LoadResult> RunWindowLoad(const LoadOptions& options, int window,
                                         const WindowCalls& calls,
                                         const std::atomic<bool>* cancel) {
  const int n = std::max(1, options.threads);
  std::vector<ThreadResult> results(n);
  std::atomic<bool> failed{false};
  absl::Mutex error_mu;
  absl::Status error;
  absl::BlockingCounter warmed_up(n);
  absl::Notification go;
  absl::Time start;  // written before `go` is notified, read after
  const absl::Time warmup_end = absl::Now() + options.warmup;
  auto stopping = [&] {
    return failed.load(std::memory_order_relaxed) ||
           (cancel != nullptr && cancel->load(std::memory_order_relaxed));
  };
  auto fail = [&](absl::Status s) {
    absl::MutexLock lock(&error_mu);
    if (error.ok()) error = std::move(s);
    failed = true;
  };
  auto run = [&](int t) {
    WindowThread w(t, window, calls);
    absl::Status s = w.StartAll();
    // Warm-up with the window full; the calls stay in flight across the barrier.
    while (s.ok() && !stopping() && absl::Now() < warmup_end) s = w.Turn(true).status();
    if (!s.ok()) fail(std::move(s));
    warmed_up.DecrementCount();
    go.WaitForNotification();
    ThreadResult& r = results[t];
    absl::Time last = start;
    while (!stopping() && last < start + options.duration) {
      absl::StatusOr<absl::Duration> latency = w.Turn(true);
      if (!latency.ok()) {
        fail(latency.status());
        break;
      }
      last = absl::Now();
      ++r.calls;
      r.latencies_ms.push_back(absl::ToDoubleMilliseconds(*latency));
    }
    r.seconds = absl::ToDoubleSeconds(last - start);
    w.Drain();
  };
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int t = 0; t < n; ++t) threads.emplace_back(run, t);
  warmed_up.Wait();
  start = absl::Now();
  go.Notify();
  for (auto& th : threads) th.join();
  if (!error.ok()) return error;
  if (cancel != nullptr && cancel->load()) return absl::CancelledError("cancelled");
  LoadResult out;
  for (ThreadResult& r : results) {
    out.calls += r.calls;
    if (r.seconds > 0) out.calls_per_second += static_cast<double>(r.calls) / r.seconds;
    out.seconds = std::max(out.seconds, r.seconds);
    out.latencies_ms.insert(out.latencies_ms.end(), r.latencies_ms.begin(),
                            r.latencies_ms.end());
  }
  std::sort(out.latencies_ms.begin(), out.latencies_ms.end());
  return out;
}

}  // namespace ps::bench
