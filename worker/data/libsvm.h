// Reader for LIBSVM / SVMlight text files (plain or gzip-compressed):
//
//   <label> [qid:<n>] <index>:<value> <index>:<value> ... [# comment]
//
// Fields are separated by spaces or tabs. Everything from '#' to the end of the line is a
// comment; blank and comment-only lines are skipped; "\r\n" line ends are accepted. SVMlight
// "qid:<n>" fields are skipped. Indices are kept as uint64 feature ids, unchanged (no
// 1-based shift, no sorting, duplicates allowed): the models treat them as sparse keys.
#ifndef PS_WORKER_DATA_LIBSVM_H_
#define PS_WORKER_DATA_LIBSVM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace ps::worker {

struct LibsvmOptions {
  // false (default): binary labels. "+1", "1" (or any number equal to 1, e.g. "1.0") map to
  // 1; "-1", "0" map to 0; anything else is an error. The dataset has num_classes() == 2 and
  // batches carry binary_labels.
  // true: multi-class labels, non-negative integers in [0, num_classes); batches carry
  // class_labels (or binary_labels if there turn out to be exactly 2 classes, as for every
  // sparse Dataset). Data sets labelled 1..K must be shifted to 0..K-1 first.
  bool multiclass = false;
  // Multi-class only: the number of classes (every label must be below it), or 0 (default)
  // to infer it as max(2, largest label + 1). Must be 0 or >= 2; ignored for binary data.
  int num_classes = 0;
  // The most memory the parsed data (ids, values, offsets, labels) and one line of text may
  // take; 0 (default): this machine's physical memory. A file beyond it is RESOURCE_EXHAUSTED
  // as soon as the data grows past it, instead of the OOM killer's: a small gzip file can
  // decompress to any size.
  uint64_t max_memory_bytes = 0;
};

// Loads `path` into a sparse Dataset (a SparseDataset).
// Errors:
//   NOT_FOUND (PERMISSION_DENIED, ...)  the file cannot be opened;
//   DATA_LOSS                           corrupt or truncated gzip stream;
//   RESOURCE_EXHAUSTED                  the data would take more than max_memory_bytes
//       (checked at each growth of its arrays), or one line more than a quarter of it;
//   INVALID_ARGUMENT                    bad options, or a syntax error. Syntax errors read
//       "<path>:<line>:<column>: <problem>" (1-based; the column is that of the offending
//       token or part of it): a bad label, a feature without ':', a non-numeric or
//       out-of-range index, a non-numeric value, a non-finite value (inf, nan, 1e999).
// An empty file (or one with only comments) is valid and gives an empty dataset.
absl::StatusOr<std::unique_ptr<Dataset>> LoadLibsvmDataset(const std::string& path,
                                                           const LibsvmOptions& options);

}  // namespace ps::worker

#endif  // PS_WORKER_DATA_LIBSVM_H_
