#include "common/startup/process_memory.h"

#include "absl/synchronization/mutex.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ps::common {

absl::Status KeepFreedMemoryForReuse() {
#if defined(__GLIBC__)
  // A fixed threshold also turns off glibc's dynamic one, which would otherwise move with the
  // sizes freed. 32 MB is the largest glibc accepts on 64-bit.
  constexpr int kMmapThreshold = 32 << 20;
  constexpr int kTrimThreshold = 1 << 30;
  // One arena: glibc unmaps a per-thread arena's extra heap as soon as it is entirely free,
  // whatever the trim threshold, and a 64 MB message in 64 KB receive slices spans several
  // such heaps. The main arena grows with brk and keeps its memory. Small allocations
  // mostly stay in per-thread caches (tcache), so the shared arena's lock is rarely taken.
  if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) != 1 ||
      mallopt(M_TRIM_THRESHOLD, kTrimThreshold) != 1 || mallopt(M_ARENA_MAX, 1) != 1) {
    return absl::InternalError("mallopt refused the data path's allocator settings");
  }
#endif
  return absl::OkStatus();
}

void SkipMutexDeadlockChecks() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace ps::common
