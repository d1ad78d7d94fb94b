#include "kernels/optimizer_config.h"

namespace ps::kernels {

OptimizerParams ToOptimizerParams(const OptimizerConfig& c) {
  OptimizerParams p;
  switch (c.kind()) {
    case OptimizerConfig::SGD:
      p.kind = OptimizerKind::kSgd;
      break;
    case OptimizerConfig::MOMENTUM:
      p.kind = OptimizerKind::kMomentum;
      break;
    case OptimizerConfig::ADAGRAD:
      p.kind = OptimizerKind::kAdagrad;
      break;
    case OptimizerConfig::ADAM:
      p.kind = OptimizerKind::kAdam;
      break;
    case OptimizerConfig::FTRL:
      p.kind = OptimizerKind::kFtrl;
      break;
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
