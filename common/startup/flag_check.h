// Range checks of a main's flags, run before anything starts. A value out of range is refused
// with INVALID_ARGUMENT, never wrapped (a port of 99999 would listen on 99999 mod 65536) or
// taken as "unset", and one start names every bad flag at once:
//
//   RETURN_IF_ERROR(AllFlagsInRange({
//       CheckIntFlagRange("port", port, 0, 65535, "0..65535"),
//       CheckDoubleFlagRange("wait_s", wait_s, kAboveZero, kNoLimit, "seconds > 0"),
//   }));
//   // INVALID_ARGUMENT "--port=99999: expected 0..65535; --wait_s=-1: expected seconds > 0"
//
// Each check says what is expected in words of the flag's meaning ("0 (server.num_threads) or
// 1..4096"), which is why the text is the caller's and not derived from the bounds.
// Thread-safe: pure functions.
#ifndef PS_COMMON_STARTUP_FLAG_CHECK_H_
#define PS_COMMON_STARTUP_FLAG_CHECK_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps::common {

// Bounds for CheckDoubleFlagRange: the smallest double above zero (for "> 0") and no upper
// limit (infinities are refused anyway).
inline constexpr double kAboveZero = std::numeric_limits<double>::denorm_min();
inline constexpr double kNoLimit = std::numeric_limits<double>::max();

// OK if min <= value <= max. Else INVALID_ARGUMENT "--<name>=<value>: expected <expected>".
[[nodiscard]] absl::Status CheckIntFlagRange(absl::string_view name, int64_t value, int64_t min,
                                             int64_t max, absl::string_view expected);

// OK if `value` is finite and min <= value <= max, or equals `also_allowed` (a flag's "take
// the config's" marker, e.g. -1, outside the range). Else INVALID_ARGUMENT as above; NaN and
// the infinities are always refused.
[[nodiscard]] absl::Status CheckDoubleFlagRange(absl::string_view name, double value,
                                                double min, double max,
                                                absl::string_view expected,
                                                std::optional<double> also_allowed = {});

// OK if every check is. Else INVALID_ARGUMENT with the failed checks' messages, in order,
// joined by "; ".
[[nodiscard]] absl::Status AllFlagsInRange(std::initializer_list<absl::Status> checks);

// "host:port" as gRPC reads an address: an IPv6 literal host ("::", "fe80::1") in brackets,
// or gRPC would take its last part for the port. A host already in brackets is kept.
std::string HostPort(absl::string_view host, int port);

}  // namespace ps::common

#endif  // PS_COMMON_STARTUP_FLAG_CHECK_H_
