#include "common/rpc/handoff_chooser.h"

#include <algorithm>

namespace ps::common {

namespace {

HandoffChooser::Options Sanitized(HandoffChooser::Options o) {
  o.explore_every = std::max<uint32_t>(o.explore_every, 2);
  if (!(o.weight > 0) || o.weight > 1) o.weight = HandoffChooser::Options{}.weight;
  if (!(o.margin >= 0) || o.margin >= 1) o.margin = HandoffChooser::Options{}.margin;
  return o;
}

}  // namespace

HandoffChooser::HandoffChooser(Options options) : options_(Sanitized(options)) {}

bool HandoffChooser::Stream() {
  absl::MutexLock lock(&mu_);
  const uint64_t call = calls_++;
  if (estimate_[1] < 0) return true;
  if (estimate_[0] < 0) return false;
  const double in_use = estimate_[streaming_ ? 1 : 0], other = estimate_[streaming_ ? 0 : 1];
  if (other < in_use * (1 - options_.margin)) streaming_ = !streaming_;
  return call % options_.explore_every == options_.explore_every - 1 ? !streaming_ : streaming_;
}

void HandoffChooser::Record(bool stream, double cost) {
  if (!(cost > 0)) return;
  absl::MutexLock lock(&mu_);
  double& e = estimate_[stream ? 1 : 0];
  if (e < 0) {
    e = cost;
    return;
  }
  cost = std::clamp(cost, e / 4, e * 4);
  e += options_.weight * (cost - e);
}

double HandoffChooser::estimate(bool stream) const {
  absl::MutexLock lock(&mu_);
  return estimate_[stream ? 1 : 0];
}

}  // namespace ps::common
