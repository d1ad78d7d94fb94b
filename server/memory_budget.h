// MemoryBudget: how many bytes one server may hold in parameters, optimizer slots and sparse
// rows (server.max_memory_bytes), and how many it holds now.
//
// Dense tables are sized before anything is allocated (DenseBytesOnServer): a layout that
// does not fit is refused at start with RESOURCE_EXHAUSTED naming the table, instead of
// allocating until the kernel's OOM killer ends the process (a SIGTERM cannot interrupt an
// allocation, so refusing first is what keeps the server stoppable). Sparse tables charge
// the real bytes of their rows and index structures as they grow, and refuse to create rows
// that would not fit (see SparseTablePart).
#ifndef PS_SERVER_MEMORY_BUDGET_H_
#define PS_SERVER_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/partitioner.h"

namespace ps::server {

// Thread-safe.
class MemoryBudget {
 public:
  // `limit_bytes` 0 = unlimited.
  explicit MemoryBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}

  uint64_t limit() const { return limit_; }
  // Bytes charged now. May exceed the limit by what concurrent callers add between their
  // CheckRoom and their charge: the new sparse rows of the pushes checked at once (each
  // push's new rows, over all its tables, are checked together, then charged as they are
  // made), for good.
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  // Charges (delta > 0) or releases (delta < 0) bytes actually allocated.
  void Add(int64_t delta) { used_.fetch_add(delta, std::memory_order_relaxed); }
  // OK when `bytes` more fit; RESOURCE_EXHAUSTED naming `what`, the bytes, the limit and the
  // use otherwise.
  absl::Status CheckRoom(uint64_t bytes, absl::string_view what) const;
  // CheckRoom and Add(bytes) in one step: of concurrent callers, only those whose bytes fit
  // together are charged (for large charges, e.g. a shared-memory segment, where CheckRoom
  // then Add let every concurrent caller through). Errors as CheckRoom's; nothing is charged.
  absl::Status TryCharge(uint64_t bytes, absl::string_view what);

 private:
  const uint64_t limit_;
  std::atomic<int64_t> used_{0};
};

// The machine's physical memory in bytes (0 if unknown).
uint64_t PhysicalMemoryBytes();
// server.max_memory_bytes when it is 0: 80% of physical memory (0 = unlimited if unknown).
uint64_t DefaultMaxMemoryBytes();

// How a dense block lies in memory: one allocation holding its parameters, then each optimizer
// slot, each array DenseSlotStride(size) floats after the one before. From
// kDensePadSlotsFromFloats values up, kDenseSlotPadFloats unused floats separate the arrays:
// on the development VM, a push of one block of 2^25 values (Adam) ran 2.5x slower with the
// arrays exactly 128 MB apart than with 64 KB between them, and one of 2^24 values 1.4x slower
// (docs/lab/2026-12-03-stream-layout.md). The padding is never written to a checkpoint.
inline constexpr uint64_t kDensePadSlotsFromFloats = uint64_t{1} << 22;
inline constexpr uint64_t kDenseSlotPadFloats = uint64_t{1} << 14;
inline constexpr uint64_t DenseSlotStride(uint64_t block_size) {
  return block_size >= kDensePadSlotsFromFloats ? block_size + kDenseSlotPadFloats : block_size;
}

// Bytes of parameters, optimizer slots (`num_slots` arrays) and the padding between them
// (DenseSlotStride) of `table`'s blocks on `server`. Saturates at UINT64_MAX instead of
// overflowing.
uint64_t DenseBytesOnServer(const common::Partitioner& partitioner, const common::TableInfo& table,
                            uint32_t server, int num_slots);

}  // namespace ps::server

#endif  // PS_SERVER_MEMORY_BUDGET_H_
