// ps_bench --modes=dense: GrpcParameterStore push and pull of one dense table per payload.

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "bench/ps_bench.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"

namespace ps::bench {

absl::StatusOr<BenchRow> RunDense(const BenchEnv& env, uint64_t bytes, bool push, int clients) {
  const int window = env.flags->window;
  const int threads = clients * window;
  const std::string table = DenseTableName(bytes);
  const size_t numel = bytes / sizeof(float);
  // Small finite gradients: SGD moves the parameters a little on every push.
  const std::vector<float> gradient(push ? numel : 0, 1e-4f);
  std::vector<std::vector<float>> out(push ? 0 : threads, std::vector<float>(numel));
  auto call = [&](int t) -> absl::Status {
    worker::GrpcParameterStore* store = env.stores[t / window];
    if (push) {
      common::PushBatch batch;
      batch.dense.push_back({table, absl::MakeConstSpan(gradient)});
      return store->Push(batch, common::PushOptions{});
    }
    common::PullBatch batch;
    batch.dense.push_back({table, absl::MakeSpan(out[t])});
    return store->Pull(batch, common::PullOptions{});
  };
  const uint64_t retries = TotalRetries(env);
  BenchRow usage;
  ASSIGN_OR_RETURN(LoadResult r, RunChecked(env, threads, call,
                                            absl::StrCat("dense ", push ? "push " : "pull ",
                                                         FormatBytes(bytes), ", ", clients,
                                                         " clients"),
                                            &usage));
  BenchRow row = MakeRow("grpc", push ? "push" : "pull", FormatBytes(bytes), bytes, 0, clients,
                         window, r);
  row.client_per_call = usage.client_per_call;
  row.server_per_call = usage.server_per_call;
  row.retries = TotalRetries(env) - retries;
  // Compared with raw TCP of as many connections (one client: the 1 + 1 baseline).
  if (auto it = env.tcp_mb_per_s.find({bytes, clients});
      it != env.tcp_mb_per_s.end() && it->second > 0) {
    row.vs_tcp = row.mb_per_second / it->second;
  }
  return row;
}

}  // namespace ps::bench
