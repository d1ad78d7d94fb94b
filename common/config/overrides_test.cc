#include "common/config/overrides.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(SplitOverrides, CommasInsideListValuesStayWithTheirOverride) {
  EXPECT_THAT(SplitOverrides("training.epochs=3,model.mlp.hidden=256,128,cluster.num_workers=2"),
              ElementsAre("training.epochs=3", "model.mlp.hidden=256,128", "cluster.num_workers=2"));
  EXPECT_THAT(SplitOverrides("cluster.servers=a:1,b:2"), ElementsAre("cluster.servers=a:1,b:2"));
}

TEST(SplitOverrides, EmptyFlagHasNoOverrides) { EXPECT_THAT(SplitOverrides(""), IsEmpty()); }

TEST(SplitOverrides, LeadingTokenWithoutEqualsIsKeptForTheParserToReject) {
  EXPECT_THAT(SplitOverrides("oops,a=1"), ElementsAre("oops", "a=1"));
}

}  // namespace
}  // namespace ps::common
