// Shard's memory checks against server.max_memory_bytes, each before anything is allocated:
// what a server's tables will hold (CheckMemoryAtStart), and the new sparse rows of a push,
// all its tables together (CheckRoomForNewRows), made or brought into memory by PrepareRows.
// A table that spills has room for memory_budget_rows rows from the start; a push checks the
// rows it would pin beyond them.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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
  // rows were refused instead. They are counted as the table allocates them (whole chunks
  // per stripe): budget_rows x row bytes, used before 2026-12-07, was 16 to 32 times too
  // little for small budgets (found in review).
  for (const auto& table : partitioner.tables()) {
    if (std::find(spilling.begin(), spilling.end(), table.name) == spilling.end()) continue;
    const int slots = kernels::NumSlots(ToOptimizerParams(table.config->optimizer()).kind);
    const double bytes = SparseTablePart::BytesAtRowBudget(table.dim * (1 + slots) * sizeof(float),
                                                           table.config->memory_budget_rows());
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

absl::Status Shard::CheckRoomForNewRows(absl::Span<const PendingUpdate> updates) {
  if (memory_.limit() == 0) return absl::OkStatus();
  // Nothing is charged before the rows are made (Apply, or Pin when spilling), so the parts
  // of one push, which may name several tables or one table twice, are checked as one: part
  // by part, each against the same use, a push could take the server past its limit for good
  // (before 2026-12-06, found in review). A table that spills counts the rows the push would
  // pin beyond its budget: before 2026-12-07 it was not checked, and one push of a million
  // new keys held them all in memory, far past the limit (found in review).
  struct TableParts {
    SparseTablePart* table = nullptr;
    absl::InlinedVector<absl::Span<const uint64_t>, 2> keys;
  };
  absl::InlinedVector<TableParts, 4> tables;
  uint64_t bound = 0;
  for (const PendingUpdate& u : updates) {
    if (u.table->info().kind != TABLE_KIND_SPARSE) continue;
    auto* sparse = static_cast<SparseTablePart*>(u.table);
    auto it = std::find_if(tables.begin(), tables.end(),
                           [sparse](const TableParts& t) { return t.table == sparse; });
    TableParts* parts = it != tables.end() ? &*it : &tables.emplace_back();
    parts->table = sparse;
    parts->keys.push_back(u.keys);
    bound += sparse->MaxNewRowsBytes(u.keys.size());
  }
  if (tables.empty() || memory_.CheckRoom(bound, "").ok()) return absl::OkStatus();
  uint64_t cost = 0, missing = 0;
  std::string per_table;
  int tables_with_new_rows = 0;
  for (const TableParts& t : tables) {
    uint64_t rows = 0;
    cost += t.table->NewRowsBytes(t.keys, &rows);
    if (rows == 0) continue;
    absl::StrAppend(&per_table, per_table.empty() ? "" : ", ", "table '", t.table->name(),
                    "': ", t.table->NewRowsText(rows));
    missing += rows;
    ++tables_with_new_rows;
  }
  if (missing == 0) return absl::OkStatus();
  return memory_.CheckRoom(
      cost, tables_with_new_rows == 1
                ? per_table
                : absl::StrCat("a push of ", missing, " new rows (", per_table, ")"));
}

absl::Status Shard::PrepareRows(absl::Span<const PendingUpdate> updates,
                                std::vector<const PendingUpdate*>* pinned) {
  // Room for the whole push first: a push refused for it has made and pinned nothing.
  RETURN_IF_ERROR(CheckRoomForNewRows(updates));
  for (const PendingUpdate& u : updates) {
    if (u.table->info().kind != TABLE_KIND_SPARSE) continue;
    auto* sparse = static_cast<SparseTablePart*>(u.table);
    if (!sparse->spills()) continue;
    RETURN_IF_ERROR(sparse->Pin(u.keys));
    pinned->push_back(&u);
  }
  return absl::OkStatus();
}

}  // namespace ps::server
