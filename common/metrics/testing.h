// Test helpers for the metrics endpoint: a strict parser of the Prometheus text format 0.0.4
// and a minimal HTTP/1.1 client over 127.0.0.1. Test-only.
#ifndef PS_COMMON_METRICS_TESTING_H_
#define PS_COMMON_METRICS_TESTING_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ps::common::metrics::testing {

using Labels = std::map<std::string, std::string>;

struct ParsedSample {
  std::string name;  // as written, e.g. "x_bucket"
  Labels labels;
  double value = 0;
};

struct ParsedText {
  std::map<std::string, std::string> types;  // family name -> counter, gauge, histogram, ...
  std::map<std::string, std::string> help;   // family name -> HELP text (unescaped)
  std::vector<ParsedSample> samples;

  // The value of the sample with exactly this name and these labels.
  std::optional<double> Get(absl::string_view name, const Labels& labels = {}) const;
  // The sum over samples with this name whose labels include `labels`.
  double Sum(absl::string_view name, const Labels& labels = {}) const;
};

// Parses and checks exposition text: HELP/TYPE lines (at most one of each per family, TYPE
// before the family's samples), sample syntax (names, label escapes, values, optional
// timestamp), every sample belonging to a typed family, no series twice, and histograms
// whole (an "le" on every bucket, cumulative counts not decreasing, a +Inf bucket equal to
// _count, a _sum). INVALID_ARGUMENT naming the line otherwise.
absl::StatusOr<ParsedText> ParseText(absl::string_view text);

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// Sends `request` as is to 127.0.0.1:`port`, reads until the server closes, and returns what
// came back. UNAVAILABLE if it cannot connect; DEADLINE_EXCEEDED after `timeout`.
absl::StatusOr<std::string> SendRaw(int port, absl::string_view request,
                                    absl::Duration timeout = absl::Seconds(10));
// Parses a raw answer (status line, headers, body of Content-Length bytes).
absl::StatusOr<HttpResponse> ParseResponse(absl::string_view raw);
// GET `path` from 127.0.0.1:`port`.
absl::StatusOr<HttpResponse> HttpGet(int port, absl::string_view path,
                                     absl::Duration timeout = absl::Seconds(10));

}  // namespace ps::common::metrics::testing

#endif  // PS_COMMON_METRICS_TESTING_H_
