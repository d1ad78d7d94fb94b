#include "common/rpc/busy_poll.h"

#include "grpc/support/time.h"

namespace ps::common {

bool BusyPoller::Next(grpc::CompletionQueue* cq, void** tag, bool* ok) {
  const gpr_timespec passed = gpr_time_0(GPR_CLOCK_MONOTONIC);  // a deadline already passed
  const int got = MaybeSpin([&] {
    switch (cq->AsyncNext(tag, ok, passed)) {
      case grpc::CompletionQueue::GOT_EVENT:
        return 1;
      case grpc::CompletionQueue::SHUTDOWN:
        return -1;
      default:
        return 0;
    }
  });
  if (got != 0) return got > 0;
  CountBlockedWait();
  return cq->Next(tag, ok);
}

}  // namespace ps::common
