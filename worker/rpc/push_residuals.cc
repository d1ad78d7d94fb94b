#include "worker/rpc/push_residuals.h"

#include <cmath>

#include "common/codec.h"
#include "glog/logging.h"

namespace ps::worker {
namespace {

// Encodes values + *residual, appends the bytes to `out` and replaces *residual with what
// the encoding dropped. `scratch` is reused storage.
void EncodeWithFeedback(absl::Span<const float> values, absl::Span<float> residual,
                        ps::Encoding encoding, std::vector<float>* scratch, std::string* out) {
  const size_t n = values.size();
  scratch->resize(n);
  for (size_t i = 0; i < n; ++i) (*scratch)[i] = values[i] + residual[i];
  const size_t old_size = out->size();
  common::AppendFloats(*scratch, encoding, out);
  // The residual is measured against what the servers will decode, so decode our own bytes
  // rather than re-deriving the rounding here.
  std::vector<float> decoded(n);
  const absl::Status decoded_ok = common::DecodeFloats(absl::string_view(*out).substr(old_size),
                                                       encoding, absl::MakeSpan(decoded));
  CHECK(decoded_ok.ok()) << decoded_ok;  // Our own bytes of the right size.
  for (size_t i = 0; i < n; ++i) {
    const float r = (*scratch)[i] - decoded[i];
    residual[i] = std::isfinite(r) ? r : 0.0f;
  }
}

}  // namespace

void PushResiduals::AppendDense(absl::string_view table, size_t numel, size_t offset,
                                absl::Span<const float> values, ps::Encoding encoding,
                                std::string* out) {
  if (encoding == ps::ENCODING_FLOAT32) {
    common::AppendFloats(values, encoding, out);
    return;
  }
  std::vector<float>& residual = dense_[table];
  if (residual.empty()) residual.assign(numel, 0.0f);
  CHECK_EQ(residual.size(), numel) << "table '" << table << "' changed size";
  CHECK_LE(offset + values.size(), numel);
  EncodeWithFeedback(values, absl::MakeSpan(residual).subspan(offset, values.size()), encoding,
                     &scratch_, out);
}

void PushResiduals::AppendSparseRow(absl::string_view table, uint64_t key,
                                    absl::Span<const float> row, ps::Encoding encoding,
                                    std::string* out) {
  if (encoding == ps::ENCODING_FLOAT32 || max_sparse_rows_ == 0) {
    common::AppendFloats(row, encoding, out);
    return;
  }
  SparseTable& t = sparse_[table];
  auto it = t.rows.find(key);
  if (it != t.rows.end()) {
    t.order.splice(t.order.begin(), t.order, it->second.lru);  // now the most recent
  } else {
    if (t.rows.size() >= max_sparse_rows_) {
      t.rows.erase(t.order.back());
      t.order.pop_back();
    }
    t.order.push_front(key);
    it = t.rows.emplace(key, SparseTable::Row{t.order.begin(), std::vector<float>(row.size())})
             .first;
  }
  CHECK_EQ(it->second.residual.size(), row.size()) << "table '" << table << "' changed width";
  EncodeWithFeedback(row, absl::MakeSpan(it->second.residual), encoding, &scratch_, out);
}

size_t PushResiduals::sparse_rows(absl::string_view table) const {
  auto it = sparse_.find(table);
  return it == sparse_.end() ? 0 : it->second.rows.size();
}

}  // namespace ps::worker
