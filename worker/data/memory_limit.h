// How much memory a dataset loaded into memory may take, and the check that refuses one that
// would take more (RESOURCE_EXHAUSTED, naming the sizes) instead of leaving the process to the
// allocator or the kernel's OOM killer part way through. The readers check what a file's
// header declares before reading it, and, where nothing is declared (LIBSVM), each growth of
// their arrays; so a small gzip file that decompresses to more than memory holds is refused.
#ifndef PS_WORKER_DATA_MEMORY_LIMIT_H_
#define PS_WORKER_DATA_MEMORY_LIMIT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps::worker {

// `max_bytes` when it is set (> 0), else this machine's physical memory; 0 when that is
// unknown (no limit).
uint64_t DatasetMemoryLimit(uint64_t max_bytes = 0);

// OK when `bytes` <= `limit` or `limit` is 0; otherwise RESOURCE_EXHAUSTED reading
// "<what> take about X GiB, more than the Y GiB of memory they may take ...".
absl::Status CheckDatasetFits(double bytes, uint64_t limit, absl::string_view what);

}  // namespace ps::worker

#endif  // PS_WORKER_DATA_MEMORY_LIMIT_H_
