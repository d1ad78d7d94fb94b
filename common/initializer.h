// Deterministic table initialization.
//
// Every initial value is a pure function of (initializer config, table name, position):
// element i of a dense table, or element j of the row of key k of a sparse table. So a value
// is the same whichever server creates it, however a table is cut into blocks, in
// centralized and distributed mode, and after a restart.
//
// Generator (counter-based, no state): the stream of an element is
//   base = HashCombine(HashCombine(Mix64(seed), Fingerprint64(table_name)), position)
//   draw(c) = HashCombine(base, c)            for counters c = 0, 1, 2, ...
// with position = the flat element index (dense) or HashCombine(key, j) (sparse). A uniform
// in [0, 1) takes the 24 high bits of one draw; a normal is Box-Muller over draws (c, c+1);
// a truncated normal redraws with the next pair of counters until within 2 stddev. Like
// common/hash.h, this scheme is part of the checkpoint contract: changing it changes every
// initial value (a restarted server would initialize sparse rows differently from those
// created before), so do not change it. Values are computed in double precision with libm;
// processes of the same build on the same platform agree bit for bit.
//
// All functions are thread-safe (pure).
#ifndef PS_COMMON_INITIALIZER_H_
#define PS_COMMON_INITIALIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"

namespace ps::common {

// Fan-in and fan-out of a table for GLOROT_UNIFORM. Dense shape [a, b]: (a, b); [n]:
// (n, n); more dimensions: (product of all but the last, last). Sparse or shapeless: (0, 0).
struct Fans {
  uint64_t in = 0;
  uint64_t out = 0;
};
Fans ComputeFans(const ps::TableConfig& table);

// Checks `init` for `table` (its kind and shape). Errors: INVALID_ARGUMENT whose message
// starts with the offending field relative to the initializer, e.g. "stddev: must be > 0,
// got -1", for: non-finite value/mean/low/high; low >= high (UNIFORM); stddev <= 0 or
// non-finite (NORMAL, TRUNCATED_NORMAL); GLOROT_UNIFORM on anything but a dense 2-D table;
// an unknown kind.
[[nodiscard]] absl::Status ValidateInitializer(const ps::InitializerConfig& init,
                                               const ps::TableConfig& table);

// Writes the initial values of dense elements [first_index, first_index + out.size()) of
// `table_name` into `out`. `fan_in`/`fan_out` are used by GLOROT_UNIFORM only
// (see ComputeFans). REQUIRES: ValidateInitializer passed for this table.
void InitializeValues(const ps::InitializerConfig& init, absl::string_view table_name,
                      uint64_t fan_in, uint64_t fan_out, uint64_t first_index,
                      absl::Span<float> out);

// Writes the initial row of `key` of sparse table `table_name` into `row` (its dim values).
// GLOROT_UNIFORM is not valid for sparse tables (ValidateInitializer) and gives zeros.
void InitializeSparseRow(const ps::InitializerConfig& init, absl::string_view table_name,
                         uint64_t key, absl::Span<float> row);

}  // namespace ps::common

#endif  // PS_COMMON_INITIALIZER_H_
