// The CPU time of the calling thread: what a piece of work cost the machine, apart from the
// time other threads had its core (a wall clock counts that too).
#ifndef PS_COMMON_THREAD_CPU_H_
#define PS_COMMON_THREAD_CPU_H_

#include <time.h>

#include <cstdint>

namespace ps::common {

// Nanoseconds of CPU the calling thread has used. A system call (not the vDSO): about a
// microsecond's fraction, for work of tens of microseconds or more.
inline int64_t ThreadCpuNanos() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace ps::common

#endif  // PS_COMMON_THREAD_CPU_H_
