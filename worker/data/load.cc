#include "worker/data/load.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "worker/data/idx.h"
#include "worker/data/libsvm.h"
#include "worker/data/synthetic_ctr.h"

namespace ps::worker {
namespace {

absl::Status Required(const std::string& value, absl::string_view field, absl::string_view format) {
  if (!value.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("data.", field, " is required for format ", format));
}

// A test set is optional, but half of one is a mistake.
absl::Status BothOrNeither(const std::string& a, absl::string_view a_field, const std::string& b,
                           absl::string_view b_field) {
  if (a.empty() == b.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      a.empty() ? absl::StrCat("data.", a_field, " is required with data.", b_field)
                : absl::StrCat("data.", b_field, " is required with data.", a_field));
}

// `set` names the set ("training", "test") of file `path` in config field data.<field>. An
// empty test set is refused too: its evaluation would report NaN or 0 as the model's quality.
absl::Status NotEmpty(const Dataset& data, absl::string_view set, absl::string_view field,
                      const std::string& path) {
  if (data.size() > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("data.", field, ": the ", set, " set ", path, " has no examples"));
}

absl::StatusOr<LoadedData> LoadIdx(const ps::DataConfig& data) {
  RETURN_IF_ERROR(Required(data.train_images(), "train_images", "IDX"));
  RETURN_IF_ERROR(Required(data.train_labels(), "train_labels", "IDX"));
  RETURN_IF_ERROR(
      BothOrNeither(data.test_images(), "test_images", data.test_labels(), "test_labels"));
  if (!std::isfinite(data.pixel_scale()) || data.pixel_scale() <= 0 ||
      !std::isfinite(255.0f / data.pixel_scale())) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.pixel_scale must be finite and > 0, with 255 / pixel_scale finite; got ",
                     data.pixel_scale()));
  }
  LoadedData loaded;
  ASSIGN_OR_RETURN(loaded.train,
                   LoadIdxDataset(data.train_images(), data.train_labels(), data.pixel_scale()),
                   "training set");
  RETURN_IF_ERROR(NotEmpty(*loaded.train, "training", "train_images", data.train_images()));
  if (!data.test_images().empty()) {
    // The training set fixes the classes; a test label beyond them is an error.
    ASSIGN_OR_RETURN(loaded.test,
                     LoadIdxDataset(data.test_images(), data.test_labels(), data.pixel_scale(),
                                    loaded.train->num_classes()),
                     "test set");
    RETURN_IF_ERROR(NotEmpty(*loaded.test, "test", "test_images", data.test_images()));
    if (loaded.test->feature_dim() != loaded.train->feature_dim()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.test_images: ", data.test_images(), " has ", loaded.test->feature_dim(),
          " features per example, but the training set has ", loaded.train->feature_dim()));
    }
  }
  return loaded;
}

absl::StatusOr<LoadedData> LoadLibsvm(const ps::DataConfig& data) {
  RETURN_IF_ERROR(Required(data.train_file(), "train_file", "LIBSVM"));
  const LibsvmOptions options;  // Binary labels: the sparse models are CTR models.
  LoadedData loaded;
  ASSIGN_OR_RETURN(loaded.train, LoadLibsvmDataset(data.train_file(), options), "training set");
  RETURN_IF_ERROR(NotEmpty(*loaded.train, "training", "train_file", data.train_file()));
  if (!data.test_file().empty()) {
    ASSIGN_OR_RETURN(loaded.test, LoadLibsvmDataset(data.test_file(), options), "test set");
    RETURN_IF_ERROR(NotEmpty(*loaded.test, "test", "test_file", data.test_file()));
  }
  return loaded;
}

absl::StatusOr<LoadedData> LoadSynthetic(const ps::DataConfig& data) {
  if (data.synthetic().num_train() == 0) {
    return absl::InvalidArgumentError("data.synthetic.num_train must be > 0");
  }
  ASSIGN_OR_RETURN(SyntheticCtrData generated, GenerateSyntheticCtr(data.synthetic()),
                   "data.synthetic");
  LoadedData loaded;
  loaded.train = std::move(generated.train);
  if (generated.test->size() > 0) loaded.test = std::move(generated.test);
  // NaN (undefined) becomes 0, which callers read as "none".
  if (std::isfinite(generated.ground_truth_auc)) {
    loaded.ground_truth_auc = generated.ground_truth_auc;
    loaded.ground_truth_log_loss = generated.ground_truth_log_loss;
  }
  return loaded;
}

}  // namespace

absl::StatusOr<LoadedData> LoadData(const ps::DataConfig& data,
                                    const ps::TrainingConfig& /*training*/) {
  switch (data.format()) {
    case ps::DataConfig::IDX:
      return LoadIdx(data);
    case ps::DataConfig::LIBSVM:
      return LoadLibsvm(data);
    case ps::DataConfig::SYNTHETIC_CTR:
      return LoadSynthetic(data);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("data.format is required: IDX, LIBSVM or SYNTHETIC_CTR (got ",
                       ps::DataConfig::Format_Name(data.format()), ")"));
  }
}

}  // namespace ps::worker
