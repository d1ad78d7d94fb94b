#include "worker/rpc/grpc_store.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/codec.h"
#include "common/rpc/credentials.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/rpc/unanswered.h"

namespace ps::worker {
namespace {

bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

Encoding EncodingOf(const common::TableInfo& t) { return t.config->wire_encoding(); }

// Whether pushes of `t` go through PushResiduals (16-bit encodings only: float32 is exact).
bool ErrorFeedback(const common::TableInfo& t) {
  return t.config->wire_encoding() != ENCODING_FLOAT32 && t.config->wire_error_feedback();
}

// A sparse request's keys without duplicates: unique[j] is the j-th distinct key and
// slot[i] the index in `unique` of keys[i].
struct DedupedKeys {
  std::vector<uint64_t> unique;
  std::vector<uint32_t> slot;
};

DedupedKeys Dedup(absl::Span<const uint64_t> keys) {
  DedupedKeys d;
  d.slot.resize(keys.size());
  absl::flat_hash_map<uint64_t, uint32_t> seen;
  seen.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, inserted] = seen.emplace(keys[i], static_cast<uint32_t>(d.unique.size()));
    if (inserted) d.unique.push_back(keys[i]);
    d.slot[i] = it->second;
  }
  return d;
}

absl::Status BadResponse(uint32_t server, absl::string_view what) {
  return absl::InternalError(absl::StrCat("server ", server, " answered a pull wrongly: ", what));
}

}  // namespace

struct GrpcParameterStore::Metrics {
  Metrics(common::metrics::Registry* r, size_t num_servers)
      : failures(r->AddCounterFamily(
            "ps_worker_rpc_failures_total",
            "Failed RPC attempts to each server, by status code (retried or not).",
            {"server", "code"})),
        bytes_sent(r->AddCounter("ps_worker_bytes_sent_total",
                                 "Parameter bytes pushed to the servers (payload only).")),
        bytes_received(r->AddCounter("ps_worker_bytes_received_total",
                                     "Parameter bytes pulled from the servers (payload only).")),
        duplicates(r->AddCounter(
            "ps_worker_push_duplicates_total",
            "Push answers saying the server had applied the push already (after a retry).")) {
    auto* family = r->AddCounterFamily(
        "ps_worker_rpc_retries_total",
        "RPCs to each server retried after UNAVAILABLE or DEADLINE_EXCEEDED.", {"server"});
    for (size_t s = 0; s < num_servers; ++s) {
      retries.push_back(family->WithLabels({absl::StrCat(s)}));
    }
  }

  common::metrics::Family<common::metrics::Counter>* const failures;
  common::metrics::Counter* const bytes_sent;
  common::metrics::Counter* const bytes_received;
  common::metrics::Counter* const duplicates;
  std::vector<common::metrics::Counter*> retries;  // per server
};

absl::StatusOr<std::unique_ptr<GrpcParameterStore>> GrpcParameterStore::Create(
    const JobConfig& config, const GrpcStoreOptions& options, common::metrics::Registry* metrics) {
  std::vector<std::unique_ptr<ParameterServer::StubInterface>> stubs;
  for (const std::string& address : config.cluster().servers()) {
    ASSIGN_OR_RETURN(auto channel, common::MakeChannel(address, config));
    stubs.push_back(ParameterServer::NewStub(channel));
  }
  return CreateWithStubs(config, options, std::move(stubs), metrics);
}

absl::StatusOr<std::unique_ptr<GrpcParameterStore>> GrpcParameterStore::CreateWithStubs(
    const JobConfig& config, const GrpcStoreOptions& options,
    std::vector<std::unique_ptr<ParameterServer::StubInterface>> stubs,
    common::metrics::Registry* metrics) {
  ASSIGN_OR_RETURN(common::Partitioner partitioner, common::Partitioner::Create(config));
  if (stubs.size() != partitioner.num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat("the layout has ", partitioner.num_servers(),
                                                   " servers but ", stubs.size(),
                                                   " addresses are given (cluster.servers)"));
  }
  return std::unique_ptr<GrpcParameterStore>(
      new GrpcParameterStore(config, options, std::move(partitioner), std::move(stubs), metrics));
}

GrpcParameterStore::GrpcParameterStore(
    const JobConfig& config, const GrpcStoreOptions& options, common::Partitioner partitioner,
    std::vector<std::unique_ptr<ParameterServer::StubInterface>> stubs,
    common::metrics::Registry* metrics)
    : config_(config),
      options_(options),
      partitioner_(std::move(partitioner)),
      stubs_(std::move(stubs)),
      residuals_(options.max_residual_rows),
      own_registry_(metrics == nullptr ? std::make_unique<common::metrics::Registry>() : nullptr),
      metrics_(std::make_unique<Metrics>(metrics != nullptr ? metrics : own_registry_.get(),
                                         stubs_.size())) {}

GrpcParameterStore::~GrpcParameterStore() = default;

RequestHeader GrpcParameterStore::Header(int64_t clock, uint64_t sequence) const {
  RequestHeader h;
  h.set_worker_id(options_.worker_id);
  h.set_worker_incarnation(options_.worker_incarnation);
  h.set_sequence(sequence);
  h.set_clock(clock);
  h.set_layout_fingerprint(partitioner_.layout_fingerprint());
  return h;
}

absl::Duration GrpcParameterStore::Backoff(uint32_t attempt) const {
  absl::Duration d = options_.initial_backoff;
  for (uint32_t i = 0; i < attempt && d < options_.max_backoff; ++i) d *= 2;
  d = std::min(d, options_.max_backoff);
  // Full jitter in [d/2, d]: workers retrying together do not hammer a restarted server
  // in lockstep.
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return d * jitter(rng);
}

template <typename Request, typename Response>
absl::Status GrpcParameterStore::FanOut(
    const std::vector<Request>& requests, std::vector<Response>* responses,
    const std::vector<bool>& send,
    void (ParameterServer::StubInterface::async_interface::*method)(
        grpc::ClientContext*, const Request*, Response*, std::function<void(grpc::Status)>)) {
  const size_t n = stubs_.size();
  responses->resize(n);
  std::vector<absl::Status> status(n);
  std::vector<uint32_t> pending;
  for (uint32_t s = 0; s < n; ++s) {
    if (send[s]) pending.push_back(s);
  }
  std::vector<absl::Time> first_failure(n, absl::InfiniteFuture());
  for (uint32_t attempt = 0; !pending.empty(); ++attempt) {
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
    absl::BlockingCounter done(static_cast<int>(pending.size()));
    for (uint32_t s : pending) {
      (*responses)[s].Clear();
      contexts[s] = std::make_unique<grpc::ClientContext>();
      contexts[s]->set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
      auto* async = stubs_[s]->async();
      (async->*method)(contexts[s].get(), &requests[s], &(*responses)[s],
                       [&status, &done, s](grpc::Status st) {
                         status[s] = common::FromGrpcStatus(st);
                         done.DecrementCount();
                       });
    }
    done.Wait();
    std::vector<uint32_t> retry;
    for (uint32_t s : pending) {
      if (status[s].ok()) {
        if (attempt > 0 && options_.on_recovered) {
          options_.on_recovered(s, attempt, absl::Now() - first_failure[s]);
        }
        continue;
      }
      first_failure[s] = std::min(first_failure[s], absl::Now());
      metrics_->failures->WithLabels({absl::StrCat(s), absl::StatusCodeToString(status[s].code())})
          ->Increment();
      if (!Retryable(status[s]) || attempt >= options_.max_retries) {
        return common::Annotate(status[s], absl::StrCat("server ", s, " (",
                                                        config_.cluster().servers_size() > s
                                                            ? config_.cluster().servers(s)
                                                            : "?",
                                                        ")"));
      }
      retry.push_back(s);
    }
    if (retry.empty()) break;
    retries_ += retry.size();
    for (uint32_t s : retry) {
      metrics_->retries[s]->Increment();
      if (options_.on_retry) options_.on_retry(s, attempt + 1, status[s]);
    }
    absl::SleepFor(Backoff(attempt));
    pending = std::move(retry);
  }
  return absl::OkStatus();
}

absl::Status GrpcParameterStore::Pull(const common::PullBatch& batch,
                                      const common::PullOptions& options) {
  const size_t n = stubs_.size();
  std::vector<PullRequest> requests(n);
  for (auto& r : requests) *r.mutable_header() = Header(options.clock, 0);
  // Where each table's answer goes.
  absl::flat_hash_map<std::string, const common::DensePull*> dense_out;
  struct SparseOut {
    const common::SparsePull* pull;
    const common::TableInfo* info;
    DedupedKeys keys;
    std::vector<std::vector<uint32_t>> positions;  // per server: indices into keys.unique
    std::vector<float> rows;                        // unique rows
  };
  absl::flat_hash_map<std::string, SparseOut> sparse_out;

  for (const common::DensePull& p : batch.dense) {
    const common::TableInfo* t = partitioner_.FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_DENSE || p.out.size() != t->numel) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': buffer of ",
                                                     p.out.size(), " floats for a dense table of ",
                                                     t->numel));
    }
    dense_out[p.table] = &p;
    for (uint32_t s = 0; s < n; ++s) {
      std::vector<uint32_t> blocks = partitioner_.BlocksOnServer(*t, s);
      if (blocks.empty()) continue;
      TablePullRequest* tr = requests[s].add_tables();
      tr->set_table(p.table);
      tr->set_encoding(EncodingOf(*t));
      tr->mutable_block_ids()->Add(blocks.begin(), blocks.end());
    }
  }
  for (const common::SparsePull& p : batch.sparse) {
    const common::TableInfo* t = partitioner_.FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_SPARSE || p.out.size() != p.keys.size() * t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': buffer of ",
                                                     p.out.size(), " floats for ",
                                                     p.keys.size(), " sparse rows"));
    }
    SparseOut& so = sparse_out[p.table];
    so.pull = &p;
    so.info = t;
    so.keys = Dedup(p.keys);
    so.rows.resize(so.keys.unique.size() * t->dim);
    partitioner_.SplitKeysByServer(so.keys.unique, &so.positions);
    for (uint32_t s = 0; s < n; ++s) {
      if (so.positions[s].empty()) continue;
      TablePullRequest* tr = requests[s].add_tables();
      tr->set_table(p.table);
      tr->set_encoding(EncodingOf(*t));
      for (uint32_t i : so.positions[s]) tr->add_keys(so.keys.unique[i]);
    }
  }
  std::vector<bool> send(n);
  for (uint32_t s = 0; s < n; ++s) send[s] = requests[s].tables_size() > 0;
  std::vector<PullResponse> responses;
  RETURN_IF_ERROR(FanOut(requests, &responses, send,
                         &ParameterServer::StubInterface::async_interface::Pull));

  uint64_t received = 0;
  for (uint32_t s = 0; s < n; ++s) {
    if (!send[s]) continue;
    for (const TableValues& tv : responses[s].tables()) {
      if (auto it = dense_out.find(tv.table()); it != dense_out.end()) {
        const common::TableInfo* t = partitioner_.FindTable(tv.table());
        for (const DenseBlock& block : tv.blocks()) {
          if (block.block_id() >= t->num_blocks ||
              partitioner_.ServerForBlock(*t, block.block_id()) != s) {
            return BadResponse(s, absl::StrCat("unexpected block ", block.block_id(), " of '",
                                               tv.table(), "'"));
          }
          auto [begin, end] = partitioner_.BlockRange(*t, block.block_id());
          RETURN_IF_ERROR(common::DecodeFloats(block.values(), tv.encoding(),
                                               it->second->out.subspan(begin, end - begin)));
          received += block.values().size();
        }
      } else if (auto it = sparse_out.find(tv.table()); it != sparse_out.end()) {
        SparseOut& so = it->second;
        const auto& pos = so.positions[s];
        if (static_cast<size_t>(tv.keys_size()) != pos.size()) {
          return BadResponse(s, absl::StrCat(tv.keys_size(), " rows of '", tv.table(),
                                             "' for ", pos.size(), " keys"));
        }
        const size_t dim = so.info->dim;
        std::vector<float> rows(pos.size() * dim);
        RETURN_IF_ERROR(common::DecodeFloats(tv.rows(), tv.encoding(), absl::MakeSpan(rows)));
        for (size_t j = 0; j < pos.size(); ++j) {
          std::memcpy(so.rows.data() + size_t{pos[j]} * dim, rows.data() + j * dim,
                      dim * sizeof(float));
        }
        received += tv.rows().size();
      } else {
        return BadResponse(s, absl::StrCat("unrequested table '", tv.table(), "'"));
      }
    }
  }
  for (auto& [name, so] : sparse_out) {
    const size_t dim = so.info->dim;
    for (size_t i = 0; i < so.keys.slot.size(); ++i) {
      std::memcpy(so.pull->out.data() + i * dim, so.rows.data() + size_t{so.keys.slot[i]} * dim,
                  dim * sizeof(float));
    }
  }
  bytes_received_ += received;
  metrics_->bytes_received->Increment(received);
  return absl::OkStatus();
}

absl::Status GrpcParameterStore::Push(const common::PushBatch& batch,
                                      const common::PushOptions& options) {
  const size_t n = stubs_.size();
  const uint64_t sequence = next_sequence_.fetch_add(1);
  std::vector<PushRequest> requests(n);
  for (auto& r : requests) {
    *r.mutable_header() = Header(options.clock, sequence);
    r.set_is_delta(options.is_delta);
  }
  uint64_t sent = 0;
  // Encoding happens here, once per Push; FanOut's retries resend these requests unchanged.
  absl::ReleasableMutexLock residuals_lock(&residuals_mu_);
  for (const common::DensePush& p : batch.dense) {
    const common::TableInfo* t = partitioner_.FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_DENSE || p.values.size() != t->numel) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': ", p.values.size(),
                                                     " values for a dense table of ", t->numel));
    }
    std::vector<TableValues*> per_server(n, nullptr);
    for (uint32_t b = 0; b < t->num_blocks; ++b) {
      const uint32_t s = partitioner_.ServerForBlock(*t, b);
      if (per_server[s] == nullptr) {
        per_server[s] = requests[s].add_tables();
        per_server[s]->set_table(p.table);
        per_server[s]->set_encoding(EncodingOf(*t));
      }
      DenseBlock* block = per_server[s]->add_blocks();
      block->set_block_id(b);
      auto [begin, end] = partitioner_.BlockRange(*t, b);
      if (ErrorFeedback(*t)) {
        block->mutable_values()->clear();
        residuals_.AppendDense(p.table, t->numel, begin, p.values.subspan(begin, end - begin),
                               EncodingOf(*t), block->mutable_values());
      } else {
        common::EncodeFloats(p.values.subspan(begin, end - begin), EncodingOf(*t),
                             block->mutable_values());
      }
      sent += block->values().size();
    }
  }
  std::vector<std::vector<uint32_t>> positions;
  for (const common::SparsePush& p : batch.sparse) {
    const common::TableInfo* t = partitioner_.FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_SPARSE || p.values.size() != p.keys.size() * t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': ", p.values.size(),
                                                     " values for ", p.keys.size(),
                                                     " sparse rows"));
    }
    partitioner_.SplitKeysByServer(p.keys, &positions);
    for (uint32_t s = 0; s < n; ++s) {
      if (positions[s].empty()) continue;
      TableValues* tv = requests[s].add_tables();
      tv->set_table(p.table);
      tv->set_encoding(EncodingOf(*t));
      std::string* rows = tv->mutable_rows();
      for (uint32_t i : positions[s]) {
        tv->add_keys(p.keys[i]);
        auto row = p.values.subspan(size_t{i} * t->dim, t->dim);
        if (ErrorFeedback(*t)) {
          residuals_.AppendSparseRow(p.table, p.keys[i], row, EncodingOf(*t), rows);
        } else {
          common::AppendFloats(row, EncodingOf(*t), rows);
        }
      }
      sent += rows->size();
    }
  }
  residuals_lock.Release();
  std::vector<PushResponse> responses;
  RETURN_IF_ERROR(FanOut(requests, &responses, std::vector<bool>(n, true),
                         &ParameterServer::StubInterface::async_interface::Push));
  for (const PushResponse& r : responses) {
    if (r.duplicate()) {
      ++duplicates_;
      metrics_->duplicates->Increment();
    }
  }
  bytes_sent_ += sent;
  metrics_->bytes_sent->Increment(sent);
  return absl::OkStatus();
}

GrpcStoreOptions JobStoreOptions(const JobConfig& config, int32_t worker_id,
                                 uint64_t incarnation) {
  GrpcStoreOptions options;
  options.worker_id = worker_id;
  options.worker_incarnation = incarnation;
  options.deadline = absl::Seconds(config.rpc().deadline_s());
  options.max_retries = config.rpc().max_retries();
  options.initial_backoff = absl::Seconds(config.rpc().initial_backoff_s());
  options.max_backoff = absl::Seconds(config.rpc().max_backoff_s());
  auto silent = std::make_shared<NotAnsweringLog>(
      std::vector<std::string>(config.cluster().servers().begin(),
                               config.cluster().servers().end()),
      options.deadline);
  options.on_retry = [silent](uint32_t server, uint32_t attempt, const absl::Status& status) {
    LOG(WARNING) << silent->OnRetry(server, attempt, status, absl::Now());
  };
  options.on_recovered = [silent](uint32_t server, uint32_t retries, absl::Duration down) {
    silent->OnAnswer(server);
    LOG(WARNING) << "server " << server << " answers again after " << retries << " retries, "
                 << absl::ToDoubleSeconds(down) << " s after the first failure";
  };
  return options;
}

absl::StatusOr<GrpcParameterStore::Position> GrpcParameterStore::Heartbeat(uint32_t epoch,
                                                                          uint64_t offset,
                                                                          bool finished) {
  const size_t n = stubs_.size();
  std::vector<HeartbeatRequest> requests(n);
  for (auto& r : requests) {
    *r.mutable_header() = Header(0, 0);
    r.set_epoch(epoch);
    r.set_data_offset(offset);
    r.set_finished(finished);
  }
  std::vector<HeartbeatResponse> responses;
  RETURN_IF_ERROR(FanOut(requests, &responses, std::vector<bool>(n, true),
                         &ParameterServer::StubInterface::async_interface::Heartbeat));
  Position saved;
  for (const auto& r : responses) {
    if (std::make_pair(r.epoch(), r.data_offset()) > std::make_pair(saved.epoch, saved.offset)) {
      saved.epoch = r.epoch();
      saved.offset = r.data_offset();
    }
    saved.clock = std::max(saved.clock, r.clock());
  }
  return saved;
}

absl::StatusOr<common::WorkerPosition> GrpcParameterStore::ReportPosition(uint32_t epoch,
                                                                          uint64_t offset) {
  return Heartbeat(epoch, offset, /*finished=*/false);
}

absl::Status GrpcParameterStore::Finish() {
  return Heartbeat(0, 0, /*finished=*/true).status();
}

absl::Status GrpcParameterStore::WaitForServers(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<bool> ready(stubs_.size(), false);
  absl::Status last_error;
  while (true) {
    for (uint32_t s = 0; s < stubs_.size(); ++s) {
      if (ready[s]) continue;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(2))));
      context.set_wait_for_ready(true);
      ServerInfoRequest request;
      ServerInfoResponse response;
      absl::Status st = common::FromGrpcStatus(stubs_[s]->ServerInfo(&context, request, &response));
      if (!st.ok()) {
        // Not up yet: keep waiting. Refused (credentials, token): waiting will not help.
        if (!Retryable(st)) {
          return common::Annotate(st, absl::StrCat("server ", s, " (", config_.cluster().servers(s), ")"));
        }
        last_error = st;
        if (absl::IsDeadlineExceeded(st)) {
          // Waiting for the channel hides why it is not ready: ask once without waiting.
          grpc::ClientContext probe;
          probe.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
          last_error = common::FromGrpcStatus(stubs_[s]->ServerInfo(&probe, request, &response));
          auto tls = TlsHandshakeFailure(last_error, s, config_.cluster().servers(s));
          if (tls.has_value()) return *tls;
        }
        continue;
      }
      if (response.layout_fingerprint() != partitioner_.layout_fingerprint() ||
          response.server_index() != s) {
        return absl::FailedPreconditionError(absl::StrCat(
            "server ", s, " (", config_.cluster().servers(s), ") reports index ",
            response.server_index(), " and layout ", absl::Hex(response.layout_fingerprint()),
            "; this worker expects index ", s, " and layout ",
            absl::Hex(partitioner_.layout_fingerprint()), ": the configs differ"));
      }
      ready[s] = true;
    }
    if (std::all_of(ready.begin(), ready.end(), [](bool b) { return b; })) {
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      std::vector<std::string> missing;
      for (uint32_t s = 0; s < ready.size(); ++s) {
        if (!ready[s]) missing.push_back(config_.cluster().servers(s));
      }
      return absl::UnavailableError(absl::StrCat("servers not answering after ",
                                                 absl::FormatDuration(timeout), ": ",
                                                 absl::StrJoin(missing, ", "), " (last error: ",
                                                 last_error.ToString(), ")"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

GrpcStoreStats GrpcParameterStore::stats() const {
  GrpcStoreStats s;
  s.bytes_sent = bytes_sent_;
  s.bytes_received = bytes_received_;
  s.retries = retries_;
  s.duplicate_pushes = duplicates_;
  return s;
}

}  // namespace ps::worker
