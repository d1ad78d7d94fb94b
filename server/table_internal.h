// Helpers shared by the files of the table library (table.cc, dense_table.cc,
// sparse_table.cc, sparse_eviction.cc, sparse_snapshot.cc): record layouts, restore checks
// and the one update step. Not an API: only those files include it.
#ifndef PS_SERVER_TABLE_INTERNAL_H_
#define PS_SERVER_TABLE_INTERNAL_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/types/span.h"
#include "kernels/optimizer.h"
#include "server/table.h"

namespace ps::server::internal {

// Record value layouts (little-endian, host order on the supported x86-64/arm64 hosts):
//   dense block: [int64 step][float data[block_size * (1 + slots)]]
//   sparse rows: repeated [uint64 key][int64 step][float row[dim * (1 + slots)]]
inline void AppendRaw(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}

template <typename T>
T LoadRaw(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A restored step (updates applied to a block or row) must be one that updates can continue
// from: the optimizers need step >= 1 after the increment, and 2^62 updates would take over a
// century at 10^9 a second, so anything larger is corrupt and stays far from overflowing ++step.
inline bool ValidStep(int64_t step) { return step >= 0 && step <= (int64_t{1} << 62); }

// One update of `n` parameters at `data`, their slot i at data + stride * (i + 1) (stride 0:
// n, the slots right after the parameters and each other).
inline void ApplyTo(const kernels::OptimizerParams& opt, int num_slots, int64_t step, float* data,
                    size_t n, absl::Span<const float> values, const UpdateOptions& options,
                    size_t stride = 0) {
  if (stride == 0) stride = n;
  absl::Span<float> params(data, n);
  if (options.kind == UpdateKind::kDelta) {
    kernels::ApplyDelta(options.delta_scale, params, values);
    return;
  }
  float* slots[4];
  for (int i = 0; i < num_slots; ++i) slots[i] = data + stride * (i + 1);
  kernels::ApplyOptimizer(opt, step, params, values,
                          absl::Span<float* const>(slots, num_slots));
}

// ApplyTo for the values of `piece` only: data holds a block's parameters, its slot s at
// data + stride * (s + 1).
inline void ApplyPieceTo(const kernels::OptimizerParams& opt, int num_slots, int64_t step,
                         float* data, size_t stride, const BlockPiece& piece,
                         const UpdateOptions& options) {
  absl::Span<float> params(data + piece.offset, static_cast<size_t>(piece.values.n));
  if (options.kind == UpdateKind::kDelta) {
    kernels::ApplyDelta(options.delta_scale, params, piece.values);
    return;
  }
  float* slots[4];
  for (int i = 0; i < num_slots; ++i) slots[i] = data + stride * (i + 1) + piece.offset;
  kernels::ApplyOptimizer(opt, step, params, piece.values,
                          absl::Span<float* const>(slots, num_slots));
}

// ---- Sparse tables.
//
// Snapshot record keys of a sparse table (8 bytes; RestoreRecord reads only the values):
//   [0][stripe][record number, 6 bytes]   rows in memory at the cut and rows copied aside
//   [1][0][record number, 6 bytes]        rows that were in the spill table at the cut
// A row in the spill table is a record entry without its key: [int64 step][float row].

// Flags of a row in memory (spilling tables): a copy of it is in the spill table (kOnDisk), and
// it changed since it was last written there or created (kDirty).
constexpr uint8_t kOnDisk = 1;
constexpr uint8_t kDirty = 2;

// Rows sampled to pick an eviction victim, and the LFU aging period in multiples of a stripe's
// budget (uses are halved that often): bench/eviction_sim measured these on Zipf keys.
constexpr int kVictimSamples = 16;
constexpr uint64_t kAgingPeriod = 20;

inline std::string SparseRecordKey(uint8_t kind, uint8_t group, uint64_t r) {
  const char key[8] = {static_cast<char>(kind),   static_cast<char>(group),
                       static_cast<char>(r >> 40), static_cast<char>(r >> 32),
                       static_cast<char>(r >> 24), static_cast<char>(r >> 16),
                       static_cast<char>(r >> 8),  static_cast<char>(r)};
  return std::string(key, 8);
}

}  // namespace ps::server::internal

#endif  // PS_SERVER_TABLE_INTERNAL_H_
