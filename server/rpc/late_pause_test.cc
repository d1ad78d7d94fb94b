#include "server/rpc/late_pause.h"

#include "gtest/gtest.h"

namespace ps::server {
namespace {

constexpr absl::Duration kBase = absl::Seconds(10);
const absl::Time kStart = absl::FromUnixSeconds(1000000);

TEST(LatePause, TheFirstIsTheBase) {
  const LatePause p = NextLatePause(nullptr, kStart, kBase);
  EXPECT_EQ(p.until, kStart + kBase);
  EXPECT_EQ(p.doublings, 0);
}

// Late again each time a pause ends: 20 s, 40 s, ... up to 64x, then 64x again.
TEST(LatePause, EachLatePayloadDoublesItUpToTheCap) {
  LatePause p = NextLatePause(nullptr, kStart, kBase);
  for (int i = 1; i <= kMaxLatePauseDoublings + 3; ++i) {
    const absl::Time now = p.until + absl::Seconds(1);
    p = NextLatePause(&p, now, kBase);
    const int doublings = std::min(i, kMaxLatePauseDoublings);
    EXPECT_EQ(p.doublings, doublings) << i;
    EXPECT_EQ(p.until, now + kBase * (1 << doublings)) << i;
  }
  EXPECT_EQ(p.doublings, 6);  // 640 s at the 10 s base
}

// A payload late while the pause lasts (a call taken before it began) changes nothing.
TEST(LatePause, LateWhilePausedLeavesThePause) {
  const LatePause p = NextLatePause(nullptr, kStart, kBase);
  const LatePause q = NextLatePause(&p, p.until - absl::Nanoseconds(1), kBase);
  EXPECT_EQ(q.until, p.until);
  EXPECT_EQ(q.doublings, p.doublings);
}

// Each kLatePauseDecay base pauses of quiet after a pause ended take one doubling off before
// the new one is added: a worker late now and then pauses for twice the base, and one that
// waits out the decay each time gains nothing by it.
TEST(LatePause, QuietTakesDoublingsOff) {
  LatePause p{kStart, 4};
  const absl::Duration decay = kLatePauseDecay * kBase;
  EXPECT_EQ(NextLatePause(&p, kStart + decay - absl::Seconds(1), kBase).doublings, 5);
  EXPECT_EQ(NextLatePause(&p, kStart + decay, kBase).doublings, 4);
  EXPECT_EQ(NextLatePause(&p, kStart + 3 * decay, kBase).doublings, 2);
  EXPECT_EQ(NextLatePause(&p, kStart + 100 * decay, kBase).doublings, 1);
  // Waiting out the decay after each pause: it stays at 2x.
  LatePause q = NextLatePause(nullptr, kStart, kBase);
  for (int i = 0; i < 5; ++i) q = NextLatePause(&q, q.until + decay, kBase);
  EXPECT_EQ(q.doublings, 1);
}

TEST(LatePause, NoBaseNoPause) {
  const LatePause p = NextLatePause(nullptr, kStart, absl::ZeroDuration());
  EXPECT_EQ(p.until, kStart);
  const LatePause q = NextLatePause(&p, kStart, -absl::Seconds(1));
  EXPECT_EQ(q.until, kStart);
}

// A wait's excess is over 1 ms per MB of payload: a 4 MB payload waited for 3 ms owes nothing.
TEST(WaitDebt, AnHonestCopysTimeIsNotOwed) {
  EXPECT_EQ(ExcessWait(absl::Milliseconds(3), 4 << 20),
            absl::Milliseconds(3) - absl::Microseconds(4194));
  EXPECT_LT(ExcessWait(absl::Milliseconds(3), 4 << 20), absl::ZeroDuration());
  EXPECT_EQ(ExcessWait(absl::Milliseconds(9), 4), absl::Milliseconds(9));
}

// Excesses add up; the debt drains at 1/32 of the time passing, never below nothing.
TEST(WaitDebt, AddsUpAndDrains) {
  WaitDebt d = AddWaitDebt(WaitDebt{}, kStart, absl::Milliseconds(9));
  EXPECT_EQ(d.owed, absl::Milliseconds(9));
  d = AddWaitDebt(d, kStart + absl::Milliseconds(10), absl::Milliseconds(9));
  EXPECT_EQ(d.owed, absl::Milliseconds(18) - absl::Milliseconds(10) / kWaitDebtDrain);
  EXPECT_EQ(d.at, kStart + absl::Milliseconds(10));
  // A second of quiet drains 31.25 ms: nothing is left of 17.7 ms.
  d = AddWaitDebt(d, d.at + absl::Seconds(1), absl::Milliseconds(1));
  EXPECT_EQ(d.owed, absl::Milliseconds(1));
  // A clock read earlier than the last (another thread's) drains nothing.
  const absl::Time at = d.at;
  d = AddWaitDebt(d, at - absl::Seconds(1), absl::Milliseconds(1));
  EXPECT_EQ(d.owed, absl::Milliseconds(2));
  EXPECT_EQ(d.at, at);
}

}  // namespace
}  // namespace ps::server
