// The optimizer step of one large dense push on a shard, with and without helper threads
// (ShardOptions::apply_threads): a 64 MB Adam table in 1 MB blocks, every block pushed at once.
//
//   bazel run -c opt //server:shard_benchmark
//
// Reports gradient bytes applied per second; the ratio of the two rows is the parallel speedup.
#include <memory>
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

}  // namespace
}  // namespace ps::server

BENCHMARK_MAIN();
