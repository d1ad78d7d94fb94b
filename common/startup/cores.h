// How many cores this process may use, for sizing its thread pools.
//
// std::thread::hardware_concurrency() counts the machine's online CPUs. A server in a
// container usually gets fewer: a cpuset (docker --cpuset-cpus, Kubernetes' static CPU
// manager) narrows the process's affinity mask, and a CPU limit (Kubernetes' limits.cpu,
// docker --cpus) sets a cgroup v2 quota, cpu.max, under which threads beyond the quota only
// get throttled. Sizing pools by the machine's count there starts, say, 63 apply helpers in
// a pod allowed 2 cores.
#ifndef PS_COMMON_STARTUP_CORES_H_
#define PS_COMMON_STARTUP_CORES_H_

#include "absl/strings/string_view.h"

namespace ps::common {

// The CPUs in this process's affinity mask, capped by its cgroup v2 CPU quota when one is set
// (the cpu.max of its cgroup, /proc/self/cgroup); at least 1.
unsigned UsableCores();

// The cores a cgroup v2 cpu.max line allows ("QUOTA PERIOD" in microseconds: QUOTA / PERIOD
// rounded up; "max PERIOD": no quota), at most `cpus`, at least 1. `cpus` for a line that does
// not parse.
unsigned CoresUnderQuota(absl::string_view cpu_max, unsigned cpus);

}  // namespace ps::common

#endif  // PS_COMMON_STARTUP_CORES_H_
