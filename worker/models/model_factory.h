// CreateModel: the Model a JobConfig's model section describes.
#ifndef PS_WORKER_MODELS_MODEL_FACTORY_H_
#define PS_WORKER_MODELS_MODEL_FACTORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "proto/config.pb.h"
#include "worker/models/model.h"

namespace ps::worker {

// The MlpModel or CtrModel of config.model(), computing on `backend` (not owned; must
// outlive the model) with batches of at most `max_batch` examples. REQUIRES: `config` is
// prepared (common::LoadAndPrepareJobConfig or ExpandModelTables + ValidateJobConfig), so
// that its tables are the ones the model pulls.
// Errors: INVALID_ARGUMENT when no model is set, and those of MlpModel::Create and
// CtrModel::Create (prefixed "model.mlp" / "model.ctr").
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ps::JobConfig& config,
                                                   kernels::Backend* backend, int64_t max_batch);

}  // namespace ps::worker

#endif  // PS_WORKER_MODELS_MODEL_FACTORY_H_
