// ps_bench --modes=dense,sparse: the gRPC measurements against servers started here (a
// LocalCluster with the bench tables) or running ones (--connect with their --config).

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "bench/ps_bench.h"
#include "common/status_macros.h"

namespace ps::bench {

namespace {

absl::Status RunGrpc(BenchEnv* env, const JobConfig& config, Reporter* reporter) {
  const BenchOptions& f = *env->flags;
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<worker::GrpcParameterStore>> stores,
                   MakeStores(config, MaxClients(f), env));
  if (f.dense) {
    for (uint64_t bytes : f.payloads) {
      for (bool push : f.dense_ops) {
        for (int c : f.clients) {
          ASSIGN_OR_RETURN(BenchRow row, RunDense(*env, bytes, push, c));
          reporter->Add(row);
        }
      }
    }
  }
  if (f.sparse) {
    const int dim = f.sparse_dim;
    if (f.sparse_prefill) {
      RETURN_IF_ERROR(PrefillSparse(*env, SparseTableName(dim), dim));
    }
    for (bool push : f.sparse_ops) {
      for (uint64_t k : f.sparse_keys) {
        for (int c : f.clients) {
          ASSIGN_OR_RETURN(BenchRow row, RunSparse(*env, k, c, push));
          reporter->Add(row);
        }
      }
    }
  }
  worker::GrpcStoreStats total;
  for (auto& s : stores) {
    const worker::GrpcStoreStats st = s->stats();
    total.retries += st.retries;
    total.duplicate_pushes += st.duplicate_pushes;
    total.handoffs_streamed += st.handoffs_streamed;
    total.handoffs_plain += st.handoffs_plain;
    total.bytes_lent += st.bytes_lent;
    total.payloads_following += st.payloads_following;
    total.payloads_whole += st.payloads_whole;
    // Leave the consistency bound; matters only when connected to long-running servers.
    s->Finish().IgnoreError();
  }
  std::cerr << "client totals: " << total.retries << " retries, " << total.duplicate_pushes
            << " pushes answered as duplicates; calls through shared memory handed with "
            << total.handoffs_streamed << " streamed and " << total.handoffs_plain
            << " plain copies (the links' HandoffChooser); " << total.payloads_following
            << " push payloads followed their call and " << total.payloads_whole
            << " that could went whole (rpc.overlap_push_copy); " << total.bytes_lent
            << " push bytes read where they lay in lent buffers" << std::endl;
  env->stores.clear();
  return absl::OkStatus();
}

// Every table the chosen modes use must be in the config (relevant with --connect).
absl::Status CheckTables(const BenchOptions& f, const JobConfig& config) {
  std::vector<std::string> need, missing;
  if (f.dense) {
    for (uint64_t b : f.payloads) need.push_back(DenseTableName(b));
  }
  if (f.sparse) need.push_back(SparseTableName(f.sparse_dim));
  for (const auto& name : need) {
    bool found = false;
    for (const auto& t : config.tables()) found = found || t.name() == name;
    if (!found) missing.push_back(name);
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(
      "the config lacks the bench tables ", absl::StrJoin(missing, ", "),
      "; start the servers with a config from `ps_bench --write_config=F` (same --payloads)"));
}

void PrintHeader(const std::vector<std::string>& addresses, const BenchOptions& f) {
  std::cerr << "ps_bench: " << addresses.size() << " servers (" << absl::StrJoin(addresses, ", ")
            << "), " << absl::FormatDuration(f.load.duration) << " per measurement after "
            << absl::FormatDuration(f.load.warmup) << " warm-up, window " << f.window
            << ", median of " << f.repeat << std::endl;
}

}  // namespace

absl::Status RunAgainstServers(BenchEnv* env, SignalStopper* stopper, Reporter* reporter) {
  const BenchOptions& f = *env->flags;
  const int num_servers = f.servers;
  std::unique_ptr<LocalCluster> cluster;
  std::string config_path = f.config;
  std::vector<std::string> addresses = f.connect;
  if (addresses.empty()) {
    if (num_servers < 1) return absl::InvalidArgumentError("--servers must be >= 1");
    LocalClusterOptions options;
    options.server_binary = FindServerBinary(f);
    options.num_servers = num_servers;
    options.config_text = BenchConfigText(*env->flags, num_servers);
    options.keep_dir = f.keep_temp;
    ASSIGN_OR_RETURN(cluster, LocalCluster::Start(options));
    stopper->Watch(cluster.get(), options.keep_dir);
    env->cluster = cluster.get();
    config_path = cluster->config_path();
    addresses = cluster->addresses();
  } else if (config_path.empty()) {
    return absl::InvalidArgumentError("--connect needs --config (the servers' JobConfig)");
  }
  PrintHeader(addresses, *env->flags);
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(JobConfig config, ClientConfig(config_path, addresses));
    RETURN_IF_ERROR(CheckTables(*env->flags, config));
    return RunGrpc(env, config, reporter);
  }();
  stopper->Watch(nullptr, false);
  env->cluster = nullptr;
  if (cluster != nullptr) {
    cluster->Stop();
    // After SIGTERM a server drains and exits 0; anything else is worth reporting.
    if (absl::Status exits = cluster->CheckExitedCleanly(); !exits.ok()) {
      std::cerr << "warning: " << exits.message() << std::endl;
    }
  }
  return status;
}

}  // namespace ps::bench
