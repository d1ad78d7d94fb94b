#include "common/cluster/json.h"

#include <cstdlib>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ps::common {
namespace {

// Recursive descent over `text_`; `pos_` is the next unread byte. Every error reports the
// offset where the problem starts.
class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    SkipWhitespace();
    if (!ParseValue(&value, 0)) return error_;
    SkipWhitespace();
    if (pos_ != text_.size()) return Error("unexpected text after the JSON value");
    return value;
  }

 private:
  absl::Status Error(absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", pos_, ": ", problem));
  }
  // Records the first error; returns false so callers can `return Fail(...)`.
  bool Fail(absl::string_view problem) {
    error_ = Error(problem);
    return false;
  }

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }

  void SkipWhitespace() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r')) {
      ++pos_;
    }
  }

  bool ConsumeLiteral(absl::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  bool ParseValue(JsonValue* out, int depth) {
    if (AtEnd()) return Fail("unexpected end of input, expected a value");
    switch (Peek()) {
      case '{':
        return ParseObject(out, depth + 1);
      case '[':
        return ParseArray(out, depth + 1);
      case '"':
        out->type = JsonValue::Type::kString;
        return ParseString(&out->string_value);
      case 't':
      case 'f':
      case 'n':
        if (ConsumeLiteral("true")) {
          out->type = JsonValue::Type::kBool;
          out->bool_value = true;
          return true;
        }
        if (ConsumeLiteral("false")) {
          out->type = JsonValue::Type::kBool;
          return true;
        }
        if (ConsumeLiteral("null")) {
          out->type = JsonValue::Type::kNull;
          return true;
        }
        return Fail("unexpected token, expected a value");
      default:
        if (Peek() == '-' || (Peek() >= '0' && Peek() <= '9')) return ParseNumber(out);
        return Fail("unexpected character, expected a value");
    }
  }

  bool ParseObject(JsonValue* out, int depth) {
    if (depth > kMaxJsonDepth) return Fail("nested too deeply");
    out->type = JsonValue::Type::kObject;
    ++pos_;  // '{'
    SkipWhitespace();
    if (!AtEnd() && Peek() == '}') {
      ++pos_;
      return true;
    }
    absl::flat_hash_set<std::string> keys;
    while (true) {
      SkipWhitespace();
      if (AtEnd() || Peek() != '"') return Fail("expected a string as object key");
      const size_t key_pos = pos_;
      std::string key;
      if (!ParseString(&key)) return false;
      if (!keys.insert(key).second) {
        pos_ = key_pos;
        return Fail(absl::StrCat("duplicate object key \"", key, "\""));
      }
      SkipWhitespace();
      if (AtEnd() || Peek() != ':') return Fail("expected ':' after an object key");
      ++pos_;
      SkipWhitespace();
      JsonValue value;
      if (!ParseValue(&value, depth)) return false;
      out->object.emplace_back(std::move(key), std::move(value));
      SkipWhitespace();
      if (AtEnd()) return Fail("unexpected end of input, expected ',' or '}'");
      if (Peek() == '}') {
        ++pos_;
        return true;
      }
      if (Peek() != ',') return Fail("expected ',' or '}' in an object");
      ++pos_;
    }
  }

  bool ParseArray(JsonValue* out, int depth) {
    if (depth > kMaxJsonDepth) return Fail("nested too deeply");
    out->type = JsonValue::Type::kArray;
    ++pos_;  // '['
    SkipWhitespace();
    if (!AtEnd() && Peek() == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipWhitespace();
      JsonValue value;
      if (!ParseValue(&value, depth)) return false;
      out->array.push_back(std::move(value));
      SkipWhitespace();
      if (AtEnd()) return Fail("unexpected end of input, expected ',' or ']'");
      if (Peek() == ']') {
        ++pos_;
        return true;
      }
      if (Peek() != ',') return Fail("expected ',' or ']' in an array");
      ++pos_;
    }
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (!AtEnd() && Peek() >= '0' && Peek() <= '9') ++pos_;
      return pos_ - from;
    };
    if (Peek() == '-') ++pos_;
    if (AtEnd() || !(Peek() >= '0' && Peek() <= '9')) return Fail("expected a digit");
    if (Peek() == '0') {
      ++pos_;
      if (!AtEnd() && Peek() >= '0' && Peek() <= '9') return Fail("leading zero in a number");
    } else {
      digits();
    }
    if (!AtEnd() && Peek() == '.') {
      ++pos_;
      if (digits() == 0) return Fail("expected a digit after '.'");
    }
    if (!AtEnd() && (Peek() == 'e' || Peek() == 'E')) {
      ++pos_;
      if (!AtEnd() && (Peek() == '+' || Peek() == '-')) ++pos_;
      if (digits() == 0) return Fail("expected a digit in the exponent");
    }
    out->type = JsonValue::Type::kNumber;
    out->number_text = std::string(text_.substr(start, pos_ - start));
    out->number = std::strtod(out->number_text.c_str(), nullptr);
    return true;
  }

  bool ParseHex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return Fail("truncated \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_ + i];
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        value |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        value |= c - 'A' + 10;
      } else {
        return Fail("expected 4 hex digits after \\u");
      }
    }
    pos_ += 4;
    *out = value;
    return true;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  bool ParseEscape(std::string* out) {
    if (AtEnd()) return Fail("unterminated string");
    const char c = text_[pos_++];
    switch (c) {
      case '"':
      case '\\':
      case '/':
        out->push_back(c);
        return true;
      case 'b':
        out->push_back('\b');
        return true;
      case 'f':
        out->push_back('\f');
        return true;
      case 'n':
        out->push_back('\n');
        return true;
      case 'r':
        out->push_back('\r');
        return true;
      case 't':
        out->push_back('\t');
        return true;
      case 'u':
        break;
      default:
        --pos_;
        return Fail("invalid escape in a string");
    }
    const size_t escape_pos = pos_ - 2;
    uint32_t cp;
    if (!ParseHex4(&cp)) return false;
    if (cp >= 0xDC00 && cp <= 0xDFFF) {
      pos_ = escape_pos;
      return Fail("lone low surrogate in a \\u escape");
    }
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      uint32_t low;
      if (!ConsumeLiteral("\\u") || !ParseHex4(&low) || low < 0xDC00 || low > 0xDFFF) {
        pos_ = escape_pos;
        return Fail("high surrogate not followed by a low surrogate");
      }
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    AppendUtf8(cp, out);
    return true;
  }

  bool ParseString(std::string* out) {
    ++pos_;  // '"'
    while (true) {
      if (AtEnd()) return Fail("unterminated string");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in a string");
      ++pos_;
      if (c == '\\') {
        if (!ParseEscape(out)) return false;
      } else {
        out->push_back(c);
      }
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
  absl::Status error_;
};

}  // namespace

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (const auto& [k, v] : object) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool JsonValue::IsInteger() const {
  int64_t unused;
  return type == Type::kNumber && number_text.find_first_of(".eE") == std::string::npos &&
         absl::SimpleAtoi(number_text, &unused);
}

const char* JsonValue::TypeName(Type type) {
  switch (type) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "boolean";
    case Type::kNumber:
      return "number";
    case Type::kString:
      return "string";
    case Type::kArray:
      return "array";
    case Type::kObject:
      return "object";
  }
  return "?";
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return Parser(text).ParseDocument(); }

}  // namespace ps::common
