// The exposition text of each metric type, exactly; label escaping; bucket counts;
// collectors; concurrent updates.
#include "common/metrics/metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Registry, CounterTextIsExact) {
  Registry r;
  Counter* c = r.AddCounter("ps_test_events_total", "Events seen.");
  c->Increment();
  c->Increment(41);
  EXPECT_EQ(c->value(), 42u);
  EXPECT_EQ(r.Render(),
            "# HELP ps_test_events_total Events seen.\n"
            "# TYPE ps_test_events_total counter\n"
            "ps_test_events_total 42\n");
}

TEST(Registry, GaugeTextIsExact) {
  Registry r;
  Gauge* g = r.AddGauge("ps_test_loss", "Last loss.");
  g->Set(0.25);
  g->Add(-1);
  EXPECT_EQ(r.Render(),
            "# HELP ps_test_loss Last loss.\n"
            "# TYPE ps_test_loss gauge\n"
            "ps_test_loss -0.75\n");
}

TEST(Registry, LabelledFamiliesAreSortedByLabelValues) {
  Registry r;
  Family<Counter>* f =
      r.AddCounterFamily("ps_test_refused_total", "Refused.", {"method", "reason"});
  f->WithLabels({"push", "nonfinite"})->Increment(3);
  f->WithLabels({"pull", "unknown_table"})->Increment();
  EXPECT_EQ(f->WithLabels({"push", "nonfinite"}), f->WithLabels({"push", "nonfinite"}));
  EXPECT_EQ(r.Render(),
            "# HELP ps_test_refused_total Refused.\n"
            "# TYPE ps_test_refused_total counter\n"
            "ps_test_refused_total{method=\"pull\",reason=\"unknown_table\"} 1\n"
            "ps_test_refused_total{method=\"push\",reason=\"nonfinite\"} 3\n");
}

TEST(Registry, LabelValuesAndHelpAreEscaped) {
  Registry r;
  Family<Gauge>* f =
      r.AddGaugeFamily("ps_test_rows", "Rows per table\\part\nsecond line.", {"table"});
  f->WithLabels({"a\"b\\c\nd"})->Set(7);
  EXPECT_EQ(r.Render(),
            "# HELP ps_test_rows Rows per table\\\\part\\nsecond line.\n"
            "# TYPE ps_test_rows gauge\n"
            "ps_test_rows{table=\"a\\\"b\\\\c\\nd\"} 7\n");
  auto parsed = testing::ParseText(r.Render());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("ps_test_rows", {{"table", "a\"b\\c\nd"}}), 7);
  EXPECT_EQ(parsed->help.at("ps_test_rows"), "Rows per table\\part\nsecond line.");
}

TEST(Registry, HistogramTextIsExact) {
  Registry r;
  Histogram* h = r.AddHistogram("ps_test_latency_seconds", "Latency.", {0.001, 0.01, 0.1});
  h->Observe(0.0005);
  h->Observe(0.001);  // upper bounds are inclusive
  h->Observe(0.05);
  h->Observe(3);
  EXPECT_EQ(r.Render(),
            "# HELP ps_test_latency_seconds Latency.\n"
            "# TYPE ps_test_latency_seconds histogram\n"
            "ps_test_latency_seconds_bucket{le=\"0.001\"} 2\n"
            "ps_test_latency_seconds_bucket{le=\"0.01\"} 2\n"
            "ps_test_latency_seconds_bucket{le=\"0.1\"} 3\n"
            "ps_test_latency_seconds_bucket{le=\"+Inf\"} 4\n"
            "ps_test_latency_seconds_sum 3.0515\n"
            "ps_test_latency_seconds_count 4\n");
}

TEST(Registry, LabelledHistogramPutsLeLast) {
  Registry r;
  Family<Histogram>* f =
      r.AddHistogramFamily("ps_test_step_seconds", "Step phases.", {"phase"}, {1, 2});
  f->WithLabels({"pull"})->Observe(1.5);
  EXPECT_EQ(r.Render(),
            "# HELP ps_test_step_seconds Step phases.\n"
            "# TYPE ps_test_step_seconds histogram\n"
            "ps_test_step_seconds_bucket{phase=\"pull\",le=\"1\"} 0\n"
            "ps_test_step_seconds_bucket{phase=\"pull\",le=\"2\"} 1\n"
            "ps_test_step_seconds_bucket{phase=\"pull\",le=\"+Inf\"} 1\n"
            "ps_test_step_seconds_sum{phase=\"pull\"} 1.5\n"
            "ps_test_step_seconds_count{phase=\"pull\"} 1\n");
}

TEST(Histogram, CountsEachObservationInItsBucket) {
  Histogram h(LatencyBuckets());
  const std::vector<double> values = {0, 0.0001, 0.0002, 0.003, 0.003, 0.7, 59, 61, 1e9};
  for (double v : values) h.Observe(v);
  const Histogram::Snapshot s = h.Read();
  ASSERT_EQ(s.cumulative.size(), s.bounds.size() + 1);
  for (size_t i = 0; i < s.bounds.size(); ++i) {
    uint64_t expected = 0;
    for (double v : values) expected += v <= s.bounds[i];
    EXPECT_EQ(s.cumulative[i], expected) << "le " << s.bounds[i];
  }
  EXPECT_EQ(s.count(), values.size());
  double sum = 0;
  for (double v : values) sum += v;
  EXPECT_DOUBLE_EQ(s.sum, sum);
}

TEST(Histogram, ExponentialBucketsGrowByTheFactor) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  const std::vector<double> latency = LatencyBuckets();
  EXPECT_EQ(latency.front(), 0.0001);
  EXPECT_EQ(latency.back(), 60);
}

TEST(FormatValue, WritesIntegersSpecialsAndShortestDecimals) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-0.0), "0");
  EXPECT_EQ(FormatValue(12345678), "12345678");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(0.00025), "0.00025");
  EXPECT_EQ(FormatValue(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
}

TEST(Names, FollowThePrometheusRules) {
  EXPECT_TRUE(IsValidMetricName("ps_server_up"));
  EXPECT_TRUE(IsValidMetricName("job:rate5m"));
  EXPECT_FALSE(IsValidMetricName("1abc"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_TRUE(IsValidLabelName("table"));
  EXPECT_FALSE(IsValidLabelName("__name"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
}

TEST(Registry, CollectorsRenderAtScrapeTimeUntilTheirHandleIsGone) {
  Registry r;
  r.AddCounter("ps_test_first_total", "Registered first.");
  double rows = 5;
  CollectorHandle h = r.AddCollector([&rows](std::vector<CollectedFamily>* out) {
    CollectedFamily f;
    f.name = "ps_test_table_rows";
    f.help = "Rows.";
    f.type = MetricType::kGauge;
    f.label_names = {"table"};
    f.samples.push_back(Sample{{"emb"}, rows});
    out->push_back(std::move(f));
  });
  CollectorHandle age = r.AddGaugeCallback("ps_test_age_seconds", "Age.", [] { return 1.5; });
  rows = 9;
  EXPECT_EQ(r.Render(),
            "# HELP ps_test_first_total Registered first.\n"
            "# TYPE ps_test_first_total counter\n"
            "ps_test_first_total 0\n"
            "# HELP ps_test_table_rows Rows.\n"
            "# TYPE ps_test_table_rows gauge\n"
            "ps_test_table_rows{table=\"emb\"} 9\n"
            "# HELP ps_test_age_seconds Age.\n"
            "# TYPE ps_test_age_seconds gauge\n"
            "ps_test_age_seconds 1.5\n");
  h.Reset();
  CollectorHandle moved = std::move(age);
  EXPECT_THAT(r.Render(), Not(HasSubstr("ps_test_table_rows")));
  EXPECT_THAT(r.Render(), HasSubstr("ps_test_age_seconds 1.5"));
}

TEST(Registry, InvalidOrDuplicateCollectedFamiliesAreLeftOut) {
  Registry r;
  r.AddGauge("ps_test_taken", "Registered.");
  CollectorHandle h = r.AddCollector([](std::vector<CollectedFamily>* out) {
    for (const char* name : {"ps_test_taken", "bad-name", "ps_test_fine"}) {
      CollectedFamily f;
      f.name = name;
      f.samples.push_back(Sample{{}, 1});
      out->push_back(std::move(f));
    }
  });
  auto parsed = testing::ParseText(r.Render());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("ps_test_taken"), 0);
  EXPECT_EQ(parsed->Get("ps_test_fine"), 1);
}

TEST(Registry, ProcessMetricsParse) {
  Registry r;
  CollectorHandle h = RegisterProcessMetrics(&r);
  auto parsed = testing::ParseText(r.Render());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_GT(parsed->Get("process_resident_memory_bytes").value_or(0), 0);
  EXPECT_GT(parsed->Get("process_open_fds").value_or(0), 0);
  EXPECT_GE(parsed->Get("process_threads").value_or(0), 1);
}

TEST(Registry, ConcurrentUpdatesSumExactly) {
  Registry r;
  Counter* c = r.AddCounter("ps_test_n_total", "n");
  Gauge* g = r.AddGauge("ps_test_g", "g");
  Histogram* h = r.AddHistogram("ps_test_h", "h", {0.5});
  Family<Counter>* f = r.AddCounterFamily("ps_test_f_total", "f", {"k"});
  constexpr int kThreads = 8;
  constexpr int kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter* mine = f->WithLabels({t % 2 == 0 ? "even" : "odd"});
      for (int i = 0; i < kEach; ++i) {
        c->Increment();
        g->Add(1);
        h->Observe(i % 2 == 0 ? 0.25 : 1.0);
        mine->Increment();
        if (i % 5000 == 0) (void)r.Render();  // scrapes while updating
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->value(), uint64_t{kThreads} * kEach);
  EXPECT_EQ(g->value(), double{kThreads} * kEach);
  const Histogram::Snapshot s = h->Read();
  EXPECT_EQ(s.cumulative[0], uint64_t{kThreads} * kEach / 2);
  EXPECT_EQ(s.count(), uint64_t{kThreads} * kEach);
  EXPECT_EQ(s.sum, kThreads * (kEach / 2) * 1.25);
  EXPECT_EQ(f->WithLabels({"even"})->value() + f->WithLabels({"odd"})->value(),
            uint64_t{kThreads} * kEach);
  auto parsed = testing::ParseText(r.Render());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("ps_test_h_count"), kThreads * kEach);
}

TEST(RegistryDeathTest, DuplicateNamesAndBadLabelsAreProgrammerErrors) {
  Registry r;
  r.AddCounter("ps_test_once_total", "x");
  EXPECT_DEATH(r.AddGauge("ps_test_once_total", "x"), "registered twice");
  EXPECT_DEATH(r.AddHistogramFamily("ps_test_h2", "x", {"le"}, {1}), "reserved");
  EXPECT_DEATH(r.AddCounterFamily("ps_test_c2_total", "x", {"bad label"}), "invalid label");
  EXPECT_DEATH(r.AddHistogram("ps_test_h3", "x", {2, 1}), "must increase");
}

TEST(ParseText, RefusesMalformedText) {
  EXPECT_FALSE(testing::ParseText("x 1\n").ok());  // no TYPE
  EXPECT_FALSE(testing::ParseText("# TYPE x gauge\nx{a=\"1} 1\n").ok());
  EXPECT_FALSE(testing::ParseText("# TYPE x gauge\nx 1\nx 2\n").ok());
  EXPECT_FALSE(testing::ParseText("# TYPE x gauge\nx one\n").ok());
  EXPECT_FALSE(testing::ParseText("# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                                  "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n")
                   .ok());
  EXPECT_TRUE(testing::ParseText("# TYPE x gauge\nx{a=\"q\\\"\"} 1 1700000000000\n").ok());
}

}  // namespace
}  // namespace ps::common::metrics
