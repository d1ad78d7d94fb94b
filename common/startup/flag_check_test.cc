#include "common/startup/flag_check.h"

#include <cmath>
#include <limits>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

using ::testing::Eq;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TEST(CheckIntFlagRange, AcceptsBothBoundsAndRefusesJustOutside) {
  EXPECT_THAT(CheckIntFlagRange("port", 0, 0, 65535, "0..65535"), IsOk());
  EXPECT_THAT(CheckIntFlagRange("port", 65535, 0, 65535, "0..65535"), IsOk());
  EXPECT_THAT(CheckIntFlagRange("port", 65536, 0, 65535, "0..65535"),
              StatusIs(kInvalid, Eq("--port=65536: expected 0..65535")));
  EXPECT_THAT(CheckIntFlagRange("port", -1, 0, 65535, "0..65535"),
              StatusIs(kInvalid, Eq("--port=-1: expected 0..65535")));
}

TEST(CheckIntFlagRange, HandlesTheExtremesOfInt64) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(CheckIntFlagRange("n", kMin, kMin, kMax, "any"), IsOk());
  EXPECT_THAT(CheckIntFlagRange("n", kMin, -1, kMax, ">= -1"),
              StatusIs(kInvalid, Eq("--n=-9223372036854775808: expected >= -1")));
}

TEST(CheckDoubleFlagRange, AboveZeroRefusesZeroAndNegatives) {
  EXPECT_THAT(CheckDoubleFlagRange("wait_s", 0.001, kAboveZero, kNoLimit, "seconds > 0"), IsOk());
  EXPECT_THAT(CheckDoubleFlagRange("wait_s", 1e300, kAboveZero, kNoLimit, "seconds > 0"), IsOk());
  EXPECT_THAT(CheckDoubleFlagRange("wait_s", 0, kAboveZero, kNoLimit, "seconds > 0"),
              StatusIs(kInvalid, Eq("--wait_s=0: expected seconds > 0")));
  EXPECT_THAT(CheckDoubleFlagRange("wait_s", -2.5, kAboveZero, kNoLimit, "seconds > 0"),
              StatusIs(kInvalid, Eq("--wait_s=-2.5: expected seconds > 0")));
}

TEST(CheckDoubleFlagRange, NanAndInfinitiesAreAlwaysRefused) {
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THAT(CheckDoubleFlagRange("x", nan, -kNoLimit, kNoLimit, "a number", nan),
              StatusIs(kInvalid, Eq("--x=nan: expected a number")));
  EXPECT_THAT(CheckDoubleFlagRange("x", inf, 0, kNoLimit, "a number", inf),
              StatusIs(kInvalid, Eq("--x=inf: expected a number")));
  EXPECT_THAT(CheckDoubleFlagRange("x", -inf, -kNoLimit, kNoLimit, "a number"),
              StatusIs(kInvalid, Eq("--x=-inf: expected a number")));
}

TEST(CheckDoubleFlagRange, AlsoAllowedIsTheOneValueOutsideTheRange) {
  const auto check = [](double v) {
    return CheckDoubleFlagRange("checkpoint_interval", v, 0, kNoLimit, "seconds >= 0, or -1", -1);
  };
  EXPECT_THAT(check(-1), IsOk());
  EXPECT_THAT(check(0), IsOk());
  EXPECT_THAT(check(-7), StatusIs(kInvalid, Eq("--checkpoint_interval=-7: expected seconds >= "
                                               "0, or -1")));
  EXPECT_THAT(check(-0.5), StatusIs(kInvalid));
}

TEST(AllFlagsInRange, JoinsEveryFailureInOrderAndIgnoresTheRest) {
  EXPECT_THAT(AllFlagsInRange({}), IsOk());
  EXPECT_THAT(AllFlagsInRange({absl::OkStatus(), absl::OkStatus()}), IsOk());
  EXPECT_THAT(AllFlagsInRange({CheckIntFlagRange("a", 5, 0, 1, "0..1"), absl::OkStatus(),
                               CheckIntFlagRange("b", -1, 0, 1, "0 or 1")}),
              StatusIs(kInvalid, Eq("--a=5: expected 0..1; --b=-1: expected 0 or 1")));
}

// An IPv6 host went in bare: "::" and port 7000 made ":::7000", which gRPC cannot listen on.
TEST(HostPort, PutsIpv6LiteralsInBrackets) {
  EXPECT_EQ(HostPort("::", 7000), "[::]:7000");
  EXPECT_EQ(HostPort("fe80::1", 0), "[fe80::1]:0");
  EXPECT_EQ(HostPort("[::1]", 9), "[::1]:9");
  EXPECT_EQ(HostPort("127.0.0.1", 7000), "127.0.0.1:7000");
  EXPECT_EQ(HostPort("node-3", 7000), "node-3:7000");
}

}  // namespace
}  // namespace ps::common
