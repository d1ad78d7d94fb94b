#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include "glog/logging.h"

namespace ps::common {
namespace {

// What the threads of one ParallelFor share. Owned jointly: a helper that starts after the
// caller has returned still reads `next` (and finds nothing left), but never calls `fn`.
struct ParallelForState {
  ParallelForState(size_t n, absl::FunctionRef<void(size_t)> f) : units(n), fn(f) {}
  const size_t units;
  const absl::FunctionRef<void(size_t)> fn;
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  size_t done ABSL_GUARDED_BY(mu) = 0;
};

// Claims and runs units until none is left, then counts the ones it ran.
void RunUnits(ParallelForState& state) {
  size_t ran = 0;
  for (size_t i = state.next.fetch_add(1, std::memory_order_relaxed); i < state.units;
       i = state.next.fetch_add(1, std::memory_order_relaxed)) {
    state.fn(i);
    ++ran;
  }
  if (ran == 0) return;
  absl::MutexLock lock(&state.mu);
  state.done += ran;
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  CHECK_GT(num_threads, 0);
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Loop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void ThreadPool::ParallelFor(size_t units, int helpers, absl::FunctionRef<void(size_t)> fn) {
  CHECK_LE(helpers, num_threads());
  if (units == 0) return;
  auto state = std::make_shared<ParallelForState>(units, fn);
  const size_t wanted = std::min(static_cast<size_t>(std::max(helpers, 0)), units - 1);
  for (size_t h = 0; h < wanted; ++h) Schedule([state] { RunUnits(*state); });
  RunUnits(*state);
  absl::MutexLock lock(&state->mu);
  state->mu.Await(absl::Condition(
      +[](ParallelForState* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->done == s->units; },
      state.get()));
}

void ThreadPool::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return p->stopping_ || !p->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace ps::common
