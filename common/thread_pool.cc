#include "common/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include "glog/logging.h"

namespace ps::common {
namespace internal {

// What the threads of one ParallelFor share. Owned jointly: a helper that starts after the
// caller has returned still reads `next` (and finds nothing left), but never calls `fn`.
struct ParallelForState {
  ParallelForState(size_t n, absl::FunctionRef<void(size_t)> f) : units(n), fn(f) {}
  const size_t units;
  const absl::FunctionRef<void(size_t)> fn;
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  // Units run; written under mu (so that a waiter in mu's Await sees it), read without it by
  // a caller that watches before it sleeps.
  std::atomic<size_t> done{0};
};

}  // namespace internal

namespace {

using internal::ParallelForState;

// Calls `ready` until it returns true (then true) or `spin` has passed (false), yielding the
// core between calls: a one-off BusyWaiter that judges nothing (a fresh one would have no
// contended spins behind it to back off from, and its judgement would only cost system calls).
bool SpinUntil(absl::Duration spin, absl::FunctionRef<bool()> ready) {
  return BusyWaiter(spin, /*judge=*/false).Poll(ready);
}

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
  state.done.fetch_add(ran, std::memory_order_release);
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : ThreadPool(num_threads, Spin()) {}

ThreadPool::ThreadPool(int num_threads, Spin spin) : spin_(spin) {
  CHECK_GT(num_threads, 0);
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) {
    const bool spins = i < spin_.threads && spin_.spin > absl::ZeroDuration();
    threads_.emplace_back([this, spins] { Loop(spins); });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stopping_flag_.store(true, std::memory_order_relaxed);
  }
  for (auto& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  pending_.fetch_add(1, std::memory_order_relaxed);
}

bool ThreadPool::AwaitWithoutSleeping(BusyWaiter& waiter) {
  watching_.fetch_add(1);
  auto queued = [this] {
    return pending_.load(std::memory_order_relaxed) > 0 ||
           stopping_flag_.load(std::memory_order_relaxed);
  };
  uint64_t joined = slot_seq_.load();
  bool seen = false;
  // After each ParallelFor joined, the watch starts again: threads that keep getting work
  // never sleep.
  for (bool ran = true; ran && !seen;) {
    ran = false;
    auto ready = [&] {
      const uint64_t seq = slot_seq_.load();
      if ((seq & 1) != 0 && seq != joined) {
        joined = seq;
        Join(seq);
        ran = true;
        return true;
      }
      return queued();
    };
    seen = spin_.back_off ? waiter.Poll(ready) : SpinUntil(spin_.spin, ready);
    if (ran) seen = queued();
  }
  watching_.fetch_sub(1);
  return seen;
}

void ThreadPool::Join(uint64_t seq) {
  // Inside before the check that the slot is still open at seq: the caller closes it, then
  // waits for those inside (both sides sequentially consistent, so one sees the other).
  slot_users_.fetch_add(1);
  if (slot_seq_.load() == seq) {
    RunUnits(*slot_state_.load());
    joined_.fetch_add(1, std::memory_order_relaxed);
  }
  slot_users_.fetch_sub(1);
}

void ThreadPool::ParallelFor(size_t units, int helpers, absl::FunctionRef<void(size_t)> fn) {
  CHECK_LE(helpers, num_threads());
  if (units == 0) return;
  auto state = std::make_shared<ParallelForState>(units, fn);
  size_t wanted = std::min(static_cast<size_t>(std::max(helpers, 0)), units - 1);
  // Watching threads join through the slot (unless another ParallelFor holds it); tasks are
  // queued for the others.
  const bool slot = wanted > 0 && spin_.threads > 0 && !slot_taken_.exchange(true);
  if (slot) {
    slot_state_.store(state.get());
    slot_seq_.fetch_add(1);  // open
    wanted -= std::min(wanted, static_cast<size_t>(std::max(watching_.load(), 0)));
  }
  for (size_t h = 0; h < wanted; ++h) Schedule([state] { RunUnits(*state); });
  RunUnits(*state);
  if (slot) slot_seq_.fetch_add(1);  // closed: no one joins any more
  // The helpers' last units are under way: watched for a while (with spinning threads), then
  // slept on, however long a unit waits (e.g. for a lock).
  if (spin_.threads == 0 || !SpinUntil(spin_.spin, [&] {
        return state->done.load(std::memory_order_acquire) == units;
      })) {
    absl::MutexLock lock(&state->mu);
    state->mu.Await(absl::Condition(
        +[](ParallelForState* s) { return s->done.load(std::memory_order_acquire) == s->units; },
        state.get()));
  }
  if (slot) {
    // Every unit is done: a thread still inside the slot is on its way out (or found none
    // left), and `state` must outlive it.
    while (slot_users_.load() != 0) sched_yield();
    slot_taken_.store(false);
  }
}

void ThreadPool::Loop(bool spins) {
  BusyWaiter waiter(spins ? spin_.spin : absl::ZeroDuration());
  while (true) {
    std::function<void()> task;
    {
      // A spinning thread that saw a task queued takes it without sleeping, unless another
      // thread took it first: then it watches again.
      const bool seen = spins && AwaitWithoutSleeping(waiter);
      absl::MutexLock lock(&mu_);
      if (seen && queue_.empty() && !stopping_) continue;
      mu_.Await(absl::Condition(
          +[](ThreadPool* p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return p->stopping_ || !p->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      pending_.fetch_sub(1, std::memory_order_relaxed);
      if (seen) taken_spinning_.fetch_add(1, std::memory_order_relaxed);
    }
    task();
  }
}

}  // namespace ps::common
