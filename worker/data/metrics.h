// Evaluation metrics for binary (CTR) models: exact ROC AUC and log-loss.
#ifndef PS_WORKER_DATA_METRICS_H_
#define PS_WORKER_DATA_METRICS_H_

#include "absl/types/span.h"

namespace ps::worker {

// The area under the ROC curve of `scores` against `labels` (positive when label > 0.5):
// the probability that a random positive scores above a random negative, ties counting
// one half. Exact (the Mann-Whitney U statistic from average ranks), O(n log n).
// Returns NaN when the labels hold only one class (AUC is undefined) or a score is NaN.
// REQUIRES: scores.size() == labels.size() (checked).
double Auc(absl::Span<const float> scores, absl::Span<const float> labels);

// The mean binary cross-entropy -[y log p + (1 - y) log(1 - p)] of predicted probabilities
// `probabilities` against labels in [0, 1]. Each p is clipped to [1e-7, 1 - 1e-7] first, so
// a confident mistake costs about 16.1 rather than infinity. Returns NaN for empty input.
// REQUIRES: probabilities.size() == labels.size() (checked).
double LogLoss(absl::Span<const float> probabilities, absl::Span<const float> labels);

}  // namespace ps::worker

#endif  // PS_WORKER_DATA_METRICS_H_
