// TablePart: what dense and sparse tables share (the update counter).
#include "server/table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/initializer.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/table_internal.h"

namespace ps::server {


// ---- TablePart --------------------------------------------------------------------------

TablePart::TablePart(const common::TableInfo& info, const kernels::OptimizerParams& optimizer)
    : info_(info), optimizer_(optimizer), num_slots_(kernels::NumSlots(optimizer.kind)) {
  CHECK_LE(num_slots_, 4);
}

uint64_t TablePart::updates_applied() const {
  absl::MutexLock lock(&counter_mu_);
  return updates_applied_;
}

void TablePart::set_updates_applied(uint64_t n) {
  absl::MutexLock lock(&counter_mu_);
  updates_applied_ = n;
}

void TablePart::CountUpdate() {
  absl::MutexLock lock(&counter_mu_);
  ++updates_applied_;
}

}  // namespace ps::server
