// PushResiduals: error feedback for pushes in a 16-bit wire encoding (fp16, bf16).
//
// Rounding a gradient to 16 bits drops part of every value. The drop is deterministic, so a
// gradient that repeats loses the same part every step and the servers' sum drifts from the
// exact sum by a little more each push. Error feedback keeps what was dropped, the residual
// r = (g + r_old) - decoded(encoded(g + r_old)), and adds it to the next push of the same
// dense block or sparse row. The sum of what the servers decoded is then the exact sum less
// the current residual, which is at most half a unit in the last place of one value: the
// error stays bounded however many steps are pushed.
//
// Memory: a dense table's residual is one float per element (allocated on its first 16-bit
// push). A sparse table keeps residuals for at most `max_sparse_rows` rows, the most
// recently pushed ones (LRU); an evicted row's residual is dropped, which costs that row at
// most half an ulp per value once.
//
// A non-finite sum (an inf or NaN gradient, or an fp16 overflow) sends what it sends and
// resets that value's residual to 0, so one bad step cannot poison later pushes.
//
// Thread-compatible: callers synchronize.
#ifndef PS_WORKER_RPC_PUSH_RESIDUALS_H_
#define PS_WORKER_RPC_PUSH_RESIDUALS_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/types.pb.h"

namespace ps::worker {

class PushResiduals {
 public:
  // Default cap of sparse rows with a residual, per table.
  static constexpr size_t kDefaultMaxSparseRows = size_t{1} << 18;

  // `max_sparse_rows`: the most sparse rows per table that keep a residual (0 = none: sparse
  // rows are pushed without feedback).
  explicit PushResiduals(size_t max_sparse_rows = kDefaultMaxSparseRows)
      : max_sparse_rows_(max_sparse_rows) {}

  // Appends `values` (elements [offset, offset + values.size()) of the dense table `table`
  // of `numel` elements) plus their residual, encoded as `encoding`, to `*out`, and stores
  // the new residual. FLOAT32 is appended as is, with no state.
  // REQUIRES: offset + values.size() <= numel; `numel` is the same for every call of a table;
  // common::IsKnownEncoding(encoding).
  void AppendDense(absl::string_view table, size_t numel, size_t offset,
                   absl::Span<const float> values, ps::Encoding encoding, std::string* out);

  // As AppendDense for one row of a sparse table. Every row of a table has the same width.
  void AppendSparseRow(absl::string_view table, uint64_t key, absl::Span<const float> row,
                       ps::Encoding encoding, std::string* out);

  // Rows of `table` that hold a residual now (for tests and metrics).
  size_t sparse_rows(absl::string_view table) const;

 private:
  struct SparseTable {
    struct Row {
      std::list<uint64_t>::iterator lru;  // position in `order`
      std::vector<float> residual;
    };
    std::list<uint64_t> order;  // most recently pushed first
    absl::flat_hash_map<uint64_t, Row> rows;
  };

  const size_t max_sparse_rows_;
  absl::flat_hash_map<std::string, std::vector<float>> dense_;
  absl::flat_hash_map<std::string, SparseTable> sparse_;
  std::vector<float> scratch_;  // values + residual, then the decoded values
};

}  // namespace ps::worker

#endif  // PS_WORKER_RPC_PUSH_RESIDUALS_H_
