// SerialExecutor: runs calls one at a time, in the order they were submitted, on a thread of
// its own. The trainer's overlapped steps (training.prefetch) hand it the next step's pull and
// this step's push, so that compute does not wait for the network, while the store still sees
// the calls in program order (push t-1, pull t+1, push t, ...).
//
// Errors are sticky: once a call fails, the calls queued after it are skipped (not run), and
// every Wait/Drain from then on returns that first error, prefixed with the failed call's
// label ("step 12 push: ...").
//
// States: RUNNING (from construction) -> STOPPED (destructor: waits for the call in progress,
// skips the ones not started, joins the thread).
#ifndef PS_WORKER_SERIAL_EXECUTOR_H_
#define PS_WORKER_SERIAL_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ps::worker {

// Thread-safe.
class SerialExecutor {
 public:
  SerialExecutor();
  // Waits for the call in progress (if any), drops the queued ones, joins the thread.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Queues `call`; returns its ticket (1, 2, ... in submission order). `label` names the call
  // in its error. Everything `call` touches must stay valid until it has run (Wait/Drain) or
  // the executor is destroyed.
  uint64_t Submit(std::string label, std::function<absl::Status()> call);
  // Blocks until the call of `ticket` has run, or any call has failed. Returns OK, or the
  // first error of any call (annotated with its label).
  absl::Status Wait(uint64_t ticket);
  // Wait for every call submitted so far.
  absl::Status Drain();

 private:
  struct Task {
    uint64_t ticket;
    std::string label;
    std::function<absl::Status()> call;
  };
  void Loop();

  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;  // tickets up to this one have run
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_SERIAL_EXECUTOR_H_
