// ps_bench --modes=dense: GrpcParameterStore push and pull of one dense table per payload.

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "bench/ps_bench.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "worker/rpc/grpc_async_calls.h"

namespace ps::bench {
namespace {

using AsyncCalls = worker::GrpcParameterStore::AsyncCalls;

// What each client pushes: small finite values (SGD moves the parameters a little on every
// push), in the client's own memory or, with --lend_push_buffers, in what its store lends
// once a first push from its own memory has reached the server.
class PushSources {
 public:
  PushSources(const BenchEnv& env, int clients, const std::string& table, size_t numel)
      : own_(clients, std::vector<float>(numel, 1e-4f)), calls_(clients, 0), lent_(clients) {
    if (!env.flags->lend_push_buffers) return;
    for (int c = 0; c < clients; ++c) {
      common::PushBatch first;
      first.dense.push_back({table, absl::MakeConstSpan(own_[c])});
      if (!env.stores[c]->Push(first, common::PushOptions{}).ok()) continue;
      lent_[c] = env.stores[c]->LendPushBuffer({table});
      if (lent_[c] != nullptr)
        std::fill(lent_[c]->values().begin(), lent_[c]->values().end(), 1e-4f);
    }
  }

  absl::Span<const float> For(int client) const {
    return lent_[client] != nullptr ? absl::Span<const float>(lent_[client]->values())
                                    : absl::MakeConstSpan(own_[client]);
  }
  // Writes client's payload afresh (small finite values that differ from call to call).
  void Rewrite(int client) {
    absl::Span<float> to =
        lent_[client] != nullptr ? lent_[client]->values() : absl::MakeSpan(own_[client]);
    const float v = 1e-4f * static_cast<float>(1 + (++calls_[client] & 7));
    // At the speed a backward pass writes: one 4 KB run, then copies of it. A plain std::fill
    // compiles to one scalar store per value here (x86-64-v2), about 110 us per MB, which
    // halved the 1 + 1 1 MB push rate in this mode.
    const size_t run = std::min<size_t>(to.size(), 1024);
    std::fill(to.begin(), to.begin() + run, v);
    for (size_t at = run; at < to.size(); at += run) {
      std::memcpy(to.data() + at, to.data(), std::min(run, to.size() - at) * sizeof(float));
    }
  }

 private:
  std::vector<std::vector<float>> own_;                    // per client
  std::vector<uint64_t> calls_;                            // per client: rewrites so far
  std::vector<std::unique_ptr<common::LentBuffer>> lent_;  // per client, where lent
};

// One thread per client keeps the window's calls in flight with the store's asynchronous
// calls; each slot pulls into a buffer of its own.
class AsyncWindow {
 public:
  AsyncWindow(const BenchEnv& env, int clients, int window, std::string table, size_t numel,
              bool push)
      : table_(std::move(table)),
        push_(push),
        gradient_(env, push ? clients : 0, table_, push ? numel : 0),
        out_(push ? 0 : clients * window, std::vector<float>(numel)),
        slots_(clients),
        window_(window) {
    for (int c = 0; c < clients; ++c) calls_.push_back(env.stores[c]->NewAsyncCalls());
  }

  WindowCalls Calls() {
    return WindowCalls{[this](int t, int slot) { return Start(t, slot); },
                       [this](int t) { return Reap(t); }};
  }

 private:
  absl::Status Start(int t, int slot) {
    absl::StatusOr<AsyncCalls::CallId> id;
    if (push_) {
      common::PushBatch batch;
      batch.dense.push_back({table_, gradient_.For(t)});
      id = calls_[t]->StartPush(batch, common::PushOptions{});
    } else {
      common::PullBatch batch;
      batch.dense.push_back({table_, absl::MakeSpan(out_[t * window_ + slot])});
      id = calls_[t]->StartPull(batch, common::PullOptions{});
    }
    if (!id.ok()) return id.status();
    slots_[t].emplace_back(*id, slot);
    return absl::OkStatus();
  }

  absl::StatusOr<int> Reap(int t) {
    ASSIGN_OR_RETURN(AsyncCalls::Done done, calls_[t]->Next());
    RETURN_IF_ERROR(done.status);
    std::vector<std::pair<AsyncCalls::CallId, int>>& slots = slots_[t];
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].first != done.id) continue;
      const int slot = slots[i].second;
      slots[i] = slots.back();
      slots.pop_back();
      return slot;
    }
    return absl::InternalError(absl::StrCat("call ", done.id, " was not started here"));
  }

  const std::string table_;
  const bool push_;
  const PushSources gradient_;
  std::vector<std::vector<float>> out_;                               // per (client, slot)
  std::vector<std::vector<std::pair<AsyncCalls::CallId, int>>> slots_;  // per client: in flight
  const int window_;
  std::vector<std::unique_ptr<AsyncCalls>> calls_;  // per client
};

}  // namespace

absl::StatusOr<BenchRow> RunDense(const BenchEnv& env, uint64_t bytes, bool push, int clients) {
  const int window = env.flags->window;
  const bool async = window > 1 && !env.flags->window_threads;
  const int threads = async ? clients : clients * window;
  const std::string table = DenseTableName(bytes);
  const size_t numel = bytes / sizeof(float);
  PushSources gradient(env, push && !async ? clients : 0, table, push && !async ? numel : 0);
  const bool rewrite = env.flags->rewrite_push_payload;
  std::vector<std::vector<float>> out(push || async ? 0 : threads, std::vector<float>(numel));
  auto call = [&](int t) -> absl::Status {
    worker::GrpcParameterStore* store = env.stores[t / window];
    if (push) {
      common::PushBatch batch;
      if (rewrite) gradient.Rewrite(t / window);  // (window 1: one thread per client)
      batch.dense.push_back({table, gradient.For(t / window)});
      return store->Push(batch, common::PushOptions{});
    }
    common::PullBatch batch;
    batch.dense.push_back({table, absl::MakeSpan(out[t])});
    return store->Pull(batch, common::PullOptions{});
  };
  const uint64_t retries = TotalRetries(env);
  BenchRow usage;
  const std::string what = absl::StrCat("dense ", push ? "push " : "pull ", FormatBytes(bytes),
                                        ", ", clients, " clients");
  absl::StatusOr<LoadResult> r;
  if (async) {
    AsyncWindow calls(env, clients, window, table, numel, push);
    r = RunCheckedWindow(env, threads, window, calls.Calls(), what, &usage);
  } else {
    r = RunChecked(env, threads, call, what, &usage);
  }
  RETURN_IF_ERROR(r.status());
  BenchRow row = MakeRow("grpc", push ? "push" : "pull", FormatBytes(bytes),
                         bytes, 0, clients, window, *r);
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
