// ps_bench --modes=sparse: GrpcParameterStore pulls and pushes of uniformly drawn keys.

#include <algorithm>
#include <iostream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "bench/ps_bench.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"

namespace ps::bench {

absl::Status PrefillSparse(const BenchEnv& env, const std::string& table, int dim) {
  const uint64_t space = env.flags->key_space;
  // A push pins its rows in memory: small enough not to push a spilling table far past its
  // memory_budget_rows.
  constexpr uint64_t kChunk = 4096;
  std::vector<uint64_t> keys;
  std::vector<float> zeros;
  const absl::Time start = absl::Now();
  for (uint64_t first = 0; first < space; first += kChunk) {
    if (env.cancel->load()) return absl::CancelledError("cancelled");
    keys.clear();
    for (uint64_t k = first; k < std::min(space, first + kChunk); ++k) keys.push_back(k);
    zeros.assign(keys.size() * dim, 0.f);
    common::PushBatch batch;
    batch.sparse.push_back({table, keys, zeros});
    RETURN_IF_ERROR_CTX(env.stores[0]->Push(batch, common::PushOptions{}), "sparse prefill");
  }
  std::cerr << absl::StrFormat("sparse prefill: %d rows of dim %d created in %.2f s\n", space,
                               dim, absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::StatusOr<BenchRow> RunSparse(const BenchEnv& env, uint64_t num_keys, int clients,
                                   bool push) {
  const int window = env.flags->window;
  const int threads = clients * window;
  const int dim = env.flags->sparse_dim;
  const std::string table = SparseTableName(dim);
  // Key draws are made before measuring: a few batches per thread, used in turn.
  constexpr int kBatches = 8;
  std::vector<std::vector<std::vector<uint64_t>>> keys(threads);
  std::vector<std::vector<float>> out(threads, std::vector<float>(num_keys * dim));
  std::vector<int> next(threads, 0);
  for (int t = 0; t < threads; ++t) {
    std::mt19937_64 rng(env.flags->seed * 1000003 + t * 7919 + num_keys);
    std::uniform_int_distribution<uint64_t> draw(0, env.flags->key_space - 1);
    keys[t].resize(kBatches);
    for (auto& batch : keys[t]) {
      batch.resize(num_keys);
      for (auto& k : batch) k = draw(rng);
    }
  }
  // Push: small gradients (the rows stay near their values however long the bench runs).
  if (push) {
    for (auto& rows : out) std::fill(rows.begin(), rows.end(), 1e-6f);
  }
  auto call = [&](int t) -> absl::Status {
    const std::vector<uint64_t>& k = keys[t][next[t]++ % kBatches];
    if (push) {
      common::PushBatch batch;
      batch.sparse.push_back({table, k, absl::MakeConstSpan(out[t])});
      return env.stores[t / window]->Push(batch, common::PushOptions{});
    }
    common::PullBatch batch;
    batch.sparse.push_back({table, k, absl::MakeSpan(out[t])});
    return env.stores[t / window]->Pull(batch, common::PullOptions{});
  };
  const char* op = push ? "sparse_push" : "sparse_pull";
  const uint64_t retries = TotalRetries(env);
  BenchRow usage;
  ASSIGN_OR_RETURN(LoadResult r,
                   RunChecked(env, threads, call,
                              absl::StrCat(op, " ", num_keys, " keys, ", clients, " clients"),
                              &usage));
  BenchRow row = MakeRow("grpc", op, KeysLabel(num_keys), num_keys * dim * sizeof(float), num_keys, clients,
                         window, r);
  row.client_per_call = usage.client_per_call;
  row.server_per_call = usage.server_per_call;
  row.retries = TotalRetries(env) - retries;
  return row;
}

}  // namespace ps::bench
