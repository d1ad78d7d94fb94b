#include "worker/data/memory_limit.h"

#include <unistd.h>

#include "absl/strings/str_format.h"

namespace ps::worker {

uint64_t DatasetMemoryLimit(uint64_t max_bytes) {
  if (max_bytes > 0) return max_bytes;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

absl::Status CheckDatasetFits(double bytes, uint64_t limit, absl::string_view what) {
  if (limit == 0 || bytes <= static_cast<double>(limit)) return absl::OkStatus();
  constexpr double kGiB = 1 << 30;
  return absl::ResourceExhaustedError(
      absl::StrFormat(
          "%s take about %.1f GiB, more than the %.1f GiB of memory they may take (this "
          "machine's memory, unless set lower)",
          what,
                      bytes / kGiB, static_cast<double>(limit) / kGiB));
}

}  // namespace ps::worker
