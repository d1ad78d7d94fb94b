// Process-wide allocator settings for processes on the data path (servers, workers, benches).
//
// Why: gRPC allocates the slices it receives a message into inside the library, per message,
// out of reach of the pools this project keeps for its own payload buffers (BufferPool,
// common/rpc/frame.h). With glibc's defaults, freeing a large slice gives its pages back to
// the kernel (munmap above the mmap threshold, trimming of the heap top and of per-thread
// arenas), so the next message maps and faults fresh pages: about 13 us per 4 KB page on the
// development VM, over 3 ms for a 1 MB push, which was most of its cost (see
// docs/performance.md). Keeping freed memory in the process lets the next message reuse the
// same, already mapped pages.
#ifndef PS_COMMON_STARTUP_PROCESS_MEMORY_H_
#define PS_COMMON_STARTUP_PROCESS_MEMORY_H_

#include "absl/status/status.h"

namespace ps::common {

// Makes glibc keep freed memory for reuse: allocations up to 32 MB (glibc's largest mmap
// threshold) come from one heap (one arena), which is not trimmed back to the kernel on free. The
// process keeps its peak heap mapped (it is reused by later messages). Call once, early in
// main, before threads start. INTERNAL if glibc refuses a setting; a no-op elsewhere than glibc.
absl::Status KeepFreedMemoryForReuse();

// Turns off Abseil's mutex deadlock detection for the process. Debian builds Abseil without
// NDEBUG, so detection is on by default: every absl::Mutex lock (gRPC's own locks included)
// records lock-order edges in one process-wide graph under a global lock, 5-8% of a server's
// CPU on 4 KB calls (perf: GraphCycles::GetId/InsertEdge). Tests keep it on. Call early in
// main, before threads start.
void SkipMutexDeadlockChecks();

}  // namespace ps::common

#endif  // PS_COMMON_STARTUP_PROCESS_MEMORY_H_
