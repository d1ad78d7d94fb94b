// Which stores to hand bytes to another process with: plain or non-temporal, chosen per call
// by what each way has cost lately.
//
// Bytes written into shared memory for another process to read next (a push's payload, a
// pull's answer) cost very different amounts either way depending on where the two processes
// run, which neither controls (common/stream_copy.h):
//  - their cores share a cache, or they take turns on one core: plain stores leave the bytes
//    in that cache and the reader finds them there; non-temporal ones send them through memory
//    (1 and 4 MB calls between two pairs of processes on the 2-vCPU development VM: plain
//    1.4-2.0x faster);
//  - their cores share none (two dies; a VM's vCPUs placed on them by the host): the reader
//    takes every plain-written line from the writer's core, slower than from memory (a 1 MB
//    push between one pair on that VM: 1,748-1,771 MB/s plain against 6,952-8,193 streamed;
//    docs/lab/2026-12-03-cross-core-handoff.md).
// And the host moves between the two while a job runs. So a chooser per link keeps the recent
// costs per byte of each way, uses the cheaper, and tries the other on one call in
// `explore_every` (fewer while the other stays far dearer), so a change of placement is
// found within `window` / 2 + 1 such tries. A
// way's cost is the median of its last `window` costs: a call slowed by something else (an
// interrupt, a cold cache, a pull held by the staleness bound) does not move it, where in a
// running average one such call could make the cheaper way look dearer for a while (1 MB
// pushes between two pairs of processes on two vCPUs streamed in stretches of up to half
// their calls: docs/lab/2026-12-06-handoff-costs.md). It changes ways only when the other is
// cheaper by more than `margin`: two ways that cost about the same are not taken in turns on
// noise.
//
// Thread-safe.
#ifndef PS_COMMON_RPC_HANDOFF_CHOOSER_H_
#define PS_COMMON_RPC_HANDOFF_CHOOSER_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps::common {

class HandoffChooser {
 public:
  struct Options {
    // One call in this many tries the way that costs more (>= 2); each try that costs more
    // than the way in use by over `margin` again doubles the gap, up to max_explore_every (a
    // way much dearer than the other costs little to keep watching), and one that does not
    // brings it back to explore_every.
    uint32_t explore_every = 32;
    uint32_t max_explore_every = 256;  // (>= explore_every)
    // A way's estimate is the median of its last this many costs, [1, kMaxWindow].
    uint32_t window = 9;
    // The way in use changes when the other's estimate is lower by more than this fraction
    // of its own, [0, 1).
    double margin = 0.1;
    // One call of the way in use in this many is weighed (>= 1), once its window is full;
    // every try of the other way is, and every call until the way has a full window. Weighing
    // a call reads the CPU time of the threads serving it, a system call on each side (1.4 us
    // each on a 2-vCPU AMD VM of 2026-12-06, more with the kernel's exit path in a profile,
    // where a 1 MB push took about six of them: 4-8% of the call's CPU).
    uint32_t weigh_every = 8;
  };
  static constexpr uint32_t kMaxWindow = 64;

  HandoffChooser() : HandoffChooser(Options{}) {}
  explicit HandoffChooser(Options options);

  // Whether the next call streams (non-temporal stores). Until each way has a cost, the untried
  // one, streamed first; then the way in use, which starts as streamed.
  bool Stream() ABSL_LOCKS_EXCLUDED(mu_) {
    bool weigh;
    return Stream(&weigh);
  }
  // The same, and in *weigh whether the call is to be weighed: its cost Recorded (a cost
  // Recorded of a call not weighed counts all the same).
  bool Stream(bool* weigh) ABSL_LOCKS_EXCLUDED(mu_);
  // A call that used `stream` cost `cost` (any unit, lower is better: time per byte). Costs
  // <= 0 (or NaN) are ignored.
  void Record(bool stream, double cost) ABSL_LOCKS_EXCLUDED(mu_);

  // What handing a call's bytes cost per byte, to Record: the CPU its copies took the calling
  // thread (`copy_cpu_ns`) and the server's threads serving it (`served_cpu_ns`, the server's
  // word: capped at kMaxServedNs), which other processes sharing the cores do not inflate as
  // they do a call's time; from a server that does not say (0), the call's time from placing
  // its payload to copying out its answer (`call_ns`).
  static double CallCost(int64_t copy_cpu_ns, uint64_t served_cpu_ns, int64_t call_ns,
                         uint64_t bytes);
  static constexpr uint64_t kMaxServedNs = uint64_t{1} << 32;  // 4.3 s

  // The current estimates (< 0: none yet), for tests and logs.
  double estimate(bool stream) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The last costs of one way, and their median.
  struct Costs {
    double last[kMaxWindow];
    uint32_t count = 0;  // how many of `last` hold costs
    uint32_t next = 0;   // where the next goes
    double median = -1;  // none yet
  };

  const Options options_;
  mutable absl::Mutex mu_;
  Costs costs_[2] ABSL_GUARDED_BY(mu_);          // [plain, streamed]
  uint64_t since_try_ ABSL_GUARDED_BY(mu_) = 0;  // calls since the last try of the other way
  uint32_t since_weighed_ ABSL_GUARDED_BY(mu_) = 0;  // calls of the way in use since one weighed
  uint64_t gap_ ABSL_GUARDED_BY(mu_);            // calls between tries now
  bool streaming_ ABSL_GUARDED_BY(mu_) = true;   // the way in use
};

}  // namespace ps::common

#endif  // PS_COMMON_RPC_HANDOFF_CHOOSER_H_
