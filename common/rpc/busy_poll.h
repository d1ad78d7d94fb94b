// Waiting for a gRPC completion queue by polling it before going to sleep: a BusyWaiter
// (common/busy_wait.h, which says when polling pays and how it backs off) whose event is the
// queue's next one.
#ifndef PS_COMMON_RPC_BUSY_POLL_H_
#define PS_COMMON_RPC_BUSY_POLL_H_

#include "absl/time/time.h"
#include "common/busy_wait.h"
#include "grpcpp/completion_queue.h"

namespace ps::common {

// Not thread-safe: one per waiting thread.
class BusyPoller : public BusyWaiter {
 public:
  // `spin` <= 0: every wait is the plain blocking Next. `cheap_wall`: as BusyWaiter's.
  explicit BusyPoller(absl::Duration spin, absl::Duration cheap_wall = absl::InfiniteDuration())
      : BusyWaiter(spin, /*judge=*/true, cheap_wall) {}

  // As cq->Next(tag, ok): the next event of `cq` (true), or false once the queue is shut
  // down and drained. Polls `cq` without blocking (yielding the core between polls) for up
  // to `spin` first, unless backed off; then blocks in Next.
  bool Next(grpc::CompletionQueue* cq, void** tag, bool* ok);
};

}  // namespace ps::common

#endif  // PS_COMMON_RPC_BUSY_POLL_H_
