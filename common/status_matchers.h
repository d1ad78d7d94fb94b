// gMock matchers for absl::Status and absl::StatusOr<T> (the pinned Abseil, 20220623, has
// none of its own). Test-only.
//
//   EXPECT_THAT(store.Pull(batch, {}), StatusIs(absl::StatusCode::kNotFound));
//   EXPECT_THAT(LoadJobConfig(path, {}),
//               StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job.textproto:3:7")));
//   EXPECT_THAT(Parse(text), IsOk());
//   EXPECT_OK(DoThing());
//   ASSERT_OK_AND_ASSIGN(JobConfig config, ParseJobConfigText(text, "test"));
//
// StatusIs(code) and StatusIs(code, message_matcher) accept a code or a Matcher<StatusCode>,
// and a message matcher for std::string (a plain string means equality). Mismatches explain
// themselves with the whole status ("INVALID_ARGUMENT: ...").
#ifndef PS_COMMON_STATUS_MATCHERS_H_
#define PS_COMMON_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace internal_status_matchers {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }

template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// The type-independent part of StatusIs: matches a Status against code and message matchers.
class StatusIsImpl {
 public:
  StatusIsImpl(testing::Matcher<absl::StatusCode> code,
               testing::Matcher<const std::string&> message)
      : code_(std::move(code)), message_(std::move(message)) {}

  void DescribeTo(std::ostream* os) const {
    *os << "has a status code that ";
    code_.DescribeTo(os);
    *os << ", and has an error message that ";
    message_.DescribeTo(os);
  }

  void DescribeNegationTo(std::ostream* os) const {
    *os << "has a status code that ";
    code_.DescribeNegationTo(os);
    *os << ", or has an error message that ";
    message_.DescribeNegationTo(os);
  }

  bool MatchAndExplain(const absl::Status& status, testing::MatchResultListener* listener) const {
    *listener << "whose status is " << status;
    testing::StringMatchResultListener inner;
    if (!code_.MatchAndExplain(status.code(), &inner)) {
      *listener << ", whose code is wrong" << (inner.str().empty() ? "" : " ") << inner.str();
      return false;
    }
    if (!message_.MatchAndExplain(std::string(status.message()), &inner)) {
      *listener << ", whose message is wrong" << (inner.str().empty() ? "" : " ") << inner.str();
      return false;
    }
    return true;
  }

 private:
  const testing::Matcher<absl::StatusCode> code_;
  const testing::Matcher<const std::string&> message_;
};

// Matcher<T> for a concrete argument type T (absl::Status or absl::StatusOr<U>, any cv/ref).
template <typename T>
class MonoStatusIsMatcher : public testing::MatcherInterface<T> {
 public:
  explicit MonoStatusIsMatcher(StatusIsImpl impl) : impl_(std::move(impl)) {}
  void DescribeTo(std::ostream* os) const override { impl_.DescribeTo(os); }
  void DescribeNegationTo(std::ostream* os) const override { impl_.DescribeNegationTo(os); }
  bool MatchAndExplain(T actual, testing::MatchResultListener* listener) const override {
    return impl_.MatchAndExplain(GetStatus(actual), listener);
  }

 private:
  const StatusIsImpl impl_;
};

// The polymorphic matcher StatusIs returns; converts to Matcher<Status> or
// Matcher<StatusOr<T>>.
class StatusIsMatcher {
 public:
  StatusIsMatcher(testing::Matcher<absl::StatusCode> code,
                  testing::Matcher<const std::string&> message)
      : impl_(std::move(code), std::move(message)) {}

  template <typename T>
  operator testing::Matcher<T>() const {  // NOLINT(google-explicit-constructor)
    return testing::Matcher<T>(new MonoStatusIsMatcher<const T&>(impl_));
  }

 private:
  const StatusIsImpl impl_;
};

// Matcher<T> of IsOk.
template <typename T>
class MonoIsOkMatcher : public testing::MatcherInterface<T> {
 public:
  void DescribeTo(std::ostream* os) const override { *os << "is OK"; }
  void DescribeNegationTo(std::ostream* os) const override { *os << "is not OK"; }
  bool MatchAndExplain(T actual, testing::MatchResultListener* listener) const override {
    const absl::Status& status = GetStatus(actual);
    if (!status.ok()) *listener << "whose status is " << status;
    return status.ok();
  }
};

class IsOkMatcher {
 public:
  template <typename T>
  operator testing::Matcher<T>() const {  // NOLINT(google-explicit-constructor)
    return testing::Matcher<T>(new MonoIsOkMatcher<const T&>());
  }
};

}  // namespace internal_status_matchers

// Matches an absl::Status or absl::StatusOr<T> whose code matches `code` (an
// absl::StatusCode or a Matcher<absl::StatusCode>) and whose message matches `message` (a
// string for equality, or a Matcher<std::string> such as testing::HasSubstr("...")).
template <typename CodeMatcher, typename MessageMatcher>
internal_status_matchers::StatusIsMatcher StatusIs(CodeMatcher&& code, MessageMatcher&& message) {
  return internal_status_matchers::StatusIsMatcher(
      testing::MatcherCast<absl::StatusCode>(std::forward<CodeMatcher>(code)),
      testing::MatcherCast<const std::string&>(std::forward<MessageMatcher>(message)));
}

// As above, with any message.
template <typename CodeMatcher>
internal_status_matchers::StatusIsMatcher StatusIs(CodeMatcher&& code) {
  return StatusIs(std::forward<CodeMatcher>(code), testing::_);
}

// Matches an OK absl::Status or an absl::StatusOr<T> that holds a value.
inline internal_status_matchers::IsOkMatcher IsOk() { return {}; }

}  // namespace ps::common

#define EXPECT_OK(expr) EXPECT_THAT((expr), ::ps::common::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::ps::common::IsOk())

// ASSERT_OK_AND_ASSIGN(lhs, expr): asserts that the StatusOr `expr` is OK and moves its value
// into `lhs` (which may be a declaration, e.g. `auto x`).
#define PS_MATCHERS_CONCAT_INNER_(a, b) a##b
#define PS_MATCHERS_CONCAT_(a, b) PS_MATCHERS_CONCAT_INNER_(a, b)
#define PS_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  ASSERT_THAT(statusor, ::ps::common::IsOk());              \
  lhs = std::move(statusor).value()
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  PS_ASSERT_OK_AND_ASSIGN_IMPL_(PS_MATCHERS_CONCAT_(_ps_assert_statusor_, __LINE__), lhs, rexpr)

#endif  // PS_COMMON_STATUS_MATCHERS_H_
