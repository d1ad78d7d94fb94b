#include "common/startup/flag_check.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ps::common {
namespace {

absl::Status OutOfRange(absl::string_view name, absl::string_view value,
                        absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, ": expected ", expected));
}

}  // namespace

absl::Status CheckIntFlagRange(absl::string_view name, int64_t value, int64_t min, int64_t max,
                               absl::string_view expected) {
  if (value >= min && value <= max) return absl::OkStatus();
  return OutOfRange(name, absl::StrCat(value), expected);
}

absl::Status CheckDoubleFlagRange(absl::string_view name, double value, double min, double max,
                                  absl::string_view expected,
                                  std::optional<double> also_allowed) {
  // Written so that NaN fails every comparison and so every test.
  if (std::isfinite(value) &&
      ((value >= min && value <= max) || (also_allowed.has_value() && value == *also_allowed))) {
    return absl::OkStatus();
  }
  return OutOfRange(name, absl::StrCat(value), expected);
}

absl::Status AllFlagsInRange(std::initializer_list<absl::Status> checks) {
  std::vector<std::string> errors;
  for (const absl::Status& check : checks) {
    if (!check.ok()) errors.emplace_back(check.message());
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

std::string HostPort(absl::string_view host, int port) {
  const bool bare_ipv6 = absl::StrContains(host, ':') && !absl::StartsWith(host, "[");
  return absl::StrCat(bare_ipv6 ? "[" : "", host, bare_ipv6 ? "]" : "", ":", port);
}

}  // namespace ps::common
