#include "common/rpc/handoff_chooser.h"

#include <algorithm>

namespace ps::common {

namespace {

HandoffChooser::Options Sanitized(HandoffChooser::Options o) {
  o.explore_every = std::max<uint32_t>(o.explore_every, 2);
  o.max_explore_every = std::max(o.max_explore_every, o.explore_every);
  if (o.window < 1 || o.window > HandoffChooser::kMaxWindow) {
    o.window = HandoffChooser::Options{}.window;
  }
  if (!(o.margin >= 0) || o.margin >= 1) o.margin = HandoffChooser::Options{}.margin;
  o.weigh_every = std::max<uint32_t>(o.weigh_every, 1);
  return o;
}

}  // namespace

HandoffChooser::HandoffChooser(Options options)
    : options_(Sanitized(options)), gap_(options_.explore_every) {}

bool HandoffChooser::Stream(bool* weigh) {
  absl::MutexLock lock(&mu_);
  *weigh = true;
  if (costs_[1].median < 0) return true;
  if (costs_[0].median < 0) return false;
  const double in_use = costs_[streaming_ ? 1 : 0].median;
  const double other = costs_[streaming_ ? 0 : 1].median;
  if (other < in_use * (1 - options_.margin)) {
    streaming_ = !streaming_;
    gap_ = options_.explore_every;
  }
  if (++since_try_ < gap_) {
    *weigh = costs_[streaming_ ? 1 : 0].count < options_.window ||
             ++since_weighed_ >= options_.weigh_every;
    if (*weigh) since_weighed_ = 0;
    return streaming_;
  }
  since_try_ = 0;
  return !streaming_;
}

void HandoffChooser::Record(bool stream, double cost) {
  if (!(cost > 0)) return;
  absl::MutexLock lock(&mu_);
  Costs& c = costs_[stream ? 1 : 0];
  c.last[c.next] = cost;
  c.next = (c.next + 1) % options_.window;
  c.count = std::min(c.count + 1, options_.window);
  double sorted[kMaxWindow];
  std::copy(c.last, c.last + c.count, sorted);
  std::nth_element(sorted, sorted + c.count / 2, sorted + c.count);
  c.median = sorted[c.count / 2];  // (the upper of the two middle ones of an even count)
  if (stream != streaming_ && costs_[streaming_ ? 1 : 0].median > 0) {
    // A try of the other way that cost far more again: tried half as often. One that did not
    // (a change of placement, or noise): as often as at first, until its median tells.
    gap_ = cost > costs_[streaming_ ? 1 : 0].median * (1 + options_.margin)
               ? std::min<uint64_t>(2 * gap_, options_.max_explore_every)
               : options_.explore_every;
  }
}

double HandoffChooser::CallCost(int64_t copy_cpu_ns, uint64_t served_cpu_ns, int64_t call_ns,
                                uint64_t bytes) {
  const double ns = served_cpu_ns == 0
                        ? static_cast<double>(call_ns)
                        : static_cast<double>(std::max<int64_t>(copy_cpu_ns, 0)) +
                              static_cast<double>(std::min(served_cpu_ns, kMaxServedNs));
  return ns / static_cast<double>(std::max<uint64_t>(bytes, 1));
}

double HandoffChooser::estimate(bool stream) const {
  absl::MutexLock lock(&mu_);
  return costs_[stream ? 1 : 0].median;
}

}  // namespace ps::common
