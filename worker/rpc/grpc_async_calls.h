// GrpcParameterStore::AsyncCalls: calls of one store that one thread keeps in flight.
//
// StartPush / StartPull / StartPushPull build a call's PushPull frames exactly as the
// blocking calls do (checks, 16-bit encoding with error feedback, one sequence per server
// that hears the push), send them and return the call's id without waiting. The answers of
// every call come to one completion queue, read by Next or Wait on the calling thread, which
// is gRPC's poller while it waits: an answer wakes no other thread, and N calls in flight
// cost one thread instead of N blocked ones. The blocking Pull/Push/PushPull are Start + Wait
// on an AsyncCalls of the store's own.
//
// Each call keeps the blocking calls' semantics: a deadline per attempt; UNAVAILABLE and
// DEADLINE_EXCEEDED retried with back-off (the back-off is a grpc::Alarm on the same queue,
// so a call waiting to retry holds no thread and the other calls keep moving) resending the
// same frames, hence the same sequences; answers validated (a bad one ends the call with
// INTERNAL); the store's metrics, stats, on_retry and on_recovered.
//
// Ordering. A push takes its sequence per server when it starts, so a server's sequences
// follow the order of Start; calls in flight may be applied in any order. A server accepts
// sequences in any order above a floor and remembers the applied ones above it, up to 1024
// (server/worker_tracker.h): a retried push more than that far behind later applied ones is
// given up, refused OUT_OF_RANGE and never applied. So Start of a push first reaps answers
// (kept for Next) while this object's oldest unfinished push to some server lags that
// server's next sequence by GrpcStoreOptions::max_sequence_lead or more. (Other AsyncCalls
// and blocking calls of the same store, on other threads, are not held back by it.) Clocks: a server keeps each
// worker's highest pushed clock, so pushes of several clocks may be in flight; under
// deterministic BSP a server lets at most 2 pushes of a worker wait for their turn, so keep
// at most one later-clock push in flight there.
//
// Thread-compatible: one thread at a time (different AsyncCalls of one store may be used by
// different threads at once). Must not outlive its store.
#ifndef PS_WORKER_RPC_GRPC_ASYNC_CALLS_H_
#define PS_WORKER_RPC_GRPC_ASYNC_CALLS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/parameter_store.h"
#include "common/rpc/busy_poll.h"
#include "grpcpp/completion_queue.h"
#include "worker/rpc/grpc_store.h"

namespace ps::worker {

class GrpcParameterStore::AsyncCalls {
 public:
  // Names a started call; ids grow with each Start, from 1.
  using CallId = uint64_t;
  // A call that ended: its id and what the blocking call would have returned.
  struct Done {
    CallId id = 0;
    absl::Status status;
  };

  explicit AsyncCalls(GrpcParameterStore* store);  // `store` not owned
  // Cancels the calls still in flight (their attempts end CANCELLED, no retries) and waits
  // for them to end; their results are dropped.
  ~AsyncCalls();
  AsyncCalls(const AsyncCalls&) = delete;
  AsyncCalls& operator=(const AsyncCalls&) = delete;

  // Start a call and return its id, or the error the blocking call would return before
  // sending anything (NOT_FOUND for an unknown table, INVALID_ARGUMENT for a wrong size); a
  // refused call takes no sequence. The buffers the batches point to (gradients, keys, the
  // pull's output) must stay valid, and the output untouched, until the call is reaped by
  // Next or Wait; the batch structs themselves may go at once. A pull's output holds the
  // answers only once its call ended OK. (gRPC sends payloads from where they lie: a call
  // that failed, or was retried, is reaped only once gRPC let go of them all, which a
  // connection that stopped taking bytes can delay until keepalive closes it.)
  absl::StatusOr<CallId> StartPush(const common::PushBatch& batch,
                                   const common::PushOptions& options);
  absl::StatusOr<CallId> StartPull(const common::PullBatch& batch,
                                   const common::PullOptions& options);
  absl::StatusOr<CallId> StartPushPull(const common::PushBatch& push,
                                       const common::PushOptions& push_options,
                                       const common::PullBatch& pull,
                                       const common::PullOptions& pull_options);

  // Waits for a call to end and returns it: calls that ended before come first, in the order
  // they ended. FAILED_PRECONDITION when no call is in flight or waiting to be reaped.
  absl::StatusOr<Done> Next();
  // Waits for call `id` to end and returns its status; calls that end meanwhile are kept for
  // Next. NOT_FOUND for an id that is neither in flight nor waiting to be reaped.
  absl::Status Wait(CallId id);
  // Calls started and not reaped yet (in flight or ended).
  size_t pending() const { return running_.size() + draining_.size() + ended_.size(); }
  // How the waits for answers went: taken while polling, or after sleeping
  // (GrpcStoreOptions::busy_poll).
  const common::BusyPollStats& poll_stats() const { return poller_.stats(); }

 private:
  friend class GrpcParameterStore;
  struct Call;
  struct Slot;

  // `borrow_pull`: the caller keeps `pull` alive until the call is reaped (the blocking
  // calls); otherwise it is copied.
  absl::StatusOr<CallId> Start(const common::PushBatch* push,
                               const common::PushOptions& push_options,
                               const common::PullBatch* pull,
                               const common::PullOptions& pull_options, bool borrow_pull);
  // Fills c's frame headers and its slots, in the order SendAll sends them; errors before
  // anything is placed or sent.
  absl::Status Build(const common::PushBatch* push, const common::PushOptions& push_options,
                     const common::PullBatch* pull, const common::PullOptions& pull_options,
                     Call* c);
  // Reaps answers while an unfinished push lags by max_sequence_lead or more.
  void WaitForLaggards();
  // Places each of c's frames (its payload into shared memory where it can) and sends its
  // first attempt, one frame after the other.
  void SendAll(Call* c);
  // Sends one attempt of a slot's frame.
  void Send(Slot* slot);
  // Takes one event off the queue, or answers (or expiries) of calls in shared-memory
  // channels, and handles it; may return having only waited a while (callers loop).
  void Step();
  // Handles the channels' answers and expired attempts; with `wait` and none, sleeps until a
  // channel rings or the earliest attempt's deadline. False when it did neither.
  bool StepChannels(bool wait);
  void OnAnswer(Slot* slot);
  // One slot of c is done for good; the call ends with its last one.
  void SlotDone(Call* c);
  // The call is over: counted, and handed back or left draining.
  void End(Call* c);
  // Gives the call's buffers back and queues its Done.
  void HandBack(Call* c);
  // Hands back the draining calls gRPC let go of; whether there was one.
  bool EndDrained();
  bool Draining(CallId id) const;

  GrpcParameterStore* const store_;
  grpc::CompletionQueue queue_;
  CallId next_id_ = 1;
  bool closing_ = false;
  std::map<CallId, std::unique_ptr<Call>> running_;  // by id: in order of start
  std::deque<Done> ended_;                           // ended, not reaped yet
  // Ended, but gRPC still holds slices of their payloads (see End): reaped once it let go.
  std::vector<std::unique_ptr<Call>> draining_;
  common::BusyPoller poller_;  // waits for queue_
  size_t queue_events_ = 0;    // attempts and alarms whose tag queue_ will deliver
  std::vector<Slot*> in_channels_;  // attempts posted in shared-memory channels
  // StepChannels' scratch (kept to save allocations per wait).
  std::vector<const common::SharedChannel*> wait_channels_;
  std::vector<uint32_t> wait_bells_;
  std::vector<Slot*> done_slots_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_RPC_GRPC_ASYNC_CALLS_H_
