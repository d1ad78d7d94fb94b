// The optimizer of a table's config (proto OptimizerConfig) as the kernels' OptimizerParams:
// used by the servers, and by workers that apply updates themselves (local SGD).
#ifndef PS_KERNELS_OPTIMIZER_CONFIG_H_
#define PS_KERNELS_OPTIMIZER_CONFIG_H_

#include "kernels/optimizer.h"
#include "proto/config.pb.h"

namespace ps::kernels {

OptimizerParams ToOptimizerParams(const OptimizerConfig& config);

}  // namespace ps::kernels

#endif  // PS_KERNELS_OPTIMIZER_CONFIG_H_
