// A small, strict JSON (RFC 8259) reader for the little JSON the binaries meet, such as
// Kubeflow's TF_CONFIG. Strict means: no comments, no trailing commas, no single quotes, no
// NaN/Infinity, no leading zeros or '+', no control characters inside strings, no duplicate
// object keys, nothing but whitespace after the value, and nesting at most kMaxJsonDepth deep.
// \uXXXX escapes (surrogate pairs included) are decoded to UTF-8; lone surrogates are refused.
//
//   ASSIGN_OR_RETURN(JsonValue root, ParseJson(text));
//   const JsonValue* task = root.Find("task");
//
// Thread-compatible: JsonValue is a plain value; ParseJson is pure.
#ifndef PS_COMMON_CLUSTER_JSON_H_
#define PS_COMMON_CLUSTER_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps::common {

// How deeply arrays and objects may nest before ParseJson refuses the text.
inline constexpr int kMaxJsonDepth = 64;

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  Type type = Type::kNull;
  bool bool_value = false;
  // kNumber: the value as a double and the literal as written (to tell 1 from 1.0).
  double number = 0;
  std::string number_text;
  // kString: the decoded UTF-8 text.
  std::string string_value;
  std::vector<JsonValue> array;
  // kObject: members in the order written; keys are unique.
  std::vector<std::pair<std::string, JsonValue>> object;

  // The member `key` of an object, or nullptr (also when this is not an object).
  const JsonValue* Find(absl::string_view key) const;
  // kNumber written as an integer literal (no fraction, no exponent) that fits an int64.
  bool IsInteger() const;
  // "null", "boolean", "number", "string", "array" or "object", for error messages.
  static const char* TypeName(Type type);
};

// Parses one JSON text. Errors: INVALID_ARGUMENT "offset N: <problem>" (0-based byte offset
// of the first problem), e.g. "offset 7: expected ':' after an object key".
[[nodiscard]] absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

}  // namespace ps::common

#endif  // PS_COMMON_CLUSTER_JSON_H_
