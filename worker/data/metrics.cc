#include "worker/data/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "glog/logging.h"

namespace ps::worker {

double Auc(absl::Span<const float> scores, absl::Span<const float> labels) {
  CHECK_EQ(scores.size(), labels.size());
  CHECK_LE(scores.size(), std::numeric_limits<uint32_t>::max());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // NaN would break the strict weak ordering std::sort needs.
  for (float s : scores) {
    if (std::isnan(s)) return nan;
  }
  std::vector<uint32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return scores[a] < scores[b]; });
  // Sum of the (1-based, tie-averaged) ranks of the positives.
  double positive_rank_sum = 0;
  uint64_t positives = 0;
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin + 1;
    while (end < order.size() && scores[order[end]] == scores[order[begin]]) ++end;
    const double average_rank = 0.5 * static_cast<double>(begin + 1 + end);
    for (size_t k = begin; k < end; ++k) {
      if (labels[order[k]] > 0.5f) {
        positive_rank_sum += average_rank;
        ++positives;
      }
    }
    begin = end;
  }
  const uint64_t negatives = scores.size() - positives;
  if (positives == 0 || negatives == 0) return nan;
  const double p = static_cast<double>(positives);
  const double u = positive_rank_sum - p * (p + 1) / 2;
  return u / (p * static_cast<double>(negatives));
}

double LogLoss(absl::Span<const float> probabilities, absl::Span<const float> labels) {
  CHECK_EQ(probabilities.size(), labels.size());
  if (probabilities.empty()) return std::numeric_limits<double>::quiet_NaN();
  constexpr double kEpsilon = 1e-7;
  double sum = 0;
  for (size_t i = 0; i < probabilities.size(); ++i) {
    const double p = std::clamp<double>(probabilities[i], kEpsilon, 1 - kEpsilon);
    const double y = labels[i];
    sum -= y * std::log(p) + (1 - y) * std::log1p(-p);
  }
  return sum / static_cast<double>(probabilities.size());
}

}  // namespace ps::worker
