#include "worker/serial_executor.h"

#include <utility>

#include "common/status_macros.h"

namespace ps::worker {

SerialExecutor::SerialExecutor() : thread_([this] { Loop(); }) {}

SerialExecutor::~SerialExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

uint64_t SerialExecutor::Submit(std::string label, std::function<absl::Status()> call) {
  absl::MutexLock lock(&mu_);
  const uint64_t ticket = ++submitted_;
  queue_.push_back(Task{ticket, std::move(label), std::move(call)});
  return ticket;
}

absl::Status SerialExecutor::Wait(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done_ >= ticket || !error_.ok();
  };
  mu_.Await(absl::Condition(&ready));
  return error_;
}

absl::Status SerialExecutor::Drain() {
  uint64_t last;
  {
    absl::MutexLock lock(&mu_);
    last = submitted_;
  }
  return Wait(last);
}

void SerialExecutor::Loop() {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      if (!error_.ok()) {
        // A call failed before this one: what follows it must not run (a pull after a lost
        // push would read parameters the push should have changed).
        done_ = task.ticket;
        continue;
      }
    }
    // The call runs unlocked: Submit and Wait go on meanwhile.
    absl::Status status = task.call();
    absl::MutexLock lock(&mu_);
    if (!status.ok() && error_.ok()) error_ = common::Annotate(status, task.label);
    done_ = task.ticket;
  }
}

}  // namespace ps::worker
