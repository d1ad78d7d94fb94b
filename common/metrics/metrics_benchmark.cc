// What a metric update costs on the hot path, alone and from several threads at once, and
// what a scrape costs.
//
//   bazel run //common/metrics:metrics_benchmark -- --benchmark_min_time=0.2
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "common/metrics/metrics.h"

namespace ps::common::metrics {
namespace {

void BM_CounterIncrement(benchmark::State& state) {
  static Registry* registry = new Registry;
  static Counter* counter = registry->AddCounter("bench_counter_total", "c");
  for (auto _ : state) counter->Increment();
}
BENCHMARK(BM_CounterIncrement)->ThreadRange(1, 4)->UseRealTime();

void BM_HistogramObserve(benchmark::State& state) {
  static Registry* registry = new Registry;
  static Histogram* histogram =
      registry->AddHistogram("bench_latency_seconds", "h", LatencyBuckets());
  double v = 0.0001;
  for (auto _ : state) {
    histogram->Observe(v);
    v = v < 10 ? v * 1.7 : 0.0001;
  }
}
BENCHMARK(BM_HistogramObserve)->ThreadRange(1, 4)->UseRealTime();

// What the server's service adds to one push: two clock reads, a histogram observation and
// three counter adds.
void BM_RequestInstrumentation(benchmark::State& state) {
  static Registry* registry = new Registry;
  static Histogram* latency = registry->AddHistogram("bench_push_seconds", "h", LatencyBuckets());
  static Counter* in = registry->AddCounter("bench_in_total", "c");
  static Counter* out = registry->AddCounter("bench_out_total", "c");
  static Counter* ok = registry->AddCounter("bench_ok_total", "c");
  for (auto _ : state) {
    const absl::Time arrived = absl::Now();
    latency->Observe(absl::ToDoubleSeconds(absl::Now() - arrived));
    in->Increment(4096);
    out->Increment(8);
    ok->Increment();
  }
}
BENCHMARK(BM_RequestInstrumentation)->ThreadRange(1, 4)->UseRealTime();

// A scrape of a registry about the size of a server's: 40 families, 4 histograms, 64
// labelled children.
void BM_Render(benchmark::State& state) {
  Registry registry;
  for (int i = 0; i < 32; ++i) {
    registry.AddCounter(absl::StrCat("bench_c", i, "_total"), "A counter.")->Increment(i);
  }
  for (int i = 0; i < 4; ++i) {
    registry.AddHistogram(absl::StrCat("bench_h", i, "_seconds"), "A histogram.",
                          LatencyBuckets())
        ->Observe(0.01 * i);
  }
  Family<Gauge>* family = registry.AddGaugeFamily("bench_rows", "Rows.", {"table"});
  for (int i = 0; i < 64; ++i) family->WithLabels({absl::StrCat("table", i)})->Set(i * 1000);
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = registry.Render();
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_Render);

}  // namespace
}  // namespace ps::common::metrics

BENCHMARK_MAIN();
