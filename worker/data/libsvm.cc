#include "worker/data/libsvm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "worker/data/file_reader.h"
#include "worker/data/in_memory_dataset.h"
#include "worker/data/memory_limit.h"

namespace ps::worker {
namespace {

// The largest multi-class label accepted; keeps num_classes (label + 1) within int.
constexpr int64_t kMaxClassLabel = std::numeric_limits<int32_t>::max() - 1;

// Everything parsed so far, in SparseDataset's layout.
struct Parsed {
  std::vector<uint64_t> offsets = {0};
  std::vector<uint64_t> ids;
  std::vector<float> values;
  std::vector<int32_t> labels;
};

// Bytes the arrays of `p` hold (their capacity: what a growth keeps while it copies).
double HeldBytes(const Parsed& p) {
  return static_cast<double>(p.offsets.capacity()) * sizeof(uint64_t) +
         static_cast<double>(p.ids.capacity()) * sizeof(uint64_t) +
         static_cast<double>(p.values.capacity()) * sizeof(float) +
         static_cast<double>(p.labels.capacity()) * sizeof(int32_t);
}

// Grows the parallel arrays `a` and `b` (ids and values; offsets and labels) to hold `extra`
// more elements each: doubling, as push_back would, where that fits in `limit` together
// with everything held (`held` bytes, the old buffers included: they are held while they
// are copied), else to as much as still fits (so that the arrays are not copied again for
// every line); RESOURCE_EXHAUSTED when not even `extra` more fit.
template <typename A, typename B>
absl::Status GrowPair(std::vector<A>* a, std::vector<B>* b, size_t extra, double held,
                      uint64_t limit, const std::string& path, uint64_t line_number) {
  const size_t need = std::max(a->size(), b->size()) + extra;
  if (need <= a->capacity() && need <= b->capacity()) return absl::OkStatus();
  constexpr double kBytes = sizeof(A) + sizeof(B);
  size_t want = std::max(need, 2 * std::max(a->capacity(), b->capacity()));
  if (limit > 0) {
    const double room = static_cast<double>(limit) - held;
    if (static_cast<double>(need) * kBytes > room) {
      return CheckDatasetFits(
          held + static_cast<double>(need) * kBytes, limit,
          absl::StrCat(path, ":", line_number, ": the examples of the lines up to this one"));
    }
    if (static_cast<double>(want) * kBytes > room) {
      want = std::max(need, static_cast<size_t>(room / kBytes));
    }
  }
  a->reserve(want);
  b->reserve(want);
  return absl::OkStatus();
}

// Makes room in `p` for the example of line `line_number`, of `line_bytes` (which has at
// most one feature per 4 bytes: "i:v" and a separator, after a label and its separator).
absl::Status MakeRoom(Parsed* p, size_t line_bytes, uint64_t limit, const std::string& path,
                      uint64_t line_number) {
  const size_t max_features = (line_bytes + 1) / 4;
  const double line = static_cast<double>(line_bytes);
  RETURN_IF_ERROR(
      GrowPair(&p->ids, &p->values, max_features, HeldBytes(*p) + line, limit, path, line_number));
  return GrowPair(&p->offsets, &p->labels, 1, HeldBytes(*p) + line, limit, path, line_number);
}

// Parses one line; knows where it is for error messages.
class LineParser {
 public:
  LineParser(const std::string& path, uint64_t line_number, absl::string_view line,
             const LibsvmOptions& options)
      : path_(path), line_number_(line_number), line_(line), options_(options) {}

  // Appends the line's example to `out`, if the line has one.
  absl::Status Parse(Parsed* out);

 private:
  // Next whitespace-separated token of the line, or an empty view at the end.
  absl::string_view NextToken();
  absl::Status Error(absl::string_view at, absl::string_view problem) const;
  absl::StatusOr<int32_t> ParseLabel(absl::string_view token) const;
  absl::Status ParseFeature(absl::string_view token, Parsed* out) const;

  const std::string& path_;
  const uint64_t line_number_;
  const absl::string_view line_;
  const LibsvmOptions& options_;
  size_t pos_ = 0;
};

absl::string_view LineParser::NextToken() {
  auto is_space = [](char c) { return c == ' ' || c == '\t'; };
  while (pos_ < line_.size() && is_space(line_[pos_])) ++pos_;
  const size_t begin = pos_;
  while (pos_ < line_.size() && !is_space(line_[pos_])) ++pos_;
  return line_.substr(begin, pos_ - begin);
}

// `at` is a view into line_, so its position gives the column.
absl::Status LineParser::Error(absl::string_view at, absl::string_view problem) const {
  const size_t column = static_cast<size_t>(at.data() - line_.data()) + 1;
  return absl::InvalidArgumentError(
      absl::StrCat(path_, ":", line_number_, ":", column, ": ", problem));
}

absl::StatusOr<int32_t> LineParser::ParseLabel(absl::string_view token) const {
  if (!options_.multiclass) {
    // Strip the '+' that LIBSVM files put on positives ourselves rather than rely on the
    // number parser; "+-1" stays an error.
    absl::string_view number = token;
    const bool plus = absl::ConsumePrefix(&number, "+");
    double value = 0;
    if (!(plus && absl::StartsWith(number, "-")) && absl::SimpleAtod(number, &value)) {
      if (value == 1) return 1;
      if (value == 0 || value == -1) return 0;
    }
    return Error(token, absl::StrCat("bad label '", token, "': want +1, 1, 0 or -1 (binary)"));
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(token, &value) || value < 0 || value > kMaxClassLabel) {
    return Error(token, absl::StrCat("bad label '", token,
                                     "': want a non-negative integer class (multi-class)"));
  }
  if (options_.num_classes > 0 && value >= options_.num_classes) {
    return Error(token,
                 absl::StrCat("label ", value, " is out of range [0, ", options_.num_classes, ")"));
  }
  return static_cast<int32_t>(value);
}

absl::Status LineParser::ParseFeature(absl::string_view token, Parsed* out) const {
  const size_t colon = token.find(':');
  if (colon == absl::string_view::npos) {
    return Error(token, absl::StrCat("missing ':' in feature '", token, "' (want index:value)"));
  }
  const absl::string_view index_text = token.substr(0, colon);
  const absl::string_view value_text = token.substr(colon + 1);
  uint64_t index = 0;
  // SimpleAtoi would accept a sign or surrounding spaces; an index is plain digits.
  const bool digits_only =
      !index_text.empty() && std::all_of(index_text.begin(), index_text.end(),
                                         [](char c) { return c >= '0' && c <= '9'; });
  if (!digits_only || !absl::SimpleAtoi(index_text, &index)) {
    return Error(
        index_text.empty() ? token : index_text,
        absl::StrCat("bad feature index '", index_text, "': want an unsigned 64-bit integer"));
  }
  // value_text may be empty ("7:"); point the column at the ':' then.
  const absl::string_view value_at = value_text.empty() ? token.substr(colon) : value_text;
  float value = 0;
  if (!absl::SimpleAtof(value_text, &value)) {
    return Error(value_at, absl::StrCat("bad feature value '", value_text, "': want a number"));
  }
  // SimpleAtof turns "inf", "nan" and overflowing numbers like 1e999 into non-finite floats.
  if (!std::isfinite(value)) {
    return Error(value_at, absl::StrCat("non-finite feature value '", value_text, "'"));
  }
  out->ids.push_back(index);
  out->values.push_back(value);
  return absl::OkStatus();
}

absl::Status LineParser::Parse(Parsed* out) {
  const absl::string_view label_token = NextToken();
  if (label_token.empty()) return absl::OkStatus();  // blank or comment-only line
  ASSIGN_OR_RETURN(int32_t label, ParseLabel(label_token));
  const size_t entries_before = out->ids.size();
  for (absl::string_view token = NextToken(); !token.empty(); token = NextToken()) {
    if (absl::StartsWith(token, "qid:")) continue;
    absl::Status status = ParseFeature(token, out);
    if (!status.ok()) {
      // Leave `out` as it was, so that it stays consistent even on error.
      out->ids.resize(entries_before);
      out->values.resize(entries_before);
      return status;
    }
  }
  out->labels.push_back(label);
  out->offsets.push_back(out->ids.size());
  return absl::OkStatus();
}

// The line without its comment and its '\r'.
absl::string_view Content(absl::string_view line) {
  const size_t hash = line.find('#');
  if (hash != absl::string_view::npos) line = line.substr(0, hash);
  absl::ConsumeSuffix(&line, "\r");
  return line;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> LoadLibsvmDataset(const std::string& path,
                                                           const LibsvmOptions& options) {
  if (options.multiclass && (options.num_classes < 0 || options.num_classes == 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LibsvmOptions.num_classes must be 0 (infer) or >= 2, got ", options.num_classes));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<FileReader> file, FileReader::Open(path));
  const uint64_t limit = DatasetMemoryLimit(options.max_memory_bytes);
  // A line and what it parses into (up to 3 times its bytes) fit in the limit.
  const size_t max_line = limit == 0 ? std::numeric_limits<size_t>::max() : limit / 4;
  Parsed parsed;
  std::string line;
  uint64_t line_number = 0;
  while (true) {
    ASSIGN_OR_RETURN(bool more, file->ReadLine(&line, max_line));
    if (!more) break;
    ++line_number;
    RETURN_IF_ERROR(MakeRoom(&parsed, line.size(), limit, path, line_number));
    LineParser parser(path, line_number, Content(line), options);
    RETURN_IF_ERROR(parser.Parse(&parsed));
  }
  int num_classes = 2;
  if (options.multiclass) {
    num_classes = options.num_classes;
    if (num_classes == 0) {
      int32_t max_label = 0;
      for (int32_t l : parsed.labels) max_label = std::max(max_label, l);
      // At least 2 classes, so that a 1-class file still gives a usable classifier shape.
      num_classes = std::max(2, max_label + 1);
    }
  }
  return std::unique_ptr<Dataset>(new SparseDataset(num_classes, std::move(parsed.offsets),
                                                    std::move(parsed.ids), std::move(parsed.values),
                                                    std::move(parsed.labels)));
}

}  // namespace ps::worker
