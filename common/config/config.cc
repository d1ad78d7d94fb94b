// Loading, parsing and overriding the JobConfig. Model expansion is in config_model.cc,
// validation in config_validate.cc.
#include "common/config/config.h"

#include <cerrno>
#include <cstdio>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/types/optional.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"

namespace ps::common {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Keeps the first error as "<source>:<line>:<column>: <message>" (protobuf counts from 0).
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  explicit FirstErrorCollector(absl::string_view source) : source_(source) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (error_.empty())
      error_ = absl::StrCat(source_, ":", line + 1, ":", column + 1, ": ", message);
  }

  const std::string& error() const { return error_; }

 private:
  const std::string source_;
  std::string error_;
};

// Parses `text` into `*message` (cleared first), reporting errors against `source`.
absl::Status ParseText(absl::string_view text, absl::string_view source, Message* message) {
  FirstErrorCollector errors(source);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), message)) {
    return absl::InvalidArgumentError(
        errors.error().empty() ? absl::StrCat(source, ": cannot parse") : errors.error());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    std::string message = absl::StrCat("cannot open config file '", path,
                                       "': ", std::generic_category().message(error));
    if (error == ENOENT) return absl::NotFoundError(message);
    return absl::InvalidArgumentError(message);
  }
  std::string contents;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) contents.append(buffer, n);
  const bool failed = std::ferror(file);
  const int error = errno;
  std::fclose(file);
  if (failed) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read config file '", path,
                                                   "': ", std::generic_category().message(error)));
  }
  return contents;
}

// ---- Overrides -----------------------------------------------------------------------------

// One component of an override path: `field` or `field[index]`.
struct PathStep {
  std::string field;
  absl::optional<std::string> index;
};

absl::StatusOr<std::vector<PathStep>> ParsePath(absl::string_view path) {
  std::vector<PathStep> steps;
  size_t pos = 0;
  while (true) {
    PathStep step;
    size_t end = pos;
    while (end < path.size() && path[end] != '.' && path[end] != '[') ++end;
    step.field = std::string(path.substr(pos, end - pos));
    if (step.field.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("empty field name at offset ", pos));
    }
    pos = end;
    if (pos < path.size() && path[pos] == '[') {
      size_t close = path.find(']', pos);
      if (close == absl::string_view::npos) return absl::InvalidArgumentError("unclosed '['");
      step.index = std::string(path.substr(pos + 1, close - pos - 1));
      if (step.index->empty()) return absl::InvalidArgumentError("empty []");
      pos = close + 1;
    }
    steps.push_back(std::move(step));
    if (pos == path.size()) return steps;
    if (path[pos] != '.') {
      return absl::InvalidArgumentError(absl::StrCat("expected '.' at offset ", pos));
    }
    ++pos;
  }
}

// "tables[emb].dim" for steps [0, count).
std::string PathPrefix(const std::vector<PathStep>& steps, size_t count) {
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) out += '.';
    absl::StrAppend(&out, steps[i].field);
    if (steps[i].index) absl::StrAppend(&out, "[", *steps[i].index, "]");
  }
  return out;
}

std::string TypeName(const FieldDescriptor* field) {
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
    std::vector<std::string> names;
    for (int i = 0; i < field->enum_type()->value_count(); ++i) {
      names.push_back(field->enum_type()->value(i)->name());
    }
    return absl::StrCat("enum ", field->enum_type()->full_name(), ": ", absl::StrJoin(names, ", "));
  }
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return field->message_type()->full_name();
  }
  return field->cpp_type_name();
}

// Parses `text` as the type of scalar `field` and stores it: into the singular field when
// `index` is unset, else into element *index of the repeated field (appending when *index ==
// its size). Returns false when `text` does not parse as the field's type.
bool SetScalar(Message* message, const FieldDescriptor* field, absl::string_view text,
               absl::optional<int> index) {
  const Reflection* r = message->GetReflection();
  const bool append = index && *index == r->FieldSize(*message, field);
  auto store = [&](auto value, auto set, auto add, auto set_repeated) {
    if (!index) {
      (r->*set)(message, field, value);
    } else if (append) {
      (r->*add)(message, field, value);
    } else {
      (r->*set_repeated)(message, field, *index, value);
    }
    return true;
  };
  if (field->cpp_type() != FieldDescriptor::CPPTYPE_STRING) text = absl::StripAsciiWhitespace(text);
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t v;
      return absl::SimpleAtoi(text, &v) &&
             store(v, &Reflection::SetInt32, &Reflection::AddInt32, &Reflection::SetRepeatedInt32);
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v;
      return absl::SimpleAtoi(text, &v) &&
             store(v, &Reflection::SetInt64, &Reflection::AddInt64, &Reflection::SetRepeatedInt64);
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v;
      return absl::SimpleAtoi(text, &v) && store(v, &Reflection::SetUInt32, &Reflection::AddUInt32,
                                                 &Reflection::SetRepeatedUInt32);
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v;
      return absl::SimpleAtoi(text, &v) && store(v, &Reflection::SetUInt64, &Reflection::AddUInt64,
                                                 &Reflection::SetRepeatedUInt64);
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      float v;
      return absl::SimpleAtof(text, &v) &&
             store(v, &Reflection::SetFloat, &Reflection::AddFloat, &Reflection::SetRepeatedFloat);
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double v;
      return absl::SimpleAtod(text, &v) && store(v, &Reflection::SetDouble, &Reflection::AddDouble,
                                                 &Reflection::SetRepeatedDouble);
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      if (text != "true" && text != "false") return false;
      return store(text == "true", &Reflection::SetBool, &Reflection::AddBool,
                   &Reflection::SetRepeatedBool);
    }
    case FieldDescriptor::CPPTYPE_STRING:
      return store(std::string(text), &Reflection::SetString, &Reflection::AddString,
                   &Reflection::SetRepeatedString);
    case FieldDescriptor::CPPTYPE_ENUM: {
      const EnumValueDescriptor* value = field->enum_type()->FindValueByName(std::string(text));
      int number;
      if (value == nullptr && absl::SimpleAtoi(text, &number)) {
        value = field->enum_type()->FindValueByNumber(number);
      }
      return value != nullptr &&
             store(value, &Reflection::SetEnum, &Reflection::AddEnum, &Reflection::SetRepeatedEnum);
    }
    default:
      return false;
  }
}

absl::Status BadValue(const std::string& path, const FieldDescriptor* field,
                      absl::string_view value) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid value '", value, "' for ", path, " (", TypeName(field), ")"));
}

// Assigns `value` to the whole `field` of `message` (the last path component, no index).
absl::Status AssignField(Message* message, const FieldDescriptor* field, const std::string& path,
                         absl::string_view value) {
  const Reflection* r = message->GetReflection();
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    if (field->is_repeated()) {
      return absl::InvalidArgumentError(absl::StrCat(path, " is a repeated message; assign to ",
                                                     path, "[<index>] or ", path, "[<name>]"));
    }
    absl::string_view text = absl::StripAsciiWhitespace(value);
    if (absl::ConsumePrefix(&text, "{") && !absl::ConsumeSuffix(&text, "}")) {
      return BadValue(path, field, value);
    }
    return ParseText(text, path, r->MutableMessage(message, field));
  }
  if (!field->is_repeated()) {
    if (!SetScalar(message, field, value, absl::nullopt)) return BadValue(path, field, value);
    return absl::OkStatus();
  }
  // A repeated scalar takes the whole comma-separated list; "" empties it.
  r->ClearField(message, field);
  if (value.empty()) return absl::OkStatus();
  for (absl::string_view element : absl::StrSplit(value, ',')) {
    if (!SetScalar(message, field, element, r->FieldSize(*message, field))) {
      return BadValue(path, field, element);
    }
  }
  return absl::OkStatus();
}

// The element of repeated `field` that `index` selects: a number in [0, size] (size
// appends), or the value of the elements' `name` field.
absl::StatusOr<int> ResolveIndex(const Message& message, const FieldDescriptor* field,
                                 const std::string& index, const std::string& path) {
  const Reflection* r = message.GetReflection();
  const int size = r->FieldSize(message, field);
  int number;
  if (absl::SimpleAtoi(index, &number)) {
    if (number < 0 || number > size) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": index ", number, " out of range (",
                                                     field->name(), " has ", size, " elements; ",
                                                     size, " appends)"));
    }
    return number;
  }
  const FieldDescriptor* name_field = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE
                                          ? field->message_type()->FindFieldByName("name")
                                          : nullptr;
  if (name_field == nullptr || name_field->cpp_type() != FieldDescriptor::CPPTYPE_STRING ||
      name_field->is_repeated()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": index '", index, "' is not a number (",
                                                   field->name(),
                                                   " elements have no name to select by)"));
  }
  for (int i = 0; i < size; ++i) {
    const Message& element = r->GetRepeatedMessage(message, field, i);
    if (element.GetReflection()->GetString(element, name_field) == index) return i;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": no element of ", field->name(), " is named '", index, "'"));
}

// Applies `value` at `steps`, walking down from `message`.
absl::Status ApplyAt(Message* message, const std::vector<PathStep>& steps,
                     absl::string_view value) {
  for (size_t s = 0; s < steps.size(); ++s) {
    const PathStep& step = steps[s];
    const bool last = s + 1 == steps.size();
    const std::string path = PathPrefix(steps, s + 1);
    const Descriptor* type = message->GetDescriptor();
    const FieldDescriptor* field = type->FindFieldByName(step.field);
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown field '", step.field, "' in ",
                                                     type->full_name(), " (at ", path, ")"));
    }
    const Reflection* r = message->GetReflection();
    const bool is_message = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (!step.index) {
      if (last) return AssignField(message, field, path, value);
      if (!is_message || field->is_repeated()) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, " is ",
            field->is_repeated() ? "repeated; select an element with [] before ."
                                 : absl::StrCat("a ", TypeName(field), " and has no field '",
                                                steps[s + 1].field, "'")));
      }
      message = r->MutableMessage(message, field);
      continue;
    }
    if (!field->is_repeated()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", field->name(), " is not repeated and takes no [index]"));
    }
    ASSIGN_OR_RETURN(int index, ResolveIndex(*message, field, *step.index, path));
    if (!is_message) {
      if (!last) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, " is a ", TypeName(field), " and has no fields"));
      }
      if (!SetScalar(message, field, value, index)) return BadValue(path, field, value);
      return absl::OkStatus();
    }
    Message* element = index == r->FieldSize(*message, field)
                           ? r->AddMessage(message, field)
                           : r->MutableRepeatedMessage(message, field, index);
    if (last) {
      absl::string_view text = absl::StripAsciiWhitespace(value);
      if (absl::ConsumePrefix(&text, "{") && !absl::ConsumeSuffix(&text, "}")) {
        return BadValue(path, field, value);
      }
      return ParseText(text, path, element);
    }
    message = element;
  }
  return absl::OkStatus();  // Unreachable: ParsePath never returns an empty path.
}

}  // namespace

absl::StatusOr<ps::JobConfig> ParseJobConfigText(absl::string_view text,
                                                 absl::string_view source_name) {
  ps::JobConfig config;
  RETURN_IF_ERROR(ParseText(text, source_name, &config));
  return config;
}

absl::Status ApplyOverride(const std::string& assignment, ps::JobConfig* config) {
  const std::string context = absl::StrCat("override '", assignment, "'");
  // The path ends at the first '=' outside [...] (names in brackets are literal).
  size_t eq = std::string::npos;
  for (size_t i = 0, depth = 0; i < assignment.size(); ++i) {
    if (assignment[i] == '[') ++depth;
    if (assignment[i] == ']' && depth > 0) --depth;
    if (assignment[i] == '=' && depth == 0) {
      eq = i;
      break;
    }
  }
  if (eq == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(context, ": expected path.to.field=value"));
  }
  absl::string_view path = absl::StripAsciiWhitespace(absl::string_view(assignment).substr(0, eq));
  absl::string_view value = absl::string_view(assignment).substr(eq + 1);
  ASSIGN_OR_RETURN(std::vector<PathStep> steps, ParsePath(path),
                   absl::StrCat(context, ": bad path '", path, "'"));
  RETURN_IF_ERROR_CTX(ApplyAt(config, steps, value), context);
  return absl::OkStatus();
}

absl::StatusOr<ps::JobConfig> LoadJobConfig(const std::string& path,
                                            absl::Span<const std::string> overrides) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  ASSIGN_OR_RETURN(ps::JobConfig config, ParseJobConfigText(text, path));
  for (const std::string& assignment : overrides) {
    RETURN_IF_ERROR(ApplyOverride(assignment, &config));
  }
  return config;
}

absl::StatusOr<ps::JobConfig> LoadAndPrepareJobConfig(const std::string& path,
                                                      absl::Span<const std::string> overrides) {
  ASSIGN_OR_RETURN(ps::JobConfig config, LoadJobConfig(path, overrides));
  RETURN_IF_ERROR_CTX(ExpandModelTables(&config), path);
  RETURN_IF_ERROR_CTX(ValidateJobConfig(config), path);
  return config;
}

}  // namespace ps::common
