#include "common/status_matchers.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

using ::testing::HasSubstr;
using ::testing::Matcher;
using ::testing::Not;

template <typename T, typename M>
std::string Explain(const M& matcher, const T& value) {
  testing::StringMatchResultListener listener;
  Matcher<const T&>(matcher).MatchAndExplain(value, &listener);
  return listener.str();
}

TEST(StatusIs, MatchesCodeOfStatus) {
  absl::Status status = absl::NotFoundError("no table 'x'");
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(status, Not(StatusIs(absl::StatusCode::kInvalidArgument)));
  EXPECT_THAT(absl::OkStatus(), StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT(absl::OkStatus(), Not(StatusIs(absl::StatusCode::kNotFound)));
}

TEST(StatusIs, MatchesMessageWithMatcherOrString) {
  absl::Status status = absl::InvalidArgumentError("tables[2].shape: dimension 1 is 0");
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tables[2]")));
  EXPECT_THAT(status,
              StatusIs(absl::StatusCode::kInvalidArgument, "tables[2].shape: dimension 1 is 0"));
  EXPECT_THAT(status, Not(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tables[3]"))));
  // The right message does not rescue a wrong code.
  EXPECT_THAT(status, Not(StatusIs(absl::StatusCode::kNotFound, HasSubstr("tables[2]"))));
}

TEST(StatusIs, AcceptsACodeMatcher) {
  EXPECT_THAT(absl::UnavailableError("down"), StatusIs(Not(absl::StatusCode::kOk)));
  EXPECT_THAT(absl::OkStatus(), Not(StatusIs(Not(absl::StatusCode::kOk))));
}

TEST(StatusIs, WorksOnStatusOr) {
  absl::StatusOr<int> error = absl::FailedPreconditionError("layout mismatch");
  absl::StatusOr<int> value = 3;
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("layout")));
  EXPECT_THAT(value, StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT(value, Not(StatusIs(absl::StatusCode::kFailedPrecondition)));
  // Move-only payloads work too: the matcher only reads the status.
  absl::StatusOr<std::unique_ptr<int>> owned = absl::AbortedError("dup");
  EXPECT_THAT(owned, StatusIs(absl::StatusCode::kAborted));
}

TEST(StatusIs, ExplainsWithTheWholeStatus) {
  std::string explanation = Explain<absl::Status>(StatusIs(absl::StatusCode::kNotFound),
                                                  absl::InvalidArgumentError("bad dim"));
  EXPECT_THAT(explanation, HasSubstr("INVALID_ARGUMENT: bad dim"));
  EXPECT_THAT(explanation, HasSubstr("code is wrong"));

  explanation =
      Explain<absl::Status>(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape")),
                            absl::InvalidArgumentError("bad dim"));
  EXPECT_THAT(explanation, HasSubstr("message is wrong"));
}

TEST(StatusIs, DescribesCodeAndMessage) {
  Matcher<absl::Status> matcher = StatusIs(absl::StatusCode::kNotFound, HasSubstr("table"));
  std::string description = testing::DescribeMatcher<absl::Status>(matcher);
  EXPECT_THAT(description, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(description, HasSubstr("table"));
}

TEST(IsOk, MatchesOkStatusAndStatusOrWithValue) {
  EXPECT_THAT(absl::OkStatus(), IsOk());
  EXPECT_THAT(absl::InternalError("bug"), Not(IsOk()));
  EXPECT_THAT(absl::StatusOr<std::string>("x"), IsOk());
  EXPECT_THAT(absl::StatusOr<std::string>(absl::NotFoundError("x")), Not(IsOk()));
  EXPECT_THAT(Explain<absl::Status>(IsOk(), absl::InternalError("bug")),
              HasSubstr("INTERNAL: bug"));
}

TEST(AssertOkAndAssign, MovesTheValueOut) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<int> value,
                       absl::StatusOr<std::unique_ptr<int>>(std::make_unique<int>(7)));
  ASSERT_NE(value, nullptr);
  EXPECT_EQ(*value, 7);
  EXPECT_OK(absl::OkStatus());
}

}  // namespace
}  // namespace ps::common
