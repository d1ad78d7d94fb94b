// The optimizer of a table's config as the kernels' OptimizerParams: used by the servers, and
// by workers that apply updates themselves (local SGD).
//
// A template over the config message, so that kernels/ stays free of proto/ (the layering
// check in tools/check_layering.py enforces it): server/ and worker/ instantiate it with
// ps::OptimizerConfig, whose enum values and accessors it names.
#ifndef PS_KERNELS_OPTIMIZER_CONFIG_H_
#define PS_KERNELS_OPTIMIZER_CONFIG_H_

#include "kernels/optimizer.h"

namespace ps::kernels {

// REQUIRES: Config has kind() returning Config::SGD/MOMENTUM/ADAGRAD/ADAM/FTRL and a float
// accessor for every hyper-parameter of OptimizerParams (ps::OptimizerConfig does).
template <typename Config>
OptimizerParams ToOptimizerParams(const Config& c) {
  OptimizerParams p;
  switch (c.kind()) {
    case Config::SGD:
      p.kind = OptimizerKind::kSgd;
      break;
    case Config::MOMENTUM:
      p.kind = OptimizerKind::kMomentum;
      break;
    case Config::ADAGRAD:
      p.kind = OptimizerKind::kAdagrad;
      break;
    case Config::ADAM:
      p.kind = OptimizerKind::kAdam;
      break;
    case Config::FTRL:
      p.kind = OptimizerKind::kFtrl;
      break;
    default:
      break;  // proto3 open enums: an unknown value keeps plain SGD (configs are validated)
  }
  p.learning_rate = c.learning_rate();
  p.momentum = c.momentum();
  p.nesterov = c.nesterov();
  p.beta1 = c.beta1();
  p.beta2 = c.beta2();
  p.epsilon = c.epsilon();
  p.initial_accumulator = c.initial_accumulator();
  p.l1 = c.l1();
  p.l2 = c.l2();
  p.ftrl_beta = c.ftrl_beta();
  p.weight_decay = c.weight_decay();
  p.clip_value = c.clip_value();
  p.clip_norm = c.clip_norm();
  return p;
}

}  // namespace ps::kernels

#endif  // PS_KERNELS_OPTIMIZER_CONFIG_H_
