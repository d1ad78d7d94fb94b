#include "worker/models/model_factory.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "proto/config.pb.h"
#include "worker/models/ctr_model.h"
#include "worker/models/mlp_model.h"
#include "worker/models/model.h"

namespace ps::worker {

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ps::JobConfig& config,
                                                   kernels::Backend* backend, int64_t max_batch) {
  switch (config.model().model_case()) {
    case ps::ModelConfig::kMlp: {
      ASSIGN_OR_RETURN(std::unique_ptr<MlpModel> model,
                       MlpModel::Create(config.model().mlp(), backend, max_batch), "model.mlp");
      return std::unique_ptr<Model>(std::move(model));
    }
    case ps::ModelConfig::kCtr: {
      ASSIGN_OR_RETURN(std::unique_ptr<CtrModel> model,
                       CtrModel::Create(config.model().ctr(), backend, max_batch), "model.ctr");
      return std::unique_ptr<Model>(std::move(model));
    }
    case ps::ModelConfig::MODEL_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("model: no model is set (want model.mlp or model.ctr)");
}

}  // namespace ps::worker
