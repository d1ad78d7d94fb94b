// Waiting for an event by polling for it before going to sleep (BusyWaiter); for a gRPC
// completion queue: common/rpc/busy_poll.h.
//
// A thread that sleeps (in a completion queue's epoll_wait, on a futex) until its answer,
// request or work arrives has to be woken by the kernel, and on a virtual machine that
// wake-up is dear: the peer that sends pays an inter-processor interrupt through the
// hypervisor in the socket's wake-up path (pvm_irq_enable was 18% of a server's and 12% of a
// worker's CPU in a training step on the development VM: docs/lab/2026-12-02-busy-poll.md).
// A thread that polls for its event without blocking while it expects one is never asleep
// when it comes: nobody pays the wake-up, and the event is handled without the scheduler's
// latency.
//
// Polling pays on a core that would otherwise idle, and on a wanted core while the thread the
// poller yields it to is the one doing the work it waits for. Between polls the thread calls
// sched_yield(), so any other thread ready to run on its core gets the core at once; and
// each poll measures how much of its wall time this thread actually ran. When it ran less
// than half of it, other threads wanted the core (more busy threads than cores: the yields
// handed it over). Such a contended spin is judged by what it got:
//  - it ended with its event after less CPU than kCheapSpin (and, for a waiter given a
//    `cheap_wall`, within it): the yields handed the core to the work the poller waited for
//    (a peer on the same cores serving its call), and the spin cost less than the sleep and
//    wake-up it saved. Polling goes on.
//  - it ran out, spent more CPU, or lasted longer: the poller sleeps at once for its next
//    waits, 8 after the first such spin and twice as many after each further one in a row
//    (at most 1024), before it tries polling again.
// The wall-time limit is for waits whose event comes when a peer is ready, not when work done
// for this thread ends: a server's wait for the next request. Such a wait, contended and
// long, is one through other threads' work (the workers' compute); its yields keep a thread
// ready to run on the core, so the core never looks idle, and a thread woken meanwhile (a
// worker's, the other server's) queues behind a busy one instead of taking the core a
// sleeper would leave. A wait for an answer (a worker's) is not limited: the work it waits
// for is its own call being served, which its yields hand the core to.
// So a machine with idle cores gets the wake-ups saved; peers that take turns on few cores
// (workers and servers of one host: docs/lab/2026-12-03-cheap-spins.md) hand each other the
// core without sleeping; and a poller whose event is far off (a server waiting through a
// worker's compute on a busy machine) gets plain sleeping waits after a short probe.
//
// The cost where it polls: the thread shows as busy (up to `spin` per wait) on a core that
// had nothing else to do.
#ifndef PS_COMMON_BUSY_WAIT_H_
#define PS_COMMON_BUSY_WAIT_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"

namespace ps::common {

// What a BusyWaiter did, summed over its waits (for tests and tuning).
struct BusyPollStats {
  uint64_t events_polled = 0;    // events that came while polling
  uint64_t waits_blocked = 0;    // waits that slept (the caller's blocking wait)
  uint64_t polls = 0;            // non-blocking polls
  uint64_t contended_spins = 0;  // polling stretches that ran less than half their wall time
  uint64_t cheap_contended_spins = 0;  // of them, ended with their event cheaply (see above)
  uint64_t waits_backed_off = 0; // waits that slept at once after contended spins
};

// Not thread-safe: one per waiting thread.
class BusyWaiter {
 public:
  // CPU below which a contended spin that got its event is worth repeating. A sleeping wait
  // costs the machine a futex wait, a wake-up and two switches: on the development VM 24 us
  // of latency across the vCPUs and about 7 us of CPU per switch (docs/lab/2026-12-02-floors.md),
  // 30-60 us in all; a threshold of twice that keeps the spins that beat it with room for noise.
  static constexpr absl::Duration kCheapSpin = absl::Microseconds(100);
  // The `cheap_wall` of a server's waits for requests. In the README's job (2 servers + 2
  // workers on 2 vCPUs, 10 epochs) the servers' waits lasted through the workers' compute
  // (about 650 us a step), and many of them (about 40% of the contended ones) were judged
  // cheap by their CPU alone; with this limit the job ran 5-10% more samples/s and each
  // worker's pull + push time went from 0.91-1.02 of its compute time to 0.67-0.76.
  // ps_bench's 2 + 2 calls, whose requests come within it, moved within the rounds' spread,
  // but for the 4 KB push (2-9% lower in three rounds;
  // docs/lab/2026-12-06-long-contended-spins.md).
  static constexpr absl::Duration kCheapRequestWait = absl::Microseconds(500);

  // `spin` <= 0: every wait sleeps at once. Without `judge`, spins are never judged (nor
  // their CPU time read, a system call at each end): every wait polls for the whole `spin`
  // whoever else wants the core (a one-off watch, or tests).
  // `cheap_wall`: a contended spin that lasts this long or longer is never cheap (see the
  // file comment; infinite: no limit).
  explicit BusyWaiter(absl::Duration spin, bool judge = true,
                      absl::Duration cheap_wall = absl::InfiniteDuration())
      : spin_(spin), judge_(judge), cheap_wall_(cheap_wall) {}

  // Calls `ready` (yielding the core between calls) for up to `spin` unless backed off (see
  // the file comment), and returns true as soon as it does; false: the caller sleeps (counted
  // as a blocked wait).
  bool Poll(absl::FunctionRef<bool()> ready);
  // The same for a poll with three answers: 1 = an event, -1 = shut down, 0 = none yet.
  // Returns the last answer (0: none came, or spinning is off or backed off); the caller
  // counts its own blocked wait (CountBlockedWait) when it then sleeps.
  int MaybeSpin(absl::FunctionRef<int()> poll);
  void CountBlockedWait() { ++stats_.waits_blocked; }

  const BusyPollStats& stats() const { return stats_; }
  // Whether the latest spin long enough to judge (with `judge`) ran less than half its wall
  // time: other threads wanted this thread's core. False before any.
  bool last_spin_contended() const { return last_contended_; }

 private:
  // Calls `poll` for up to spin_ until it returns non-zero.
  int Spin(absl::FunctionRef<int()> poll);

  const absl::Duration spin_;
  const bool judge_;
  const absl::Duration cheap_wall_;
  uint32_t backoff_ = 0;     // waits to sleep at once after the latest contended spin
  uint32_t skip_waits_ = 0;  // of them, still to go
  bool last_contended_ = false;
  BusyPollStats stats_;
};

}  // namespace ps::common

#endif  // PS_COMMON_BUSY_WAIT_H_
