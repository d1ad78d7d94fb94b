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
// cost per byte of each way, uses the cheaper, and tries the other on one call in
// `explore_every`, so a change of placement is found within a few such calls. It changes ways
// only when the other is cheaper by more than `margin`: two ways that cost about the same are
// not taken in turns on noise.
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
    // One call in this many tries the way that costs more (>= 2).
    uint32_t explore_every = 32;
    // Weight of a new cost in its way's running estimate, (0, 1].
    double weight = 0.25;
    // The way in use changes when the other's estimate is lower by more than this fraction
    // of its own, [0, 1).
    double margin = 0.1;
  };

  HandoffChooser() : HandoffChooser(Options{}) {}
  explicit HandoffChooser(Options options);

  // Whether the next call streams (non-temporal stores). Until each way has a cost, the untried
  // one, streamed first; then the way in use, which starts as streamed.
  bool Stream() ABSL_LOCKS_EXCLUDED(mu_);
  // A call that used `stream` cost `cost` (any unit, lower is better: time per byte). A cost
  // far off the way's estimate (a call that waited for something else: a pull held by the
  // staleness bound, a busy server) counts as at most 4x or at least 1/4 of it. Costs <= 0
  // (or NaN) are ignored.
  void Record(bool stream, double cost) ABSL_LOCKS_EXCLUDED(mu_);

  // The current estimates (< 0: none yet), for tests and logs.
  double estimate(bool stream) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const Options options_;
  mutable absl::Mutex mu_;
  double estimate_[2] ABSL_GUARDED_BY(mu_) = {-1, -1};  // [plain, streamed]
  uint64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool streaming_ ABSL_GUARDED_BY(mu_) = true;  // the way in use
};

}  // namespace ps::common

#endif  // PS_COMMON_RPC_HANDOFF_CHOOSER_H_
