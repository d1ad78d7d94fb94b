// How long a worker whose push payload, written after its call, came late sends its payloads
// whole (ParameterServerService, ServiceOptions::late_following_pause). Each late payload
// doubles the pause before it (the first: the base), at most kMaxLatePauseDoublings times; each
// kLatePauseDecay base pauses of quiet after a pause ended take one doubling off first. So a
// worker that is late again and again (a liar that writes its count just in time, or never)
// holds a server thread at most once per pause (64 base pauses once doubled 6 times; once per
// 66 base pauses at best if it waits out the decay), and an honest worker late now and then (a
// loaded host) pauses for twice the base.
#ifndef PS_SERVER_RPC_LATE_PAUSE_H_
#define PS_SERVER_RPC_LATE_PAUSE_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace ps::server {

inline constexpr int kMaxLatePauseDoublings = 6;
inline constexpr int64_t kLatePauseDecay = 64;

struct LatePause {
  absl::Time until = absl::InfinitePast();
  int doublings = 0;  // of the base pause
};

// The pause of a worker late at `now`, after `previous` (null: never late before). Late again
// while paused (a call taken before the pause began): the pause stands. `base` <= 0: none.
inline LatePause NextLatePause(const LatePause* previous, absl::Time now, absl::Duration base) {
  if (base <= absl::ZeroDuration()) return LatePause{now, 0};
  if (previous != nullptr && now < previous->until) return *previous;
  LatePause next;
  if (previous != nullptr) {
    absl::Duration unused;
    const int64_t off = absl::IDivDuration(now - previous->until, kLatePauseDecay * base, &unused);
    const int64_t left = std::max<int64_t>(0, previous->doublings - off);
    next.doublings = static_cast<int>(std::min<int64_t>(kMaxLatePauseDoublings, left + 1));
  }
  next.until = now + base * (int64_t{1} << next.doublings);
  return next;
}

}  // namespace ps::server

#endif  // PS_SERVER_RPC_LATE_PAUSE_H_
