// Shard::CheckMemoryAtStart: what a server's tables will hold in memory, against
// server.max_memory_bytes, before anything is allocated.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/optimizer_config.h"
#include "server/memory_budget.h"
#include "server/shard.h"
#include "server/table.h"

namespace ps::server {

absl::Status Shard::CheckMemoryAtStart(const common::Partitioner& partitioner,
                                       const ShardOptions& options,
                                       const std::vector<std::string>& spilling) {
  if (options.max_memory_bytes == 0) return absl::OkStatus();
  uint64_t total = 0;
  for (const auto& table : partitioner.tables()) {
    if (table.kind != TABLE_KIND_DENSE) continue;
    const int slots = kernels::NumSlots(ToOptimizerParams(table.config->optimizer()).kind);
    const uint64_t bytes = DenseBytesOnServer(partitioner, table, options.server_index, slots);
    total = bytes > UINT64_MAX - total ? UINT64_MAX : total + bytes;
    if (total <= options.max_memory_bytes) continue;
    return absl::ResourceExhaustedError(
        absl::StrCat("table '", table.name, "' needs ", bytes, " bytes on server ",
                     options.server_index, " (", table.numel, " values in all, parameters and ",
                     slots, " optimizer slots); with the tables before it that is ", total,
                     " bytes, over server.max_memory_bytes ", options.max_memory_bytes,
                     ": add servers, shrink the table or raise the limit"));
  }
  // A table that spills keeps up to memory_budget_rows rows in memory whatever the byte
  // limit says (it evicts by rows): those rows must fit beside the dense tables. Before
  // 2026-12-05 (found in review) such a table grew past the limit, and the other tables' new
  // rows were refused instead.
  for (const auto& table : partitioner.tables()) {
    if (std::find(spilling.begin(), spilling.end(), table.name) == spilling.end()) continue;
    const int slots = kernels::NumSlots(ToOptimizerParams(table.config->optimizer()).kind);
    const double row = static_cast<double>(table.dim) * (1 + slots) * sizeof(float) +
                       SparseTablePart::kBookkeepingBytesPerRow;
    const double bytes = static_cast<double>(table.config->memory_budget_rows()) * row;
    const double with = static_cast<double>(total) + bytes;
    if (with <= static_cast<double>(options.max_memory_bytes)) {
      total = static_cast<uint64_t>(with);
      continue;
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "table '", table.name, "': memory_budget_rows ", table.config->memory_budget_rows(),
        " rows of dim ", table.dim, " with ", slots, " optimizer slots take about ",
        static_cast<uint64_t>(bytes), " bytes on server ", options.server_index,
        "; with the tables before it that is about ", static_cast<uint64_t>(with),
        " bytes, over server.max_memory_bytes ", options.max_memory_bytes,
        ": lower memory_budget_rows or raise the limit"));
  }
  return absl::OkStatus();
}

}  // namespace ps::server
