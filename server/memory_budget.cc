#include "server/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::server {

namespace {

// Whether `bytes` more fit beside `used` under `limit` (> 0); else RESOURCE_EXHAUSTED.
absl::Status Room(uint64_t bytes, int64_t used, uint64_t limit, absl::string_view what) {
  const int64_t in_use = std::max<int64_t>(0, used);
  if (bytes <= limit && static_cast<uint64_t>(in_use) <= limit - bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(what, " needs ", bytes,
                                                   " bytes; this server holds ", in_use, " of its ",
                                                   limit, " (server.max_memory_bytes)"));
}

}  // namespace

absl::Status MemoryBudget::CheckRoom(uint64_t bytes, absl::string_view what) const {
  if (limit_ == 0) return absl::OkStatus();
  return Room(bytes, used(), limit_, what);
}

absl::Status MemoryBudget::TryCharge(uint64_t bytes, absl::string_view what) {
  if (limit_ == 0) {
    Add(static_cast<int64_t>(bytes));
    return absl::OkStatus();
  }
  int64_t used = used_.load(std::memory_order_relaxed);
  while (true) {
    RETURN_IF_ERROR(Room(bytes, used, limit_, what));
    if (used_.compare_exchange_weak(used, used + static_cast<int64_t>(bytes),
                                    std::memory_order_relaxed)) {
      return absl::OkStatus();
    }
  }
}

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

uint64_t DefaultMaxMemoryBytes() { return PhysicalMemoryBytes() / 10 * 8; }

uint64_t DenseBytesOnServer(const common::Partitioner& partitioner, const common::TableInfo& table,
                            uint32_t server, int num_slots) {
  // Floats: each block's parameters, and each slot with the padding before it.
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  uint64_t floats = 0;
  for (uint32_t b : partitioner.BlocksOnServer(table, server)) {
    auto [begin, end] = partitioner.BlockRange(table, b);
    const uint64_t size = end - begin, stride = DenseSlotStride(size);
    const uint64_t slots = static_cast<uint64_t>(num_slots);
    if (slots != 0 && stride > (kMax - size) / slots) return kMax;
    const uint64_t block = size + slots * stride;
    if (block > kMax - floats) return kMax;
    floats += block;
  }
  return floats > kMax / sizeof(float) ? kMax : floats * sizeof(float);
}

}  // namespace ps::server
