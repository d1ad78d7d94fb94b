// Status propagation macros (the pinned Abseil, 20220623, has none of its own).
//
//   RETURN_IF_ERROR(DoThing());                       // returns the Status if not OK
//   ASSIGN_OR_RETURN(auto value, ComputeValue());     // unwraps a StatusOr or returns
//   ASSIGN_OR_RETURN(value_, Parse(x), "parse x");    // prefixes context to the message
//
// Context: a third argument of ASSIGN_OR_RETURN, or RETURN_IF_ERROR_CTX(expr, "ctx"), returns
// a Status with the same code and the message "ctx: original message".
#ifndef PS_COMMON_STATUS_MACROS_H_
#define PS_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ps::common {

// Returns `status` with "context: " prepended to its message; OK stays OK.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok() || context.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace ps::common

#define PS_STATUS_CONCAT_INNER_(a, b) a##b
#define PS_STATUS_CONCAT_(a, b) PS_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                                   \
  do {                                                          \
    ::absl::Status _ps_status = (expr);                         \
    if (!_ps_status.ok()) return _ps_status;                    \
  } while (0)

#define RETURN_IF_ERROR_CTX(expr, context)                                      \
  do {                                                                          \
    ::absl::Status _ps_status = (expr);                                         \
    if (!_ps_status.ok()) return ::ps::common::Annotate(_ps_status, (context)); \
  } while (0)

#define PS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr, context)     \
  auto statusor = (rexpr);                                           \
  if (!statusor.ok()) {                                              \
    return ::ps::common::Annotate(statusor.status(), (context));     \
  }                                                                  \
  lhs = std::move(statusor).value()

#define PS_ASSIGN_OR_RETURN_2_(lhs, rexpr) \
  PS_ASSIGN_OR_RETURN_IMPL_(PS_STATUS_CONCAT_(_ps_statusor_, __LINE__), lhs, rexpr, "")
#define PS_ASSIGN_OR_RETURN_3_(lhs, rexpr, context) \
  PS_ASSIGN_OR_RETURN_IMPL_(PS_STATUS_CONCAT_(_ps_statusor_, __LINE__), lhs, rexpr, context)
#define PS_ASSIGN_OR_RETURN_PICK_(_1, _2, _3, name, ...) name

// ASSIGN_OR_RETURN(lhs, expr) or ASSIGN_OR_RETURN(lhs, expr, "context").
#define ASSIGN_OR_RETURN(...)                                                          \
  PS_ASSIGN_OR_RETURN_PICK_(__VA_ARGS__, PS_ASSIGN_OR_RETURN_3_, PS_ASSIGN_OR_RETURN_2_, \
                            unused)(__VA_ARGS__)

#endif  // PS_COMMON_STATUS_MACROS_H_
