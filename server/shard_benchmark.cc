// The optimizer step of one large dense push on a shard, with and without helper threads
// (ShardOptions::apply_threads): a 64 MB Adam table in 1 MB blocks, every block pushed at once.
// And the shard's side of a sparse pull and push of 10k uniform keys out of 1M rows of dim 16
// (SGD), as ps_bench's sparse rows: the server's cost per key without the wire.
//
//   bazel run -c opt //server:shard_benchmark
//
// Reports gradient bytes applied per second; the ratio of the two rows is the parallel speedup.
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "common/config/config.h"
#include "server/shard.h"

namespace ps::server {
namespace {

void BM_AdamPush64MB(benchmark::State& state) {
  const int apply_threads = static_cast<int>(state.range(0));
  constexpr size_t kFloats = size_t{16} << 20;  // 64 MB
  auto config = common::ParseJobConfigText(
      absl::StrCat("cluster { num_servers: 1 num_workers: 1 dense_block_floats: 262144 }\n",
                   "tables { name: \"w\" kind: TABLE_KIND_DENSE shape: ", kFloats,
                   " initializer { kind: ZEROS } optimizer { kind: ADAM } }\n"),
      "bench");
  if (!config.ok()) {
    state.SkipWithError(std::string(config.status().message()).c_str());
    return;
  }
  ShardOptions options;
  options.apply_threads = apply_threads;
  auto shard = Shard::Create(*config, options);
  if (!shard.ok()) {
    state.SkipWithError(std::string(shard.status().message()).c_str());
    return;
  }
  const std::vector<float> grad(kFloats, 1e-3f);
  const common::TableInfo& info = *(*shard)->partitioner().FindTable("w");
  PushTable table;
  table.table = "w";
  for (uint32_t b = 0; b < info.num_blocks; ++b) {
    auto [begin, end] = (*shard)->partitioner().BlockRange(info, b);
    table.blocks.push_back({b, absl::string_view(reinterpret_cast<const char*>(grad.data() + begin),
                                                 (end - begin) * sizeof(float))});
  }
  PushView push;  // worker 0, one sequence per push: the server's full path, check included
  push.info.worker_id = 0;
  push.info.layout_fingerprint = (*shard)->partitioner().layout_fingerprint();
  push.tables = absl::MakeConstSpan(&table, 1);
  for (auto _ : state) {
    ++push.info.sequence;
    auto result = (*shard)->Push(push);
    if (!result.ok()) state.SkipWithError(std::string(result.status().message()).c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kFloats * sizeof(float));
}
BENCHMARK(BM_AdamPush64MB)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

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
