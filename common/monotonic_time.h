// A monotonic clock in absl::Time: for timing waits and pauses that a step of the wall clock
// (an NTP step, a changed date) must neither lengthen nor cut short. Its times are comparable
// only with each other: they are not dates.
#ifndef PS_COMMON_MONOTONIC_TIME_H_
#define PS_COMMON_MONOTONIC_TIME_H_

#include <chrono>

#include "absl/time/time.h"

namespace ps::common {

inline absl::Time MonotonicNow() {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

}  // namespace ps::common

#endif  // PS_COMMON_MONOTONIC_TIME_H_
