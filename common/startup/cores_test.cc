#include "common/startup/cores.h"

#include <sched.h>

#include "gtest/gtest.h"

namespace ps::common {
namespace {

TEST(CoresUnderQuota, RoundsTheQuotaUpAndCapsItByTheCpus) {
  EXPECT_EQ(CoresUnderQuota("200000 100000", 64), 2u);
  EXPECT_EQ(CoresUnderQuota("150000 100000\n", 64), 2u);  // 1.5 cores: 2 threads
  EXPECT_EQ(CoresUnderQuota("50000 100000", 64), 1u);
  EXPECT_EQ(CoresUnderQuota("800000 100000", 4), 4u);      // the affinity mask is smaller
}

TEST(CoresUnderQuota, NoQuotaOrAnUnreadableLineLeavesTheCpus) {
  EXPECT_EQ(CoresUnderQuota("max 100000", 8), 8u);
  EXPECT_EQ(CoresUnderQuota("", 8), 8u);
  EXPECT_EQ(CoresUnderQuota("lots", 8), 8u);
  EXPECT_EQ(CoresUnderQuota("100000 0", 8), 8u);
  EXPECT_EQ(CoresUnderQuota("-5 100000", 8), 8u);
  EXPECT_EQ(CoresUnderQuota("max 100000", 0), 1u);  // at least one
}

TEST(UsableCores, IsAtMostTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const unsigned cores = UsableCores();
  EXPECT_GE(cores, 1u);
  EXPECT_LE(cores, static_cast<unsigned>(CPU_COUNT(&set)));
}

}  // namespace
}  // namespace ps::common
