// Splits the --set flag of the binaries into config overrides.
//
// "--set=training.epochs=3,model.mlp.hidden=256,128,cluster.num_workers=2" holds three
// overrides: a comma starts a new override only when the text after it (up to the next comma)
// contains '='; otherwise the comma belongs to a list value.
#ifndef PS_COMMON_CONFIG_OVERRIDES_H_
#define PS_COMMON_CONFIG_OVERRIDES_H_

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace ps::common {

inline std::vector<std::string> SplitOverrides(absl::string_view flag) {
  std::vector<std::string> out;
  if (flag.empty()) return out;
  for (absl::string_view token : absl::StrSplit(flag, ',')) {
    if (token.find('=') == absl::string_view::npos && !out.empty()) {
      out.back().append(",");
      out.back().append(token.data(), token.size());
    } else {
      out.emplace_back(token);
    }
  }
  return out;
}

}  // namespace ps::common

#endif  // PS_COMMON_CONFIG_OVERRIDES_H_
