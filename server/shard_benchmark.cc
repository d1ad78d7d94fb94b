// The optimizer step of one large dense push on a shard, with and without helper threads
// (ShardOptions::apply_threads): a 64 MB Adam table in 1 MB blocks, every block pushed at once.
// And the shard's side of a sparse pull and push of 10k uniform keys out of 1M rows of dim 16
// (SGD), as ps_bench's sparse rows: the server's cost per key without the wire.
//
//   bazel run -c opt //server:shard_benchmark
//
// BM_AdamPush64MB/0 and /1 report gradient bytes applied per second by 1 thread and by the
// parallel apply. On a shared machine their ratio moves with the load between the two rows, so
// the Pair rows alternate the two within each iteration and report the median of the per-pair
// ratios ("speedup"), with each side's median time (ms_1, ms_2) and memory traffic (GBps_1,
// GBps_2); the push's row also runs the Adam-shaped stream below with 1 and 2 threads in each
// iteration ("ceiling": its speedup under the same load; "speedup_2c": the push's median speedup
// over the n_2c iterations where that stream ran >= 1.5x faster with 2 threads, i.e. where the
// machine lent this process two cores and the memory bandwidth to feed them). The same is done
// for what bounds that ratio: the machine's memory bandwidth with 1 and 2 threads (STREAM's
// triad; a stream with Adam's traffic: read g, read and write w, m, v, trivial arithmetic), the
// Adam kernel alone and the finite check alone, over 64 MB of values laid out as the shard lays
// out the push's table (StreamArrays), the 2-thread side split as the shard splits a push
// (common::ThreadPool::ParallelFor). GB/s count the bytes each element reads and writes (triad
// 12, Adam 28, check 4), as STREAM does: write-allocate reads are not counted.
#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "common/codec.h"
#include "common/config/config.h"
#include "common/startup/cores.h"
#include "common/thread_pool.h"
#include "kernels/optimizer.h"
#include "server/shard.h"

namespace ps::server {
namespace {

constexpr size_t kFloats = size_t{16} << 20;  // 64 MB
constexpr size_t kBlockFloats = size_t{1} << 18;  // 1 MB blocks

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Times (seconds) of the 1-thread and the parallel side of each iteration.
struct Pairs {
  std::vector<double> one, two;
  void Report(benchmark::State& state, double bytes) const {
    std::vector<double> ratio(one.size());
    for (size_t i = 0; i < one.size(); ++i) ratio[i] = one[i] / two[i];
    state.counters["ms_1"] = 1e3 * Median(one);
    state.counters["ms_2"] = 1e3 * Median(two);
    state.counters["GBps_1"] = bytes / Median(one) / 1e9;
    state.counters["GBps_2"] = bytes / Median(two) / 1e9;
    state.counters["speedup"] = Median(ratio);
  }
};

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

// ---- Memory bandwidth, the kernels alone.

// 64 MB of gradient, parameters and two slots, laid out as the shard lays out the push's
// table: per 1 MB block one allocation holding [parameters][slot 0][slot 1] (the shard's
// DenseTablePart::Block), and the gradient in one buffer of its own (the push's payload).
//
// Not four separate 64 MB vectors, as these rows once used: glibc maps each with mmap, so they
// lie 64 MB + 4 KB apart, and at that spacing this development VM's memory ran the four
// streams 2-5x slower on one thread than at 66 MB (Adam-shaped stream: 16 against 36-38 GB/s;
// 64 MB + 8 KB and 128 MB apart slower still: docs/lab/2026-12-03-stream-layout.md). That made
// one thread of the push look twice as fast as the stream that was to bound it, and the
// stream's 1.8-2x from two threads a ceiling that no layout the shard uses has.
struct StreamArrays {
  StreamArrays() : g(kFloats, 1e-3f) {
    for (size_t b = 0; b < kBlocks; ++b) {
      std::vector<float>& block = blocks.emplace_back(3 * kBlockFloats, 0.f);
      std::fill(block.begin(), block.begin() + kBlockFloats, 0.5f);
    }
  }
  const float* grad(size_t block) const { return g.data() + block * kBlockFloats; }
  float* w(size_t block) { return blocks[block].data(); }
  float* m(size_t block) { return blocks[block].data() + kBlockFloats; }
  float* v(size_t block) { return blocks[block].data() + 2 * kBlockFloats; }

  static constexpr size_t kBlocks = kFloats / kBlockFloats;
  std::vector<float> g;
  std::vector<std::vector<float>> blocks;
  int64_t step = 0;
};

// One pass over block `b` of the arrays.
using Pass = void (*)(StreamArrays& s, size_t b);

void TriadPass(StreamArrays& s, size_t blk) {
  float* __restrict a = s.w(blk);
  const float* __restrict b = s.m(blk);
  const float* __restrict c = s.grad(blk);
  for (size_t i = 0; i < kBlockFloats; ++i) a[i] = b[i] + 0.5f * c[i];
}

void AdamTrafficPass(StreamArrays& s, size_t blk) {
  const float* __restrict g = s.grad(blk);
  float* __restrict w = s.w(blk);
  float* __restrict m = s.m(blk);
  float* __restrict v = s.v(blk);
  for (size_t i = 0; i < kBlockFloats; ++i) {
    m[i] = 0.5f * m[i] + g[i];
    v[i] = 0.5f * v[i] + g[i];
    w[i] = 0.5f * w[i] + g[i];
  }
}

void AdamKernelPass(StreamArrays& s, size_t blk) {
  kernels::OptimizerParams p;
  p.kind = kernels::OptimizerKind::kAdam;
  float* slots[2] = {s.m(blk), s.v(blk)};
  kernels::ApplyOptimizer(p, s.step, absl::MakeSpan(s.w(blk), kBlockFloats),
                          absl::MakeConstSpan(s.grad(blk), kBlockFloats), slots);
}

void CheckPass(StreamArrays& s, size_t blk) {
  benchmark::DoNotOptimize(common::CountNonFinite(absl::MakeConstSpan(s.grad(blk), kBlockFloats)));
}

void BM_Pair(benchmark::State& state, Pass pass, double bytes_per_element) {
  static StreamArrays* arrays = new StreamArrays();
  StreamArrays& s = *arrays;
  common::ThreadPool pool(1);
  Pairs pairs;
  for (auto _ : state) {
    ++s.step;
    absl::Time t = absl::Now();
    for (size_t b = 0; b < StreamArrays::kBlocks; ++b) pass(s, b);
    pairs.one.push_back(Seconds(t));
    benchmark::ClobberMemory();
    ++s.step;
    t = absl::Now();
    pool.ParallelFor(StreamArrays::kBlocks, 1, [&](size_t b) { pass(s, b); });
    pairs.two.push_back(Seconds(t));
    benchmark::ClobberMemory();
    state.SetIterationTime(pairs.one.back() + pairs.two.back());
  }
  pairs.Report(state, bytes_per_element * kFloats);
}
BENCHMARK_CAPTURE(BM_Pair, Triad, TriadPass, 12.0)->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK_CAPTURE(BM_Pair, AdamTraffic, AdamTrafficPass, 28.0)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_Pair, AdamKernel, AdamKernelPass, 28.0)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_Pair, FiniteCheck, CheckPass, 4.0)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// ---- The shard's push: check, admission, apply.

// A shard with one Adam table of `floats` values in blocks of `block_floats` (a 64 MB table in
// 1 MB blocks unless said), and a push of all of it.
struct AdamPush {
  // `tune`, if given, sets the rest of the shard's options.
  absl::Status Init(int apply_threads, size_t floats = kFloats, size_t block_floats = kBlockFloats,
                    const std::function<void(ShardOptions*)>& tune = nullptr) {
    auto config = common::ParseJobConfigText(
        absl::StrCat("cluster { num_servers: 1 num_workers: 1 dense_block_floats: ", block_floats,
                     " }\n", "tables { name: \"w\" kind: TABLE_KIND_DENSE shape: ", floats,
                     " initializer { kind: ZEROS } optimizer { kind: ADAM } }\n"),
        "bench");
    if (!config.ok()) return config.status();
    ShardOptions options;
    options.apply_threads = apply_threads;
    if (tune) tune(&options);
    auto created = Shard::Create(*config, options);
    if (!created.ok()) return created.status();
    shard = *std::move(created);
    grad.assign(floats, 1e-3f);
    const common::TableInfo& info = *shard->partitioner().FindTable("w");
    table.table = "w";
    for (uint32_t b = 0; b < info.num_blocks; ++b) {
      auto [begin, end] = shard->partitioner().BlockRange(info, b);
      table.blocks.push_back({b, absl::string_view(reinterpret_cast<const char*>(grad.data() + begin),
                                                   (end - begin) * sizeof(float))});
    }
    push.info.worker_id = 0;  // worker 0, one sequence per push: the server's full path
    push.info.layout_fingerprint = shard->partitioner().layout_fingerprint();
    push.tables = absl::MakeConstSpan(&table, 1);
    return absl::OkStatus();
  }
  absl::Status Push() {
    ++push.info.sequence;
    return shard->Push(push).status();
  }
  std::unique_ptr<Shard> shard;
  std::vector<float> grad;
  PushTable table;
  PushView push;
};

void BM_AdamPush64MB(benchmark::State& state) {
  AdamPush p;
  if (absl::Status s = p.Init(static_cast<int>(state.range(0))); !s.ok()) {
    return state.SkipWithError(s.ToString().c_str());
  }
  for (auto _ : state) {
    if (absl::Status s = p.Push(); !s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kFloats * sizeof(float)));
}
BENCHMARK(BM_AdamPush64MB)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// One thread's Adam push over a table of one block of 2^N floats, arg N (22: 16 MB, 25: 128 MB
// per array): a block keeps its parameters and two slots in one allocation, so a large block
// puts those arrays far apart (docs/lab/2026-12-03-stream-layout.md).
void BM_AdamPushOneBlock(benchmark::State& state) {
  const size_t floats = size_t{1} << state.range(0);
  AdamPush p;
  if (absl::Status s = p.Init(/*apply_threads=*/0, floats, floats); !s.ok()) {
    return state.SkipWithError(s.ToString().c_str());
  }
  for (auto _ : state) {
    if (absl::Status s = p.Push(); !s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * floats * sizeof(float)));
  // The check's 4 bytes and Adam's 28 per element.
  state.counters["GBps"] =
      benchmark::Counter(32.0 * floats * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AdamPushOneBlock)
    ->Arg(22)
    ->Arg(24)
    ->Arg(25)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The hand-off of a small parallel push: the Fashion-MNIST MLP's 235k Adam values (a table of
// 235,520 floats in 64k-value blocks: 3 full blocks and one of 38,912), applied by every usable
// core (arg 0: whole blocks, helpers asleep between pushes; 1: in ranges, asleep; 2: in ranges,
// helpers watching for work for 1 ms: ShardOptions::apply_spin). Pushes follow each other at
// once, so a watching helper never sleeps. The microseconds per push are the check and apply's
// latency, hand-offs included.
void BM_MlpPushHandOff(benchmark::State& state) {
  const int variant = static_cast<int>(state.range(0));
  AdamPush p;
  const int helpers = static_cast<int>(common::UsableCores()) - 1;
  if (absl::Status s = p.Init(helpers, 235520, 65536,
                              [variant](ShardOptions* o) {
                                o->parallel_apply_values = 65536;
                                if (variant == 0) o->parallel_apply_range_values = 65536;
                                if (variant == 2) o->apply_spin = absl::Milliseconds(1);
                              });
      !s.ok()) {
    return state.SkipWithError(s.ToString().c_str());
  }
  for (auto _ : state) {
    if (absl::Status s = p.Push(); !s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  state.counters["threads"] = helpers + 1;
  state.counters["ranged"] = static_cast<double>(p.shard->ranged_pushes());
}
BENCHMARK(BM_MlpPushHandOff)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond)->UseRealTime();

// A dense pull read out of the tables into the answer's buffer (Shard::ReadPull, as a server
// reads one into a worker's shared memory): arg 0, the values (235,520: the Fashion-MNIST MLP;
// 16,777,216: 64 MB); arg 1, how: 0 on the calling thread (not in place), 1 in ranges on every
// usable core with the helpers asleep between pulls, 2 the same with helpers watching for work
// for 1 ms. Pulls follow each other at once. Blocks of 64k values.
void BM_PullRead(benchmark::State& state) {
  const size_t values = static_cast<size_t>(state.range(0));
  const int variant = static_cast<int>(state.range(1));
  AdamPush p;
  const int helpers = static_cast<int>(common::UsableCores()) - 1;
  if (absl::Status s = p.Init(helpers, values, 65536,
                              [variant](ShardOptions* o) {
                                o->parallel_apply_values = 65536;
                                if (variant == 2) o->apply_spin = absl::Milliseconds(1);
                              });
      !s.ok()) {
    return state.SkipWithError(s.ToString().c_str());
  }
  const common::TableInfo& info = *p.shard->partitioner().FindTable("w");
  std::vector<uint32_t> blocks(info.num_blocks);
  for (uint32_t b = 0; b < info.num_blocks; ++b) blocks[b] = b;
  std::vector<float> answer(values);
  const PullTable t{"w", ENCODING_FLOAT32, blocks, {}};
  for (auto _ : state) {
    absl::Status s = p.shard->ReadPull(
        absl::MakeConstSpan(&t, 1),
        [&](size_t, size_t part, size_t n, auto fill) {
          const size_t begin = p.shard->partitioner().BlockRange(info, blocks[part]).first;
          return fill(absl::MakeSpan(answer).subspan(begin, n));
        },
        /*stream=*/false, /*in_place=*/variant != 0);
    if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * values * sizeof(float)));
  state.counters["threads"] = variant == 0 ? 1 : helpers + 1;
  state.counters["parallel"] = static_cast<double>(p.shard->parallel_pulls());
}
BENCHMARK(BM_PullRead)
    ->Args({235520, 0})
    ->Args({235520, 1})
    ->Args({235520, 2})
    ->Args({16777216, 0})
    ->Args({16777216, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Each iteration: the push by 1 thread, by the parallel apply, then the Adam-shaped stream
// (the same bytes per element as Adam) by 1 and 2 threads: "ceiling" is the stream's speedup
// next to the push's, under the same load.
void BM_PairAdamPush64MB(benchmark::State& state) {
  static StreamArrays* arrays = new StreamArrays();
  AdamPush serial, parallel;
  for (auto [p, threads] : {std::pair{&serial, 0}, std::pair{&parallel, 1}}) {
    if (absl::Status s = p->Init(threads); !s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  common::ThreadPool pool(1);
  Pairs pairs, stream;
  for (auto _ : state) {
    for (auto [p, times] : {std::pair{&serial, &pairs.one}, std::pair{&parallel, &pairs.two}}) {
      const absl::Time t = absl::Now();
      if (absl::Status s = p->Push(); !s.ok()) return state.SkipWithError(s.ToString().c_str());
      times->push_back(Seconds(t));
    }
    absl::Time t = absl::Now();
    for (size_t b = 0; b < StreamArrays::kBlocks; ++b) AdamTrafficPass(*arrays, b);
    stream.one.push_back(Seconds(t));
    t = absl::Now();
    pool.ParallelFor(StreamArrays::kBlocks, 1, [&](size_t b) { AdamTrafficPass(*arrays, b); });
    stream.two.push_back(Seconds(t));
    state.SetIterationTime(pairs.one.back() + pairs.two.back());
  }
  pairs.Report(state, 32.0 * kFloats);  // the check's 4 bytes and Adam's 28 per element
  std::vector<double> ceiling(stream.one.size()), when_two_cores;
  for (size_t i = 0; i < ceiling.size(); ++i) {
    ceiling[i] = stream.one[i] / stream.two[i];
    // Iterations where the machine gave this process two cores and the bandwidth to feed them
    // (the stream ran >= 1.5x faster with 2 threads): the push's speedup there, and how many
    // there were.
    if (ceiling[i] >= 1.5) when_two_cores.push_back(pairs.one[i] / pairs.two[i]);
  }
  state.counters["ceiling"] = Median(ceiling);
  state.counters["speedup_2c"] = Median(when_two_cores);
  state.counters["n_2c"] = static_cast<double>(when_two_cores.size());
}
BENCHMARK(BM_PairAdamPush64MB)->Unit(benchmark::kMillisecond)->UseManualTime();

// A shard holding one sparse table of 1M rows of dim 16 (all created), and 8 draws of 10k
// uniform keys used in turn.
struct SparseFixture {
  static constexpr uint64_t kSpace = 1000000;
  static constexpr size_t kKeys = 10000;
  static constexpr int kDim = 16;
  absl::Status Init() {
    auto config = common::ParseJobConfigText(
        "cluster { num_servers: 1 num_workers: 1 }\n"
        "tables { name: \"e\" kind: TABLE_KIND_SPARSE dim: 16 optimizer { kind: SGD } }\n",
        "bench");
    if (!config.ok()) return config.status();
    auto created = Shard::Create(*config, ShardOptions{});
    if (!created.ok()) return created.status();
    shard = *std::move(created);
    std::vector<uint64_t> all(kSpace);
    for (uint64_t k = 0; k < kSpace; ++k) all[k] = k;
    if (absl::Status s = Pull(all); !s.ok()) return s;
    std::mt19937_64 rng(1);
    for (auto& batch : keys) {
      batch.resize(kKeys);
      for (uint64_t& k : batch) k = rng() % kSpace;
    }
    return absl::OkStatus();
  }
  absl::Status Pull(absl::Span<const uint64_t> k) {
    PullTable t;
    t.table = "e";
    t.keys = k;
    rows.resize(k.size() * kDim);
    return shard->ReadPull(absl::MakeConstSpan(&t, 1),
                           [&](size_t, size_t, size_t n, auto fill) {
                             return fill(absl::MakeSpan(rows.data(), n));
                           });
  }
  std::unique_ptr<Shard> shard;
  std::vector<uint64_t> keys[8];
  std::vector<float> rows;
};

void BM_SparsePull10k(benchmark::State& state) {
  SparseFixture f;
  if (absl::Status s = f.Init(); !s.ok()) return state.SkipWithError(s.ToString().c_str());
  RequestInfo info;  // as a worker's pull: the layout is checked, then every key's server
  info.layout_fingerprint = f.shard->partitioner().layout_fingerprint();
  size_t i = 0;
  for (auto _ : state) {
    const std::vector<uint64_t>& k = f.keys[i++ % 8];
    const PullTable t{"e", ENCODING_FLOAT32, {}, k};
    if (absl::Status s = f.shard->CheckPull(info, absl::MakeConstSpan(&t, 1)).status();
        !s.ok()) {
      return state.SkipWithError(s.ToString().c_str());
    }
    if (absl::Status s = f.Pull(k); !s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * SparseFixture::kKeys);
}
BENCHMARK(BM_SparsePull10k)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_SparsePush10k(benchmark::State& state) {
  SparseFixture f;
  if (absl::Status s = f.Init(); !s.ok()) return state.SkipWithError(s.ToString().c_str());
  const std::vector<float> grad(SparseFixture::kKeys * SparseFixture::kDim, 1e-6f);
  PushTable table;
  table.table = "e";
  table.rows = absl::string_view(reinterpret_cast<const char*>(grad.data()),
                                 grad.size() * sizeof(float));
  PushView push;  // worker 0, one sequence per push: check, dedup and apply
  push.info.worker_id = 0;
  push.info.layout_fingerprint = f.shard->partitioner().layout_fingerprint();
  push.tables = absl::MakeConstSpan(&table, 1);
  size_t i = 0;
  for (auto _ : state) {
    table.keys = f.keys[i++ % 8];
    ++push.info.sequence;
    auto result = f.shard->Push(push);
    if (!result.ok()) return state.SkipWithError(result.status().ToString().c_str());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * SparseFixture::kKeys);
}
BENCHMARK(BM_SparsePush10k)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace ps::server

BENCHMARK_MAIN();
