#include "common/metrics/testing.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/metrics/metrics.h"

namespace ps::common::metrics::testing {
namespace {

absl::Status Bad(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

bool ParseValue(absl::string_view s, double* v) {
  if (s == "+Inf" || s == "Inf") {
    *v = INFINITY;
    return true;
  }
  if (s == "-Inf") {
    *v = -INFINITY;
    return true;
  }
  if (s == "NaN") {
    *v = NAN;
    return true;
  }
  return absl::SimpleAtod(s, v) && !std::isnan(*v) && !std::isinf(*v);
}

// Parses `{a="x",b="y"}` at the start of `*s` (after the name), consuming it.
absl::Status ParseLabels(absl::string_view* s, Labels* labels, int line) {
  if (!absl::ConsumePrefix(s, "{")) return absl::OkStatus();
  while (!absl::ConsumePrefix(s, "}")) {
    size_t eq = s->find('=');
    if (eq == absl::string_view::npos) return Bad(line, "label without '='");
    const std::string name(s->substr(0, eq));
    if (!IsValidLabelName(name)) return Bad(line, absl::StrCat("bad label name '", name, "'"));
    s->remove_prefix(eq + 1);
    if (!absl::ConsumePrefix(s, "\"")) return Bad(line, "label value not quoted");
    std::string value;
    while (true) {
      if (s->empty()) return Bad(line, "unterminated label value");
      const char c = s->front();
      s->remove_prefix(1);
      if (c == '"') break;
      if (c == '\n') return Bad(line, "raw newline in a label value");
      if (c != '\\') {
        value.push_back(c);
        continue;
      }
      if (s->empty()) return Bad(line, "dangling backslash");
      const char e = s->front();
      s->remove_prefix(1);
      if (e == '\\') {
        value.push_back('\\');
      } else if (e == '"') {
        value.push_back('"');
      } else if (e == 'n') {
        value.push_back('\n');
      } else {
        return Bad(line, absl::StrCat("bad escape \\", std::string(1, e)));
      }
    }
    if (!labels->emplace(name, value).second) return Bad(line, "label given twice");
    if (!absl::ConsumePrefix(s, ",") && !absl::StartsWith(*s, "}")) {
      return Bad(line, "expected ',' or '}' after a label");
    }
  }
  return absl::OkStatus();
}

std::string UnescapeHelp(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == '\\' || s[i + 1] == 'n')) {
      out.push_back(s[i + 1] == 'n' ? '\n' : '\\');
      ++i;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The family a sample belongs to: its own name if typed, else the name without a histogram
// or summary suffix.
std::string FamilyOf(const std::string& name, const std::map<std::string, std::string>& types) {
  if (types.count(name)) return name;
  for (absl::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (absl::EndsWith(name, suffix)) {
      std::string base = name.substr(0, name.size() - suffix.size());
      if (types.count(base)) return base;
    }
  }
  return "";
}

std::string SeriesKey(const std::string& name, const Labels& labels) {
  std::string key = name;
  for (const auto& [k, v] : labels) absl::StrAppend(&key, "\x01", k, "\x02", v);
  return key;
}

absl::Status CheckHistograms(const ParsedText& parsed) {
  struct Series {
    std::vector<std::pair<double, double>> buckets;  // (le, count) in text order
    std::optional<double> sum, count;
  };
  std::map<std::string, Series> series;  // family + labels without le
  for (const ParsedSample& s : parsed.samples) {
    const std::string family = FamilyOf(s.name, parsed.types);
    if (parsed.types.at(family) != "histogram") continue;
    Labels labels = s.labels;
    Series* h;
    if (s.name == family + "_bucket") {
      auto le = labels.find("le");
      double bound;
      if (le == labels.end() || !ParseValue(le->second, &bound)) {
        return absl::InvalidArgumentError(absl::StrCat(s.name, ": bucket without a valid le"));
      }
      labels.erase(le);
      h = &series[SeriesKey(family, labels)];
      h->buckets.emplace_back(bound, s.value);
    } else if (s.name == family + "_sum") {
      series[SeriesKey(family, labels)].sum = s.value;
    } else if (s.name == family + "_count") {
      series[SeriesKey(family, labels)].count = s.value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(s.name, ": not a histogram sample name"));
    }
  }
  for (const auto& [key, h] : series) {
    const std::string name = key.substr(0, key.find('\x01'));
    if (h.buckets.empty() || !std::isinf(h.buckets.back().first) || !h.sum || !h.count) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", name, ": needs buckets ending in +Inf, _sum and _count"));
    }
    for (size_t i = 1; i < h.buckets.size(); ++i) {
      if (h.buckets[i].first <= h.buckets[i - 1].first ||
          h.buckets[i].second < h.buckets[i - 1].second) {
        return absl::InvalidArgumentError(
            absl::StrCat("histogram ", name, ": buckets out of order or decreasing"));
      }
    }
    if (h.buckets.back().second != *h.count) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", name, ": +Inf bucket differs from _count"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<double> ParsedText::Get(absl::string_view name, const Labels& labels) const {
  for (const ParsedSample& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

double ParsedText::Sum(absl::string_view name, const Labels& labels) const {
  double sum = 0;
  for (const ParsedSample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      match = match && it != s.labels.end() && it->second == v;
    }
    if (match) sum += s.value;
  }
  return sum;
}

absl::StatusOr<ParsedText> ParseText(absl::string_view text) {
  ParsedText parsed;
  if (!text.empty() && !absl::EndsWith(text, "\n")) {
    return absl::InvalidArgumentError("the text does not end with a newline");
  }
  std::set<std::string> seen_series;
  std::set<std::string> families_with_samples;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (line.empty()) continue;
    if (absl::ConsumePrefix(&line, "#")) {
      absl::string_view rest = absl::StripLeadingAsciiWhitespace(line);
      const bool is_help = absl::ConsumePrefix(&rest, "HELP ");
      const bool is_type = !is_help && absl::ConsumePrefix(&rest, "TYPE ");
      if (!is_help && !is_type) continue;  // a plain comment
      const size_t space = rest.find(' ');
      const std::string name(rest.substr(0, space));
      const absl::string_view arg = space == absl::string_view::npos ? "" : rest.substr(space + 1);
      if (!IsValidMetricName(name))
        return Bad(number, absl::StrCat("bad metric name '", name, "'"));
      if (is_help) {
        if (!parsed.help.emplace(name, UnescapeHelp(arg)).second) {
          return Bad(number, absl::StrCat("second HELP for ", name));
        }
        continue;
      }
      static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary",
                                                   "untyped"};
      if (!kTypes.count(std::string(arg))) return Bad(number, absl::StrCat("bad type '", arg, "'"));
      if (families_with_samples.count(name)) {
        return Bad(number, absl::StrCat("TYPE of ", name, " after its samples"));
      }
      if (!parsed.types.emplace(name, std::string(arg)).second) {
        return Bad(number, absl::StrCat("second TYPE for ", name));
      }
      continue;
    }
    ParsedSample sample;
    size_t end = 0;
    while (end < line.size() && line[end] != '{' && line[end] != ' ') ++end;
    sample.name = std::string(line.substr(0, end));
    if (!IsValidMetricName(sample.name)) {
      return Bad(number, absl::StrCat("bad metric name '", sample.name, "'"));
    }
    absl::string_view rest = line.substr(end);
    if (absl::Status s = ParseLabels(&rest, &sample.labels, number); !s.ok()) return s;
    if (!absl::ConsumePrefix(&rest, " ")) return Bad(number, "no space before the value");
    std::vector<absl::string_view> fields = absl::StrSplit(rest, ' ');
    int64_t timestamp;
    if (fields.size() > 2 || (fields.size() == 2 && !absl::SimpleAtoi(fields[1], &timestamp))) {
      return Bad(number, "trailing text after the value");
    }
    if (!ParseValue(fields[0], &sample.value)) {
      return Bad(number, absl::StrCat("bad value '", fields[0], "'"));
    }
    const std::string family = FamilyOf(sample.name, parsed.types);
    if (family.empty()) return Bad(number, absl::StrCat(sample.name, " has no TYPE line"));
    families_with_samples.insert(family);
    if (!seen_series.insert(SeriesKey(sample.name, sample.labels)).second) {
      return Bad(number, absl::StrCat(sample.name, ": the same series twice"));
    }
    parsed.samples.push_back(std::move(sample));
  }
  if (absl::Status s = CheckHistograms(parsed); !s.ok()) return s;
  return parsed;
}

absl::StatusOr<std::string> SendRaw(int port, absl::string_view request, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string e = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect 127.0.0.1:", port, ": ", e));
  }
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early (e.g. after 431); read what it said
    sent += n;
  }
  std::string out;
  char buf[4096];
  while (true) {
    const int left_ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p = {fd, POLLIN, 0};
    if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0) {
      close(fd);
      return absl::DeadlineExceededError(absl::StrCat("no end of the answer; got: ", out));
    }
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, n);
  }
  close(fd);
  return out;
}

absl::StatusOr<HttpResponse> ParseResponse(absl::string_view raw) {
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("no end of headers in: ", raw));
  }
  std::vector<absl::string_view> lines = absl::StrSplit(raw.substr(0, head_end), "\r\n");
  HttpResponse r;
  std::vector<absl::string_view> status = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status.size() < 2 || status[0] != "HTTP/1.1" || !absl::SimpleAtoi(status[1], &r.status)) {
    return absl::InvalidArgumentError(absl::StrCat("bad status line: ", lines[0]));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("bad header: ", lines[i]));
    }
    r.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  r.body = std::string(raw.substr(head_end + 4));
  size_t length;
  if (!r.headers.count("content-length") ||
      !absl::SimpleAtoi(r.headers["content-length"], &length) || length != r.body.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("body of ", r.body.size(), " bytes does not match Content-Length"));
  }
  return r;
}

absl::StatusOr<HttpResponse> HttpGet(int port, absl::string_view path, absl::Duration timeout) {
  absl::StatusOr<std::string> raw =
      SendRaw(port,
              absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1:", port,
                           "\r\nUser-Agent: ps-test\r\nAccept: */*\r\n\r\n"),
              timeout);
  if (!raw.ok()) return raw.status();
  return ParseResponse(*raw);
}

}  // namespace ps::common::metrics::testing
