#include "common/startup/cores.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ps::common {
namespace {

unsigned AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<unsigned>(n);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The cpu.max of this process's cgroup (cgroup v2: the "0::PATH" line of /proc/self/cgroup),
// or of the root of /sys/fs/cgroup (a container's own cgroup namespace); empty if neither.
std::string CpuMaxLine() {
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "0::")) {
      std::string own = ReadFirstLine(absl::StrCat("/sys/fs/cgroup", rest, "/cpu.max"));
      if (!own.empty()) return own;
    }
  }
  return ReadFirstLine("/sys/fs/cgroup/cpu.max");
}

}  // namespace

unsigned CoresUnderQuota(absl::string_view cpu_max, unsigned cpus) {
  cpus = std::max(1u, cpus);
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(cpu_max), ' ', absl::SkipEmpty());
  uint64_t quota = 0, period = 0;
  if (fields.size() != 2 || fields[0] == "max" || !absl::SimpleAtoi(fields[0], &quota) ||
      !absl::SimpleAtoi(fields[1], &period) || quota == 0 || period == 0) {
    return cpus;
  }
  const uint64_t cores = (quota + period - 1) / period;
  return static_cast<unsigned>(std::min<uint64_t>(cpus, cores));
}

unsigned UsableCores() { return CoresUnderQuota(CpuMaxLine(), AffinityCpus()); }

}  // namespace ps::common
