// A fixed-size thread pool. Thread-safe. NEW -> running (from construction) -> STOPPED (the
// destructor runs every queued task, then joins the threads).
#ifndef PS_COMMON_THREAD_POOL_H_
#define PS_COMMON_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/busy_wait.h"

namespace ps::common {
namespace internal {
struct ParallelForState;
}  // namespace internal

class ThreadPool {
 public:
  // How the first `threads` of the pool wait for work: after each task (and at start) such a
  // thread watches for up to `spin` before it sleeps, so that work handed to it within that
  // time starts without a wake-up (on a VM, tens of microseconds per thread, paid one after
  // the other). A watching thread joins a ParallelFor through a slot the caller opens (no
  // lock, no queued task: the caller queues tasks only for the threads not watching), and
  // the caller watches for its helpers' last units the same way before it sleeps. Costs a
  // core per such thread while it watches, yielded to any other thread that wants it; a
  // thread whose watches find the cores contended sleeps at once for a while instead
  // (common/busy_wait.h).
  struct Spin {
    int threads = 0;
    absl::Duration spin = absl::ZeroDuration();
    // False: watch for the whole `spin` whatever the cores' contention (for tests).
    bool back_off = true;
  };

  // REQUIRES: num_threads > 0.
  explicit ThreadPool(int num_threads);
  ThreadPool(int num_threads, Spin spin);
  // Runs every queued task, then joins.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`; it runs on one of the pool's threads.
  void Schedule(std::function<void()> task);
  int num_threads() const { return static_cast<int>(threads_.size()); }

  // Runs fn(0), ..., fn(units - 1), each exactly once, on the calling thread and on up to
  // `helpers` of the pool's threads, and returns when every call has returned. Units are
  // claimed one at a time from a shared counter rather than dealt out in advance, so the work
  // goes to whichever threads are running: a helper the OS has not scheduled yet costs the
  // caller nothing (it finds no unit left when it starts and returns without calling fn), and
  // the caller only ever waits for units already under way. `fn` must be safe to call
  // concurrently for different units. REQUIRES: helpers <= num_threads().
  void ParallelFor(size_t units, int helpers, absl::FunctionRef<void(size_t)> fn);

  // Tasks this pool's spinning threads took without sleeping first, and ParallelFors they
  // joined through the slot (for tests).
  uint64_t tasks_taken_spinning() const { return taken_spinning_.load(std::memory_order_relaxed); }
  uint64_t parallel_fors_joined() const { return joined_.load(std::memory_order_relaxed); }
  // Threads watching for work now (for tests).
  int threads_watching() const { return watching_.load(); }

 private:
  void Loop(bool spins);
  // Watches pending_ for up to spin_.spin (through the thread's `waiter`), joining the
  // ParallelFors opened meanwhile; true once a task may be queued (or the pool stops).
  bool AwaitWithoutSleeping(BusyWaiter& waiter);
  // Runs units of the ParallelFor the slot holds if it is still open at `seq`.
  void Join(uint64_t seq);

  const Spin spin_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // queue_.size() and stopping_, readable without mu_ by the spinning threads.
  std::atomic<size_t> pending_{0};
  std::atomic<bool> stopping_flag_{false};
  std::atomic<uint64_t> taken_spinning_{0};
  std::atomic<uint64_t> joined_{0};
  // Threads watching now (AwaitWithoutSleeping).
  std::atomic<int> watching_{0};
  // The slot of one ParallelFor at a time (slot_taken_): slot_seq_ is odd while it is open
  // for watching threads to join; slot_users_ counts those inside; slot_state_ is its state.
  std::atomic<bool> slot_taken_{false};
  std::atomic<uint64_t> slot_seq_{0};
  std::atomic<int> slot_users_{0};
  std::atomic<internal::ParallelForState*> slot_state_{nullptr};
  std::vector<std::thread> threads_;
};

}  // namespace ps::common

#endif  // PS_COMMON_THREAD_POOL_H_
