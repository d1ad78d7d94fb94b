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

// A worker that raises its count just under late_following after each call, again and again,
// is late on none of them, yet holds a channel thread most of the time. So each wait's excess
// over what an honest copy of its payload takes (kHonestCopyBytesPerUs) is owed, the debt
// draining at 1/kWaitDebtDrain of the time passing, and a debt over late_following pauses the
// worker as one late payload does: such a worker holds the thread beyond honest copies at most
// that long at once and 1/kWaitDebtDrain of the time in the long run. An honest worker's waits
// stay within the allowance (a 1 MB copy: under 0.1 ms on the development VM) except when it
// is descheduled mid-copy (a time slice, a few ms), which the drain takes back in a fraction
// of a second.
inline constexpr uint64_t kHonestCopyBytesPerUs = 1000;  // 1 GB/s
inline constexpr int64_t kWaitDebtDrain = 32;

struct WaitDebt {
  absl::Duration owed = absl::ZeroDuration();
  absl::Time at = absl::InfinitePast();  // when it was last raised
};

// How much longer than an honest copy of `bytes` a wait of `waited` took (<= 0: no longer).
inline absl::Duration ExcessWait(absl::Duration waited, uint64_t bytes) {
  return waited - absl::Microseconds(static_cast<int64_t>(bytes / kHonestCopyBytesPerUs));
}

// `debt` raised by `excess` at `now`: what was owed, less 1/kWaitDebtDrain of the time since
// it was last raised (never below nothing), plus `excess`. A `now` before that (another
// thread's earlier reading) drains nothing and leaves the time as it was.
inline WaitDebt AddWaitDebt(const WaitDebt& debt, absl::Time now, absl::Duration excess) {
  absl::Duration left = debt.owed;
  if (debt.at != absl::InfinitePast() && now > debt.at) left -= (now - debt.at) / kWaitDebtDrain;
  return WaitDebt{std::max(left, absl::ZeroDuration()) + excess, std::max(debt.at, now)};
}

}  // namespace ps::server

#endif  // PS_SERVER_RPC_LATE_PAUSE_H_
