// A fixed-size thread pool. Thread-safe. NEW -> running (from construction) -> STOPPED (the
// destructor runs every queued task, then joins the threads).
#ifndef PS_COMMON_THREAD_POOL_H_
#define PS_COMMON_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace ps::common {

class ThreadPool {
 public:
  // REQUIRES: num_threads > 0.
  explicit ThreadPool(int num_threads);
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

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ps::common

#endif  // PS_COMMON_THREAD_POOL_H_
