// LoadData: turns the job's DataConfig into in-memory training and test Datasets, whatever
// the format (IDX images, LIBSVM text, synthetic CTR).
#ifndef PS_WORKER_DATA_LOAD_H_
#define PS_WORKER_DATA_LOAD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "worker/data/dataset.h"

namespace ps::worker {

struct LoadedData {
  // Never null.
  std::unique_ptr<Dataset> train;
  // Null when the config names no test set (IDX/LIBSVM without test files, or
  // synthetic.num_test == 0).
  std::unique_ptr<Dataset> test;
  // SYNTHETIC_CTR only: the AUC and log-loss of the ground-truth probabilities on the test
  // labels, i.e. what a perfect model would score. 0 for other formats, and when undefined
  // (no test set, or a test set of one class).
  double ground_truth_auc = 0;
  double ground_truth_log_loss = 0;
};

// Loads the data `data` describes:
//   IDX:           train_images + train_labels (required), test_images + test_labels (both
//                  or neither), pixel_scale; labels of the test set must be below the training
//                  set's num_classes (the largest training label + 1).
//   LIBSVM:        train_file (required), test_file (optional); binary labels.
//   SYNTHETIC_CTR: synthetic (its defaults when unset).
// File paths are used as given (relative to the working directory).
// `training` is not read today; it is part of the signature so that options such as a data
// seed can move there without changing callers.
// Errors: INVALID_ARGUMENT naming the field ("data.train_images ...") for an unspecified
// format, a missing required field, a lone test file, a non-positive pixel_scale, bad
// synthetic parameters, or an empty training set; otherwise the reader's error
// (see idx.h, libsvm.h), prefixed with which set failed ("training set: ...").
absl::StatusOr<LoadedData> LoadData(const ps::DataConfig& data, const ps::TrainingConfig& training);

}  // namespace ps::worker

#endif  // PS_WORKER_DATA_LOAD_H_
