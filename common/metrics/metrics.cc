#include "common/metrics/metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "glog/logging.h"

namespace ps::common::metrics {
namespace {

// std::atomic<double> has no fetch_add before C++20.
void AtomicAdd(std::atomic<double>* target, double delta) {
  double old = target->load(std::memory_order_relaxed);
  while (!target->compare_exchange_weak(old, old + delta, std::memory_order_relaxed)) {
  }
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void AppendHeader(absl::string_view name, absl::string_view help, MetricType type,
                  std::string* out) {
  absl::StrAppend(out, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ",
                  TypeName(type), "\n");
}

// `{a="x",b="y"}`, with an extra last label (histograms' "le") when `extra_name` is set;
// nothing at all for no labels.
void AppendLabels(const std::vector<std::string>& names, const std::vector<std::string>& values,
                  absl::string_view extra_name, absl::string_view extra_value, std::string* out) {
  if (names.empty() && extra_name.empty()) return;
  out->push_back('{');
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out->push_back(',');
    absl::StrAppend(out, names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out->push_back(',');
    absl::StrAppend(out, extra_name, "=\"", extra_value, "\"");
  }
  out->push_back('}');
}

void AppendLine(absl::string_view name, const std::vector<std::string>& names,
                const std::vector<std::string>& values, absl::string_view value, std::string* out) {
  out->append(name.data(), name.size());
  AppendLabels(names, values, "", "", out);
  absl::StrAppend(out, " ", value, "\n");
}

void CheckBounds(const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    CHECK(std::isfinite(bounds[i])) << "histogram bound " << bounds[i];
    CHECK(i == 0 || bounds[i - 1] < bounds[i]) << "histogram bounds must increase";
  }
}

bool ValidNameChar(char c, bool first, bool colon) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' || (colon && c == ':') ||
         (!first && absl::ascii_isdigit(static_cast<unsigned char>(c)));
}

}  // namespace

// ---- Values and names ---------------------------------------------------------------------

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", value == 0 ? 0.0 : value);  // no "-0"
    return buf;
  }
  char buf[32];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  return buf;
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

bool IsValidMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!ValidNameChar(name[i], i == 0, /*colon=*/true)) return false;
  }
  return true;
}

bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || absl::StartsWith(name, "__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!ValidNameChar(name[i], i == 0, /*colon=*/false)) return false;
  }
  return true;
}

// ---- Gauge, Histogram ---------------------------------------------------------------------

void Gauge::Add(double delta) { AtomicAdd(&value_, delta); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  CheckBounds(bounds_);
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // Upper bounds are inclusive: the first bound >= value.
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_, value);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  CHECK_GT(start, 0);
  CHECK_GT(factor, 1);
  std::vector<double> bounds;
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) bounds.push_back(b);
  return bounds;
}

std::vector<double> LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
}

// ---- Families -----------------------------------------------------------------------------

namespace internal {

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {}

void CheckLabelCount(const std::string& family, size_t names, size_t values) {
  CHECK_EQ(names, values) << "metric " << family << ": " << names << " label names, " << values
                          << " values";
}

void AppendChild(const std::string& name, const std::vector<std::string>& label_names,
                 const std::vector<std::string>& label_values, const Counter& c, std::string* out) {
  AppendLine(name, label_names, label_values, absl::StrCat(c.value()), out);
}

void AppendChild(const std::string& name, const std::vector<std::string>& label_names,
                 const std::vector<std::string>& label_values, const Gauge& g, std::string* out) {
  AppendLine(name, label_names, label_values, FormatValue(g.value()), out);
}

void AppendChild(const std::string& name, const std::vector<std::string>& label_names,
                 const std::vector<std::string>& label_values, const Histogram& h,
                 std::string* out) {
  const Histogram::Snapshot s = h.Read();
  const std::string bucket = absl::StrCat(name, "_bucket");
  for (size_t i = 0; i <= s.bounds.size(); ++i) {
    out->append(bucket);
    AppendLabels(label_names, label_values, "le",
                 i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf", out);
    absl::StrAppend(out, " ", s.cumulative[i], "\n");
  }
  AppendLine(absl::StrCat(name, "_sum"), label_names, label_values, FormatValue(s.sum), out);
  AppendLine(absl::StrCat(name, "_count"), label_names, label_values, absl::StrCat(s.count()), out);
}

}  // namespace internal

// ---- Registry -----------------------------------------------------------------------------

Registry::~Registry() {
  absl::MutexLock lock(&mu_);
  CHECK(collectors_.empty()) << "a CollectorHandle outlives its Registry";
}

template <typename T>
Family<T>* Registry::AddFamily(absl::string_view name, absl::string_view help, MetricType type,
                               std::vector<std::string> label_names,
                               std::function<std::unique_ptr<T>()> make) {
  CHECK(IsValidMetricName(name)) << "invalid metric name '" << name << "'";
  for (const std::string& label : label_names) {
    CHECK(IsValidLabelName(label)) << "metric " << name << ": invalid label name '" << label << "'";
    CHECK(type != MetricType::kHistogram || label != "le")
        << "histogram " << name << ": the label 'le' is reserved";
  }
  auto family = std::make_unique<Family<T>>(std::string(name), std::string(help), type,
                                            std::move(label_names), std::move(make));
  Family<T>* raw = family.get();
  absl::MutexLock lock(&mu_);
  for (const auto& f : families_) {
    CHECK(f->name() != name) << "metric " << name << " registered twice";
  }
  families_.push_back(std::move(family));
  return raw;
}

Counter* Registry::AddCounter(absl::string_view name, absl::string_view help) {
  return AddCounterFamily(name, help, {})->WithLabels({});
}

Gauge* Registry::AddGauge(absl::string_view name, absl::string_view help) {
  return AddGaugeFamily(name, help, {})->WithLabels({});
}

Histogram* Registry::AddHistogram(absl::string_view name, absl::string_view help,
                                  std::vector<double> bounds) {
  return AddHistogramFamily(name, help, {}, std::move(bounds))->WithLabels({});
}

Family<Counter>* Registry::AddCounterFamily(absl::string_view name, absl::string_view help,
                                            std::vector<std::string> label_names) {
  return AddFamily<Counter>(name, help, MetricType::kCounter, std::move(label_names),
                            [] { return std::make_unique<Counter>(); });
}

Family<Gauge>* Registry::AddGaugeFamily(absl::string_view name, absl::string_view help,
                                        std::vector<std::string> label_names) {
  return AddFamily<Gauge>(name, help, MetricType::kGauge, std::move(label_names),
                          [] { return std::make_unique<Gauge>(); });
}

Family<Histogram>* Registry::AddHistogramFamily(absl::string_view name, absl::string_view help,
                                                std::vector<std::string> label_names,
                                                std::vector<double> bounds) {
  CheckBounds(bounds);  // at registration rather than at the first observation
  return AddFamily<Histogram>(
      name, help, MetricType::kHistogram, std::move(label_names),
      [bounds = std::move(bounds)] { return std::make_unique<Histogram>(bounds); });
}

CollectorHandle Registry::AddCollector(Collector collector) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_collector_id_++;
  collectors_.emplace(id, std::move(collector));
  return CollectorHandle(this, id);
}

CollectorHandle Registry::AddGaugeCallback(absl::string_view name, absl::string_view help,
                                           std::function<double()> value) {
  return AddCollector([name = std::string(name), help = std::string(help),
                       value = std::move(value)](std::vector<CollectedFamily>* out) {
    CollectedFamily f;
    f.name = name;
    f.help = help;
    f.type = MetricType::kGauge;
    f.samples.push_back(Sample{{}, value()});
    out->push_back(std::move(f));
  });
}

void Registry::RemoveCollector(uint64_t id) {
  absl::MutexLock lock(&mu_);
  collectors_.erase(id);
}

std::string Registry::Render() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  absl::flat_hash_set<std::string> seen;
  for (const auto& f : families_) {
    AppendHeader(f->name(), f->help(), f->type(), &out);
    f->AppendSamples(&out);
    seen.insert(f->name());
  }
  std::vector<CollectedFamily> collected;
  for (const auto& [id, collector] : collectors_) collector(&collected);
  for (const CollectedFamily& f : collected) {
    // A collector's mistake must not break the whole scrape: skip the family and say so.
    bool ok =
        IsValidMetricName(f.name) && f.type != MetricType::kHistogram && seen.insert(f.name).second;
    for (const std::string& label : f.label_names) ok = ok && IsValidLabelName(label);
    for (const Sample& s : f.samples) ok = ok && s.label_values.size() == f.label_names.size();
    if (!ok) {
      LOG_EVERY_N(ERROR, 100) << "metrics: collected family '" << f.name
                              << "' is invalid or a duplicate; left out";
      continue;
    }
    AppendHeader(f.name, f.help, f.type, &out);
    for (const Sample& s : f.samples) {
      AppendLine(f.name, f.label_names, s.label_values, FormatValue(s.value), &out);
    }
  }
  return out;
}

// ---- CollectorHandle ----------------------------------------------------------------------

CollectorHandle::CollectorHandle(CollectorHandle&& other) noexcept
    : registry_(other.registry_), id_(other.id_) {
  other.registry_ = nullptr;
}

CollectorHandle& CollectorHandle::operator=(CollectorHandle&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = other.registry_;
    id_ = other.id_;
    other.registry_ = nullptr;
  }
  return *this;
}

void CollectorHandle::Reset() {
  if (registry_ != nullptr) registry_->RemoveCollector(id_);
  registry_ = nullptr;
}

// ---- process_* ----------------------------------------------------------------------------

namespace {

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Fields of /proc/self/stat after the command name (which may hold spaces): index 0 is the
// state, field N of proc(5) is index N - 3.
std::vector<std::string> StatFields() {
  const std::string stat = ReadFile("/proc/self/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 > stat.size()) return {};
  return absl::StrSplit(absl::string_view(stat).substr(close + 2), ' ', absl::SkipEmpty());
}

double BootTimeSeconds() {
  for (absl::string_view line : absl::StrSplit(ReadFile("/proc/stat"), '\n')) {
    if (absl::ConsumePrefix(&line, "btime ")) {
      double t = 0;
      if (absl::SimpleAtod(line, &t)) return t;
    }
  }
  return -1;
}

int CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the descriptor of `dir` itself
}

void AddOne(std::vector<CollectedFamily>* out, const char* name, const char* help, MetricType type,
            double value) {
  CollectedFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  f.samples.push_back(Sample{{}, value});
  out->push_back(std::move(f));
}

}  // namespace

CollectorHandle RegisterProcessMetrics(Registry* registry) {
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const double boot = BootTimeSeconds();
  return registry->AddCollector([ticks, page, boot](std::vector<CollectedFamily>* out) {
    const std::vector<std::string> f = StatFields();
    double utime, stime, threads, start, vsize, rss;
    // proc(5): utime 14, stime 15, num_threads 20, starttime 22, vsize 23, rss 24.
    if (f.size() > 21 && ticks > 0 && absl::SimpleAtod(f[11], &utime) &&
        absl::SimpleAtod(f[12], &stime) && absl::SimpleAtod(f[17], &threads) &&
        absl::SimpleAtod(f[19], &start) && absl::SimpleAtod(f[20], &vsize) &&
        absl::SimpleAtod(f[21], &rss)) {
      AddOne(out, "process_cpu_seconds_total", "User and system CPU time spent, seconds.",
             MetricType::kCounter, (utime + stime) / ticks);
      AddOne(out, "process_resident_memory_bytes", "Resident memory size, bytes.",
             MetricType::kGauge, rss * page);
      AddOne(out, "process_virtual_memory_bytes", "Virtual memory size, bytes.", MetricType::kGauge,
             vsize);
      AddOne(out, "process_threads", "Threads of the process.", MetricType::kGauge, threads);
      if (boot >= 0) {
        AddOne(out, "process_start_time_seconds",
               "Start time of the process since the Unix epoch, seconds.", MetricType::kGauge,
               boot + start / ticks);
      }
    }
    const int fds = CountOpenFds();
    if (fds >= 0) {
      AddOne(out, "process_open_fds", "Open file descriptors.", MetricType::kGauge, fds);
    }
  });
}

}  // namespace ps::common::metrics
