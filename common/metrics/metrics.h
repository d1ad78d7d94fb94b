// Process metrics in the Prometheus text exposition format, version 0.0.4.
//
//   metrics::Registry registry;
//   metrics::Counter* pushes = registry.AddCounter("ps_server_pushes_total", "Pushes applied.");
//   metrics::Family<metrics::Counter>* refused = registry.AddCounterFamily(
//       "ps_server_requests_refused_total", "Refused requests.", {"method", "reason"});
//   metrics::Histogram* latency = registry.AddHistogram(
//       "ps_server_push_latency_seconds", "Push latency.", metrics::LatencyBuckets());
//   pushes->Increment();
//   refused->WithLabels({"push", "nonfinite"})->Increment();
//   latency->Observe(0.0012);
//   std::string text = registry.Render();  // what GET /metrics returns
//
// Hot path. Counter::Increment, Gauge::Set and Histogram::Observe are a few relaxed atomic
// operations each: no lock, no allocation. Family::WithLabels takes the family's mutex and
// may allocate; code on a hot path looks a labelled child up once and keeps the pointer
// (children live as long as the registry).
//
// Scrape time. Values that already live elsewhere (rows per table, clocks of workers, the size
// of a database) are not mirrored into metrics; a Collector reads them when the registry
// renders. A collector is registered with AddCollector and removed when the returned
// CollectorHandle is destroyed, which waits for a render in progress: an object that owns
// the handle of a collector reading it can be destroyed safely while the endpoint serves.
//
// Names. Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*
// and do not start with "__"; histograms may not use the label "le". Names are constants of
// the program, so a bad or duplicate name is a programmer error (CHECK), not a Status.
#ifndef PS_COMMON_METRICS_METRICS_H_
#define PS_COMMON_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace ps::common::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// A monotonically increasing integer count (events, bytes). Thread-safe and lock-free.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  void Increment(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down (a loss, a clock, a flag). Thread-safe and lock-free.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Counts observations into fixed buckets. Thread-safe and lock-free: Observe is one atomic
// add on the bucket and one compare-and-swap loop on the sum.
class Histogram {
 public:
  // `bounds` are the buckets' upper bounds (inclusive). REQUIRES: strictly increasing,
  // finite; the +Inf bucket is implicit.
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf; the last one is the count
    double sum = 0;
    uint64_t count() const { return cumulative.back(); }
  };
  // Counts read one by one while observations may go on: each is exact at some moment, and
  // the cumulative counts never decrease.
  Snapshot Read() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  // buckets_[i]: observations in (bounds_[i-1], bounds_[i]]; the last one is (last, +Inf).
  const std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0};
};

// Bucket bounds: start, start*factor, ... (count of them). REQUIRES: start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// Seconds from 100 us to 60 s in 1-2.5-5 steps: request, step and checkpoint durations.
std::vector<double> LatencyBuckets();

namespace internal {

// What every family of metrics has; the registry renders families through this.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names);
  virtual ~FamilyBase() = default;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Appends the family's samples (no HELP/TYPE lines) in the text format.
  virtual void AppendSamples(std::string* out) const = 0;

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
};

}  // namespace internal

// The metrics of one name, one per combination of label values. Thread-safe. Children are
// created on first use and live as long as the family (the registry).
template <typename T>
class Family final : public internal::FamilyBase {
 public:
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::function<std::unique_ptr<T>()> make)
      : FamilyBase(std::move(name), std::move(help), type, std::move(label_names)),
        make_(std::move(make)) {}

  // The child with these label values (in the order of the family's label names).
  // REQUIRES: as many values as label names.
  T* WithLabels(const std::vector<std::string>& values);

  void AppendSamples(std::string* out) const override;

 private:
  const std::function<std::unique_ptr<T>()> make_;
  mutable absl::Mutex mu_;
  // Ordered, so that the text comes out the same way every time.
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

// One sample reported by a collector: label values (in the order of the family's label
// names) and the value.
struct Sample {
  std::vector<std::string> label_values;
  double value = 0;
};

// A counter or gauge family reported by a collector at scrape time.
struct CollectedFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;  // kCounter or kGauge
  std::vector<std::string> label_names;
  std::vector<Sample> samples;
};

// Appends families read at scrape time. Called on the thread that renders, with the
// registry's lock held: it must not call into the registry, and it must be quick.
using Collector = std::function<void(std::vector<CollectedFamily>* out)>;

class Registry;

// Keeps a collector registered; destroying it (or Reset) removes the collector, waiting for
// a render that is calling it. Movable, thread-compatible.
class [[nodiscard]] CollectorHandle {
 public:
  CollectorHandle() = default;
  CollectorHandle(CollectorHandle&& other) noexcept;
  CollectorHandle& operator=(CollectorHandle&& other) noexcept;
  ~CollectorHandle() { Reset(); }
  void Reset();

 private:
  friend class Registry;
  CollectorHandle(Registry* registry, uint64_t id) : registry_(registry), id_(id) {}
  Registry* registry_ = nullptr;  // Not owned.
  uint64_t id_ = 0;
};

// Owns the process's metrics and renders them. Thread-safe. Must outlive every metric
// pointer it handed out and every CollectorHandle.
class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  ~Registry();

  // Unlabelled metrics (the family's only child).
  Counter* AddCounter(absl::string_view name, absl::string_view help);
  Gauge* AddGauge(absl::string_view name, absl::string_view help);
  Histogram* AddHistogram(absl::string_view name, absl::string_view help,
                          std::vector<double> bounds);

  // Labelled families.
  Family<Counter>* AddCounterFamily(absl::string_view name, absl::string_view help,
                                    std::vector<std::string> label_names);
  Family<Gauge>* AddGaugeFamily(absl::string_view name, absl::string_view help,
                                std::vector<std::string> label_names);
  Family<Histogram>* AddHistogramFamily(absl::string_view name, absl::string_view help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds);

  // Families computed at scrape time (see Collector). Their names are checked when they are
  // rendered: a collected family whose name is invalid or already rendered is skipped.
  CollectorHandle AddCollector(Collector collector);
  // One unlabelled gauge evaluated at scrape time.
  CollectorHandle AddGaugeCallback(absl::string_view name, absl::string_view help,
                                   std::function<double()> value);

  // Every family in the text format 0.0.4: registered families in registration order, then
  // the collectors' families in registration order. Each family has its HELP and TYPE lines.
  std::string Render() const;

 private:
  friend class CollectorHandle;
  template <typename T>
  Family<T>* AddFamily(absl::string_view name, absl::string_view help, MetricType type,
                       std::vector<std::string> label_names,
                       std::function<std::unique_ptr<T>()> make);
  void RemoveCollector(uint64_t id);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<internal::FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Collector> collectors_ ABSL_GUARDED_BY(mu_);
  uint64_t next_collector_id_ ABSL_GUARDED_BY(mu_) = 1;
};

// Registers the process_* families every Prometheus client library exports (resident and
// virtual memory, CPU seconds, start time, open file descriptors, threads), read from /proc
// at scrape time. Families /proc cannot answer are left out.
CollectorHandle RegisterProcessMetrics(Registry* registry);

// ---- The text format (exposed for collectors and tests) ----------------------------------

// A sample value: integers without a fraction, "+Inf", "-Inf", "NaN", otherwise the shortest
// decimal that reads back as the same double.
std::string FormatValue(double value);
// HELP text with '\' and newline escaped.
std::string EscapeHelp(absl::string_view help);
// A label value with '\', '"' and newline escaped.
std::string EscapeLabelValue(absl::string_view value);
bool IsValidMetricName(absl::string_view name);
bool IsValidLabelName(absl::string_view name);

// ---- Family<T> ---------------------------------------------------------------------------

namespace internal {
// Appends `name{labels} value` lines for one child.
void AppendChild(const std::string& name, const std::vector<std::string>& label_names,
                 const std::vector<std::string>& label_values, const Counter& c, std::string* out);
void AppendChild(const std::string& name, const std::vector<std::string>& label_names,
                 const std::vector<std::string>& label_values, const Gauge& g, std::string* out);
void AppendChild(const std::string& name, const std::vector<std::string>& label_names,
                 const std::vector<std::string>& label_values, const Histogram& h,
                 std::string* out);
void CheckLabelCount(const std::string& family, size_t names, size_t values);
}  // namespace internal

template <typename T>
T* Family<T>::WithLabels(const std::vector<std::string>& values) {
  internal::CheckLabelCount(name(), label_names().size(), values.size());
  absl::MutexLock lock(&mu_);
  std::unique_ptr<T>& child = children_[values];
  if (child == nullptr) child = make_();
  return child.get();
}

template <typename T>
void Family<T>::AppendSamples(std::string* out) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [values, child] : children_) {
    internal::AppendChild(name(), label_names(), values, *child, out);
  }
}

}  // namespace ps::common::metrics

#endif  // PS_COMMON_METRICS_METRICS_H_
