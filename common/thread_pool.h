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

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ps::common

#endif  // PS_COMMON_THREAD_POOL_H_
