// What the WorkerTracker tests share: a clock moved by hand, and tracker options.
#ifndef PS_SERVER_WORKER_TRACKER_TESTING_H_
#define PS_SERVER_WORKER_TRACKER_TESTING_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>

#include "absl/time/time.h"
#include "server/worker_tracker.h"

namespace ps::server::worker_tracker_testing {

// A clock tests move by hand.
struct FakeClock {
  std::atomic<int64_t> seconds{1000};
  std::function<absl::Time()> fn() {
    return [this] { return absl::FromUnixSeconds(seconds.load()); };
  }
};

WorkerTrackerOptions Options(uint32_t workers, std::optional<int32_t> staleness) {
  WorkerTrackerOptions o;
  o.num_workers = workers;
  o.staleness = staleness;
  o.lease = absl::Seconds(30);
  return o;
}

}  // namespace ps::server::worker_tracker_testing

#endif  // PS_SERVER_WORKER_TRACKER_TESTING_H_
