// ps_bench --modes=spill: Zipf pulls against fresh servers per memory budget; rows/s and the
// share of rows served from memory (the servers' fault counters).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "bench/ps_bench.h"
#include "common/rpc/credentials.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "proto/ps.grpc.pb.h"

namespace ps::bench {

namespace {

// The spill mode's tables-only config: the sparse bench table keeping at most budget_rows
// rows in memory on each server (0 = no budget), SGD, asynchronous, no checkpoints, plaintext.
std::string SpillConfigText(int num_servers, int num_workers, uint64_t budget_rows, int dim) {
  return absl::StrCat(
      "# Written by bench/ps_bench --modes=spill.\n", "name: \"ps_bench_spill\"\n",
      "cluster {\n  num_servers: ", num_servers, "\n  num_workers: ", num_workers, "\n}\n",
      "default_optimizer { kind: SGD learning_rate: 0.01 }\n", "tables {\n  name: \"",
      SparseTableName(dim), "\"\n  kind: TABLE_KIND_SPARSE\n  dim: ", dim,
      "\n  initializer { kind: ZEROS }\n",
      budget_rows > 0 ? absl::StrCat("  memory_budget_rows: ", budget_rows, "\n") : "", "}\n",
      "checkpoint {\n  interval_s: 0\n  on_shutdown: false\n}\n",
      "security { plaintext: true }\n");
}

// Inverse-CDF sampling of k in [0, n) with P(k) ~ (k + 1)^-s. Thread-safe (const).
class ZipfKeys {
 public:
  ZipfKeys(uint64_t n, double s) : cdf_(n) {
    double c = 0;
    for (uint64_t k = 0; k < n; ++k) {
      c += std::pow(static_cast<double>(k) + 1, -s);
      cdf_[k] = c;
    }
    for (double& v : cdf_) v /= c;
  }
  uint64_t operator()(std::mt19937_64& rng) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    const uint64_t k = std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
    return std::min<uint64_t>(k, cdf_.size() - 1);
  }

 private:
  std::vector<double> cdf_;
};

// The servers' counters of the bench's sparse table, summed over the servers.
struct SpillCounters {
  uint64_t rows = 0, in_memory = 0, faulted_in = 0;
};

absl::StatusOr<SpillCounters> ReadSpillCounters(const JobConfig& config, int dim) {
  SpillCounters total;
  const std::string table = SparseTableName(dim);
  for (const std::string& address : config.cluster().servers()) {
    ASSIGN_OR_RETURN(auto channel, common::MakeChannel(address, config));
    auto stub = ParameterServer::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    StatsResponse stats;
    RETURN_IF_ERROR_CTX(common::FromGrpcStatus(stub->Stats(&context, StatsRequest(), &stats)),
                        absl::StrCat("stats of ", address));
    for (const TableStats& t : stats.tables()) {
      if (t.name() != table) continue;
      total.rows += t.rows();
      total.in_memory += t.rows_in_memory();
      total.faulted_in += t.rows_faulted_in();
    }
  }
  return total;
}

// Each client thread's pre-drawn pulls of num_keys unique keys: streams[thread][pull].
using ZipfStreams = std::vector<std::vector<std::vector<uint64_t>>>;

ZipfStreams DrawZipfStreams(const BenchOptions& f, const ZipfKeys& zipf, uint64_t num_keys,
                            int threads) {
  const uint64_t pulls =
      std::max<uint64_t>(1, f.zipf_stream_keys /
                                std::max<uint64_t>(num_keys, 1));
  ZipfStreams streams(threads);
  std::vector<std::thread> drawers;
  for (int t = 0; t < threads; ++t) {
    drawers.emplace_back([&, t] {
      std::mt19937_64 rng(f.seed * 1000003 + t * 7919 + num_keys);
      streams[t].resize(pulls);
      for (auto& pull : streams[t]) {
        absl::flat_hash_set<uint64_t> seen;
        while (pull.size() < num_keys) {
          const uint64_t k = zipf(rng);
          if (seen.insert(k).second) pull.push_back(k);
        }
      }
    });
  }
  for (auto& d : drawers) d.join();
  return streams;
}

// Pulls from the Zipf streams; the hit ratio comes from the servers' fault counters over
// exactly the pulls made (warm-up included).
absl::StatusOr<BenchRow> RunZipf(const BenchEnv& env, const JobConfig& config,
                                 const ZipfStreams& keys, uint64_t num_keys, int clients,
                                 double in_memory) {
  const int window = env.flags->window;
  const int threads = clients * window;
  const int dim = env.flags->sparse_dim;
  const std::string table = SparseTableName(dim);
  std::vector<std::vector<float>> out(threads, std::vector<float>(num_keys * dim));
  std::vector<int> next(threads, 0);
  std::atomic<uint64_t> rows_pulled{0};
  auto call = [&](int t) -> absl::Status {
    common::PullBatch batch;
    batch.sparse.push_back({table, keys[t][next[t]++ % keys[t].size()], absl::MakeSpan(out[t])});
    RETURN_IF_ERROR(env.stores[t / window]->Pull(batch, common::PullOptions{}));
    rows_pulled.fetch_add(num_keys);
    return absl::OkStatus();
  };
  const uint64_t retries = TotalRetries(env);
  ASSIGN_OR_RETURN(const SpillCounters before, ReadSpillCounters(config, dim));
  ASSIGN_OR_RETURN(LoadResult r,
                   RunChecked(env, threads, call,
                              absl::StrCat("zipf pull ", num_keys, " keys, ", clients,
                                           " clients")));
  ASSIGN_OR_RETURN(const SpillCounters after, ReadSpillCounters(config, dim));
  const std::string label =
      absl::StrCat(num_keys % 1000 == 0 ? absl::StrCat(num_keys / 1000, "k")
                                        : absl::StrCat(num_keys),
                   " keys zipf ", env.flags->zipf);
  BenchRow row = MakeRow("spill", "zipf_pull", label, num_keys * dim * sizeof(float), num_keys,
                         clients, window, r);
  row.retries = TotalRetries(env) - retries;
  row.in_memory = in_memory;
  if (rows_pulled.load() > 0) {
    row.hit_ratio = 1.0 - static_cast<double>(after.faulted_in - before.faulted_in) /
                              static_cast<double>(rows_pulled.load());
  }
  return row;
}

// The resident set of a process, MiB (-1 if unreadable).
double RssMiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  long kb = -1;
  while (std::getline(in, line)) {
    if (std::sscanf(line.c_str(), "VmRSS: %ld kB", &kb) == 1) break;
  }
  return kb < 0 ? -1 : kb / 1024.0;
}

// Pulls `rows` keys of a Zipf stream through store 0, so that the rows in memory are the hot
// ones (after the prefill they are the last keys created) before anything is measured.
absl::Status WarmUpSpill(const BenchEnv& env, const ZipfStreams& streams, uint64_t rows) {
  const int dim = env.flags->sparse_dim;
  const absl::Time start = absl::Now();
  std::vector<float> out;
  uint64_t pulled = 0;
  for (size_t i = 0; pulled < rows; ++i) {
    if (env.cancel->load()) return absl::CancelledError("cancelled");
    const std::vector<uint64_t>& keys = streams[0][i % streams[0].size()];
    out.resize(keys.size() * dim);
    common::PullBatch batch;
    batch.sparse.push_back({SparseTableName(dim), keys, absl::MakeSpan(out)});
    RETURN_IF_ERROR_CTX(env.stores[0]->Pull(batch, common::PullOptions{}), "spill warm-up");
    pulled += keys.size();
  }
  std::cerr << absl::StrFormat("  warm-up: %d rows of the Zipf stream pulled in %.2f s\n", pulled,
                               absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

// The spill rows of one budget, against fresh servers.
absl::Status RunSpillBudget(BenchEnv* env, const JobConfig& config,
                            const std::map<uint64_t, ZipfStreams>& streams, double in_memory,
                            Reporter* reporter) {
  // Warm-up: 4 times the rows that fit in memory, from the stream with the largest pulls.
  const BenchOptions& f = *env->flags;
  const uint64_t warm_rows =
      in_memory < 1 ? static_cast<uint64_t>(4 * in_memory * f.key_space) : 0;
  ASSIGN_OR_RETURN(auto stores, MakeStores(config, MaxClients(f), env));
  const int dim = f.sparse_dim;
  RETURN_IF_ERROR(PrefillSparse(*env, SparseTableName(dim), dim));
  ASSIGN_OR_RETURN(const SpillCounters c, ReadSpillCounters(config, dim));
  std::cerr << "  " << c.rows << " rows, " << c.in_memory << " of them in memory" << std::endl;
  absl::SleepFor(absl::Seconds(f.spill_settle_s));
  if (warm_rows > 0) RETURN_IF_ERROR(WarmUpSpill(*env, streams.rbegin()->second, warm_rows));
  for (uint64_t k : f.sparse_keys) {
    for (int clients : f.clients) {
      ASSIGN_OR_RETURN(BenchRow row,
                       RunZipf(*env, config, streams.at(k), k, clients, in_memory));
      reporter->Add(row);
    }
  }
  if (env->cluster != nullptr) {
    std::cerr << "  servers' resident set after the runs:";
    for (pid_t pid : env->cluster->pids()) std::cerr << absl::StrFormat(" %.0f MiB", RssMiB(pid));
    std::cerr << std::endl;
  }
  for (auto& s : stores) s->Finish().IgnoreError();  // the servers are stopped right after
  env->stores.clear();
  return absl::OkStatus();
}

}  // namespace

absl::Status RunSpill(BenchEnv* env, SignalStopper* stopper, Reporter* reporter) {
  const BenchOptions& f = *env->flags;
  if (!f.connect.empty()) {
    return absl::InvalidArgumentError(
        "--modes=spill starts fresh servers for every --spill_budgets entry; it cannot use "
        "--connect");
  }
  const int num_servers = f.servers;
  if (num_servers < 1) return absl::InvalidArgumentError("--servers must be >= 1");
  const int max_clients = MaxClients(f);
  const uint64_t space = f.key_space;
  std::cerr << "spill: " << space << " rows of dim " << f.sparse_dim << " over " << num_servers
            << " servers, keys drawn from Zipf " << f.zipf << std::endl;
  std::map<uint64_t, ZipfStreams> streams;
  {
    const ZipfKeys zipf(space, f.zipf);
    for (uint64_t k : f.sparse_keys) {
      if (k > space / 4) {
        return absl::InvalidArgumentError(
            "spill mode draws --sparse_keys unique keys per pull: keep it under --key_space / 4");
      }
      streams[k] = DrawZipfStreams(f, zipf, k, max_clients * f.window);
    }
  }
  for (int percent : f.spill_budgets) {
    const uint64_t budget =
        percent >= 100 ? 0 : std::max<uint64_t>(1, space * percent / 100 / num_servers);
    LocalClusterOptions options;
    options.server_binary = FindServerBinary(f);
    options.num_servers = num_servers;
    options.config_text = SpillConfigText(num_servers, max_clients, budget, f.sparse_dim);
    options.keep_dir = f.keep_temp;
    ASSIGN_OR_RETURN(auto cluster, LocalCluster::Start(options));
    stopper->Watch(cluster.get(), options.keep_dir);
    env->cluster = cluster.get();
    std::cerr << "spill: "
              << (budget == 0 ? std::string("no budget, every row in memory")
                              : absl::StrCat("memory_budget_rows ", budget, " per server (",
                                             percent, "% of the rows in memory)"))
              << std::endl;
    absl::Status status = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(JobConfig config,
                       ClientConfig(cluster->config_path(), cluster->addresses()));
      return RunSpillBudget(env, config, streams, percent / 100.0, reporter);
    }();
    stopper->Watch(nullptr, false);
    env->cluster = nullptr;
    env->stores.clear();
    cluster->Stop();
    if (absl::Status exits = cluster->CheckExitedCleanly(); !exits.ok()) {
      std::cerr << "warning: " << exits.message() << std::endl;
    }
    RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

}  // namespace ps::bench
