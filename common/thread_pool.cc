#include "common/thread_pool.h"

#include <utility>

#include "glog/logging.h"

namespace ps::common {

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
