#include "common/cluster/json.h"

#include <string>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

using ::testing::HasSubstr;

TEST(ParseJson, ReadsEveryKindOfValue) {
  ASSERT_OK_AND_ASSIGN(
      JsonValue v, ParseJson(R"( {"s": "a\"b\\c\/\n\t", "n": -12.5e1, "i": 0, "t": true, "f": false,
                    "z": null, "a": [1, [], {}], "o": {"k": "v"}} )"));
  ASSERT_EQ(v.type, JsonValue::Type::kObject);
  EXPECT_EQ(v.Find("s")->string_value, "a\"b\\c/\n\t");
  EXPECT_EQ(v.Find("n")->number, -125);
  EXPECT_FALSE(v.Find("n")->IsInteger());
  EXPECT_TRUE(v.Find("i")->IsInteger());
  EXPECT_TRUE(v.Find("t")->bool_value);
  EXPECT_EQ(v.Find("f")->type, JsonValue::Type::kBool);
  EXPECT_FALSE(v.Find("f")->bool_value);
  EXPECT_EQ(v.Find("z")->type, JsonValue::Type::kNull);
  ASSERT_EQ(v.Find("a")->array.size(), 3u);
  EXPECT_EQ(v.Find("a")->array[1].type, JsonValue::Type::kArray);
  EXPECT_EQ(v.Find("o")->Find("k")->string_value, "v");
  EXPECT_EQ(v.Find("missing"), nullptr);
  EXPECT_EQ(v.object.front().first, "s");  // order kept
}

TEST(ParseJson, DecodesUnicodeEscapes) {
  ASSERT_OK_AND_ASSIGN(JsonValue v, ParseJson(R"("\u00e9\u20ac\ud83d\ude00")"));
  EXPECT_EQ(v.string_value, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
}

TEST(ParseJson, IntegerMeansAnIntegerLiteral) {
  ASSERT_OK_AND_ASSIGN(JsonValue one, ParseJson("1.0"));
  EXPECT_FALSE(one.IsInteger());
  ASSERT_OK_AND_ASSIGN(JsonValue big, ParseJson("123456789012345678901234"));
  EXPECT_FALSE(big.IsInteger());
  ASSERT_OK_AND_ASSIGN(JsonValue negative, ParseJson("-3"));
  EXPECT_TRUE(negative.IsInteger());
}

TEST(ParseJson, RefusesWhatStrictJsonRefuses) {
  struct Case {
    const char* text;
    const char* error;
  };
  const Case cases[] = {
      {"", "offset 0: unexpected end of input"},
      {"   ", "offset 3: unexpected end of input"},
      {R"({"a": 1,})", "offset 8: expected a string as object key"},
      {"[1, 2,]", "offset 6: unexpected character"},
      {"{'a': 1}", "offset 1: expected a string as object key"},
      {R"({"a" 1})", "offset 5: expected ':'"},
      {R"({"a": 1 "b": 2})", "offset 8: expected ',' or '}'"},
      {"[1 2]", "offset 3: expected ',' or ']'"},
      {R"({"a": 1} x)", "offset 9: unexpected text after the JSON value"},
      {"01", "offset 1: leading zero"},
      {"+1", "offset 0: unexpected character"},
      {"1.", "offset 2: expected a digit after '.'"},
      {"1e", "offset 2: expected a digit in the exponent"},
      {"-", "offset 1: expected a digit"},
      {"NaN", "offset 0: unexpected character"},
      {"tru", "offset 0: unexpected token"},
      {"// c\n{}", "offset 0: unexpected character"},
      {"\"abc", "offset 4: unterminated string"},
      {"\"a\tb\"", "offset 2: control character"},
      {R"("\x")", "offset 2: invalid escape"},
      {R"("\u12")", "offset 3: truncated \\u escape"},
      {R"("\u12G4")", "offset 3: expected 4 hex digits"},
      {R"("\udc00")", "offset 1: lone low surrogate"},
      {R"("\ud83d x")", "offset 1: high surrogate not followed"},
      {R"({"a": 1, "a": 2})", "offset 9: duplicate object key \"a\""},
      {"{", "offset 1: expected a string as object key"},
      {"[", "offset 1: unexpected end of input"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseJson(c.text), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)))
        << c.text;
  }
}

TEST(ParseJson, RefusesDeepNesting) {
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_THAT(ParseJson(ok), IsOk());
  const std::string deep =
      std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  EXPECT_THAT(ParseJson(deep),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nested too deeply")));
}

}  // namespace
}  // namespace ps::common
