#include "worker/rpc/grpc_store.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codec.h"
#include "common/hash.h"
#include "common/rpc/credentials.h"
#include "common/rpc/frame.h"
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

// A sparse pull's keys split by server without duplicates: positions[s] holds the positions
// (into `keys`, ascending) of the first occurrences of server s's keys, and `repeats` pairs
// each later occurrence's position with its first's. Only first occurrences are asked for;
// the answers land in the caller's rows at those positions, and repeats are copied from
// there, so no buffer of unique rows is needed.
//
// The keys seen are kept in an open-addressing table that the calling thread reuses (its
// entries carry the number of the call that wrote them, so a new call starts without clearing
// it): no per-call allocation or zero fill for the common sizes.
void SplitUniqueKeys(absl::Span<const uint64_t> keys, const common::Partitioner& partitioner,
                     std::vector<std::vector<uint32_t>>* positions,
                     std::vector<std::pair<uint32_t, uint32_t>>* repeats) {
  // An entry names the key by its position in `keys`: 8 bytes, so that the table of a large
  // pull stays in the L2 cache (the keys themselves are read there too).
  struct Seen {
    uint32_t position;
    uint32_t call;  // 0: never written
  };
  // Tables up to this many entries (8 MB) are kept per thread; bigger ones are per call.
  constexpr size_t kKeptEntries = size_t{1} << 20;
  thread_local std::vector<Seen> kept;
  thread_local uint32_t kept_call = 0;
  size_t capacity = 16;  // at most 5/8 full
  while (capacity * 5 < keys.size() * 8) capacity *= 2;
  std::vector<Seen> local;
  std::vector<Seen>* table = &local;
  uint32_t call = 1;
  if (capacity <= kKeptEntries) {
    table = &kept;
    if (kept.size() < capacity || ++kept_call == 0) {
      kept.assign(std::max(capacity, kept.size()), Seen{0, 0});
      kept_call = 1;
    }
    call = kept_call;
  } else {
    local.assign(capacity, Seen{0, 0});
  }
  const size_t mask = capacity - 1;
  const uint32_t servers = partitioner.num_servers();
  positions->resize(servers);
  for (std::vector<uint32_t>& p : *positions) {
    p.clear();
    p.reserve(keys.size() / servers + 16);
  }
  repeats->clear();
  Seen* seen = table->data();
  // The entry of the key this far ahead is prefetched: the table outgrows the L1 cache.
  constexpr size_t kAhead = 8;
  for (uint32_t i = 0; i < keys.size(); ++i) {
    if (i + kAhead < keys.size()) {
      __builtin_prefetch(&seen[common::Mix64(keys[i + kAhead]) & mask]);
    }
    const uint64_t key = keys[i];
    for (size_t h = common::Mix64(key) & mask;; h = (h + 1) & mask) {
      Seen& e = seen[h];
      if (e.call != call) {
        e = Seen{i, call};
        (*positions)[servers == 1 ? 0 : partitioner.ServerForKey(key)].push_back(i);
        break;
      }
      if (keys[e.position] == key) {
        repeats->emplace_back(i, e.position);
        break;
      }
    }
  }
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
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const std::string& address : config.cluster().servers()) {
    ASSIGN_OR_RETURN(auto channel, common::MakeChannel(address, config));
    channels.push_back(std::move(channel));
  }
  return CreateWithChannels(config, options, std::move(channels), metrics);
}

absl::StatusOr<std::unique_ptr<GrpcParameterStore>> GrpcParameterStore::CreateWithChannels(
    const JobConfig& config, const GrpcStoreOptions& options,
    std::vector<std::shared_ptr<grpc::Channel>> channels, common::metrics::Registry* metrics) {
  ASSIGN_OR_RETURN(common::Partitioner partitioner, common::Partitioner::Create(config));
  if (channels.size() != partitioner.num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat("the layout has ", partitioner.num_servers(),
                                                   " servers but ", channels.size(),
                                                   " addresses are given (cluster.servers)"));
  }
  return std::unique_ptr<GrpcParameterStore>(new GrpcParameterStore(
      config, options, std::move(partitioner), std::move(channels), metrics));
}

GrpcParameterStore::GrpcParameterStore(const JobConfig& config, const GrpcStoreOptions& options,
                                       common::Partitioner partitioner,
                                       std::vector<std::shared_ptr<grpc::Channel>> channels,
                                       common::metrics::Registry* metrics)
    : config_(config),
      options_(options),
      partitioner_(std::move(partitioner)),
      push_to_all_(config.training().has_staleness() || config.training().deterministic()),
      next_sequence_(new std::atomic<uint64_t>[channels.size()]),
      residuals_(options.max_residual_rows),
      own_registry_(metrics == nullptr ? std::make_unique<common::metrics::Registry>() : nullptr),
      metrics_(std::make_unique<Metrics>(metrics != nullptr ? metrics : own_registry_.get(),
                                         channels.size())) {
  for (size_t s = 0; s < channels.size(); ++s) {
    stubs_.push_back(ParameterServer::NewStub(channels[s]));
    data_stubs_.push_back(std::make_unique<grpc::GenericStub>(channels[s]));
    next_sequence_[s] = 1;
  }
}

GrpcParameterStore::~GrpcParameterStore() {
  absl::MutexLock lock(&queues_mu_);
  for (auto& queue : spare_queues_) {
    // Every call on a spare queue has ended: only the shutdown event is left to take.
    queue->Shutdown();
    void* tag;
    bool ok;
    while (queue->Next(&tag, &ok)) {
    }
  }
}

std::unique_ptr<grpc::CompletionQueue> GrpcParameterStore::TakeQueue() {
  {
    absl::MutexLock lock(&queues_mu_);
    if (!spare_queues_.empty()) {
      std::unique_ptr<grpc::CompletionQueue> queue = std::move(spare_queues_.back());
      spare_queues_.pop_back();
      return queue;
    }
  }
  return std::make_unique<grpc::CompletionQueue>();
}

void GrpcParameterStore::GiveQueue(std::unique_ptr<grpc::CompletionQueue> queue) {
  absl::MutexLock lock(&queues_mu_);
  spare_queues_.push_back(std::move(queue));
}

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

absl::Status GrpcParameterStore::FanOut(const std::vector<bool>& send, const StartCall& start) {
  const size_t n = stubs_.size();
  std::vector<absl::Status> status(n);
  std::vector<uint32_t> pending;
  for (uint32_t s = 0; s < n; ++s) {
    if (send[s]) pending.push_back(s);
  }
  std::vector<absl::Time> first_failure(n, absl::InfiniteFuture());
  std::unique_ptr<grpc::CompletionQueue> queue = TakeQueue();
  // Back to the spares only when no call of it is left running (every path below waits for
  // all the calls of an attempt).
  absl::Cleanup give_back = [&] { GiveQueue(std::move(queue)); };
  std::vector<grpc::Status> outcome(n);
  for (uint32_t attempt = 0; !pending.empty(); ++attempt) {
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
    for (uint32_t s : pending) {
      contexts[s] = std::make_unique<grpc::ClientContext>();
      contexts[s]->set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
      start(s, contexts[s].get(), queue.get(), &outcome[s],
            reinterpret_cast<void*>(static_cast<uintptr_t>(s) + 1));
    }
    for (size_t answered = 0; answered < pending.size(); ++answered) {
      void* tag;
      bool ok;
      // Each call has a deadline, so its tag comes; Next fails only after Shutdown.
      CHECK(queue->Next(&tag, &ok)) << "completion queue shut down while calls were running";
      const auto s = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(tag) - 1);
      status[s] = common::FromGrpcStatus(outcome[s]);
    }
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

// ---- Exchanges (PushPull frames) -----------------------------------------------------------

// One call's frames: headers and payload pieces per server, and where pulled values go.
struct GrpcParameterStore::Exchange {
  struct SparseOut {
    const common::SparsePull* pull;
    const common::TableInfo* info;
    // Per server: positions in pull->keys of the first occurrences it answers for.
    std::vector<std::vector<uint32_t>> positions;
    std::vector<std::pair<uint32_t, uint32_t>> repeats;  // (position, its first occurrence)
  };
  explicit Exchange(size_t n) : headers(n), payloads(n) {}

  std::vector<PushPullRequest> headers;
  // Per server, in header order: aliased gradient bytes, or bytes of `encoded`.
  std::vector<std::vector<absl::string_view>> payloads;
  // Owned encode buffers (stable addresses), taken from the store's spares. A list: empty,
  // it allocates nothing (a deque allocates two blocks up front, on every call).
  std::list<std::string> encoded;
  absl::flat_hash_map<std::string, const common::DensePull*> dense_out;
  absl::flat_hash_map<std::string, SparseOut> sparse_out;
  uint64_t sent = 0;
  uint64_t received = 0;
  uint64_t duplicates = 0;
};

std::string GrpcParameterStore::TakeBuffer() {
  absl::MutexLock lock(&buffers_mu_);
  if (spare_buffers_.empty()) return std::string();
  std::string b = std::move(spare_buffers_.back());
  spare_buffers_.pop_back();
  return b;
}

void GrpcParameterStore::GiveBuffer(std::string buffer) {
  buffer.clear();  // keeps its capacity: the pages stay mapped for the next call
  absl::MutexLock lock(&buffers_mu_);
  if (spare_buffers_.size() < 64) spare_buffers_.push_back(std::move(buffer));
}

absl::Status GrpcParameterStore::CheckPush(const common::PushBatch& batch) const {
  for (const common::DensePush& p : batch.dense) {
    const common::TableInfo* t = partitioner_.FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_DENSE || p.values.size() != t->numel) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': ", p.values.size(),
                                                     " values for a dense table of ", t->numel));
    }
  }
  for (const common::SparsePush& p : batch.sparse) {
    const common::TableInfo* t = partitioner_.FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_SPARSE || p.values.size() != p.keys.size() * t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': ", p.values.size(),
                                                     " values for ", p.keys.size(),
                                                     " sparse rows"));
    }
  }
  return absl::OkStatus();
}

// Float32 blocks go out as slices of the caller's gradient; 16-bit encodings (and error
// feedback) are encoded into buffers the exchange owns.
void GrpcParameterStore::AddDensePush(const common::DensePush& p, Exchange* x) {
  const common::TableInfo* t = partitioner_.FindTable(p.table);
  std::vector<TableValues*> per_server(stubs_.size(), nullptr);
  for (uint32_t b = 0; b < t->num_blocks; ++b) {
    const uint32_t s = partitioner_.ServerForBlock(*t, b);
    if (per_server[s] == nullptr) {
      per_server[s] = x->headers[s].add_push();
      per_server[s]->set_table(p.table);
      per_server[s]->set_encoding(EncodingOf(*t));
    }
    DenseBlock* block = per_server[s]->add_blocks();
    block->set_block_id(b);
    auto [begin, end] = partitioner_.BlockRange(*t, b);
    const absl::Span<const float> values = p.values.subspan(begin, end - begin);
    absl::string_view bytes(reinterpret_cast<const char*>(values.data()),
                            values.size() * sizeof(float));
    if (EncodingOf(*t) != ENCODING_FLOAT32) {
      std::string& out = x->encoded.emplace_back(TakeBuffer());
      if (ErrorFeedback(*t)) {
        residuals_.AppendDense(p.table, t->numel, begin, values, EncodingOf(*t), &out);
      } else {
        common::AppendFloats(values, EncodingOf(*t), &out);
      }
      bytes = out;
    }
    block->set_payload_bytes(bytes.size());
    x->payloads[s].push_back(bytes);
    x->sent += bytes.size();
  }
}

// Each server's rows are gathered (and encoded) into one buffer the exchange owns.
void GrpcParameterStore::AddSparsePush(const common::SparsePush& p,
                                       std::vector<std::vector<uint32_t>>* positions,
                                       Exchange* x) {
  const common::TableInfo* t = partitioner_.FindTable(p.table);
  partitioner_.SplitKeysByServer(p.keys, positions);
  for (uint32_t s = 0; s < stubs_.size(); ++s) {
    if ((*positions)[s].empty()) continue;
    TableValues* tv = x->headers[s].add_push();
    tv->set_table(p.table);
    tv->set_encoding(EncodingOf(*t));
    if ((*positions)[s].size() == p.keys.size() && EncodingOf(*t) == ENCODING_FLOAT32) {
      // Every row goes to this server, in order: the caller's keys and gradient as they are.
      tv->mutable_keys()->Add(p.keys.begin(), p.keys.end());
      absl::string_view rows(reinterpret_cast<const char*>(p.values.data()),
                             p.values.size() * sizeof(float));
      tv->set_rows_bytes(rows.size());
      x->payloads[s].push_back(rows);
      x->sent += rows.size();
      continue;
    }
    std::string& rows = x->encoded.emplace_back(TakeBuffer());
    rows.reserve((*positions)[s].size() * t->dim * common::BytesPerValue(EncodingOf(*t)));
    tv->mutable_keys()->Reserve(static_cast<int>((*positions)[s].size()));
    for (uint32_t i : (*positions)[s]) {
      tv->mutable_keys()->AddAlreadyReserved(p.keys[i]);
      auto row = p.values.subspan(size_t{i} * t->dim, t->dim);
      if (ErrorFeedback(*t)) {
        residuals_.AppendSparseRow(p.table, p.keys[i], row, EncodingOf(*t), &rows);
      } else {
        common::AppendFloats(row, EncodingOf(*t), &rows);
      }
    }
    tv->set_rows_bytes(rows.size());
    x->payloads[s].push_back(rows);
    x->sent += rows.size();
  }
}

absl::Status GrpcParameterStore::AddPush(const common::PushBatch& batch,
                                         const common::PushOptions& options, Exchange* x) {
  // Resolve and check everything before taking sequences or moving residuals.
  RETURN_IF_ERROR(CheckPush(batch));
  {
    // Encoding happens here, once per call; FanOut's retries resend the same frames.
    absl::MutexLock residuals_lock(&residuals_mu_);
    for (const common::DensePush& p : batch.dense) AddDensePush(p, x);
    std::vector<std::vector<uint32_t>> positions;
    for (const common::SparsePush& p : batch.sparse) AddSparsePush(p, &positions, x);
  }
  // A push with nothing in it is a clock tick: every server hears it.
  const bool tick = batch.dense.empty() && batch.sparse.empty();
  for (uint32_t s = 0; s < stubs_.size(); ++s) {
    PushPullRequest& h = x->headers[s];
    if (h.push_size() == 0 && !push_to_all_ && !tick) continue;
    h.set_has_push(true);
    h.set_is_delta(options.is_delta);
    *h.mutable_header() = Header(options.clock, next_sequence_[s].fetch_add(1));
  }
  return absl::OkStatus();
}

absl::Status GrpcParameterStore::AddPull(const common::PullBatch& batch,
                                         const common::PullOptions& options, Exchange* x) {
  const size_t n = stubs_.size();
  for (const common::DensePull& p : batch.dense) {
    const common::TableInfo* t = partitioner_.FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_DENSE || p.out.size() != t->numel) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': buffer of ",
                                                     p.out.size(), " floats for a dense table of ",
                                                     t->numel));
    }
    x->dense_out[p.table] = &p;
    for (uint32_t s = 0; s < n; ++s) {
      std::vector<uint32_t> blocks = partitioner_.BlocksOnServer(*t, s);
      if (blocks.empty()) continue;
      TablePullRequest* tr = x->headers[s].add_pull();
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
    Exchange::SparseOut& so = x->sparse_out[p.table];
    so.pull = &p;
    so.info = t;
    SplitUniqueKeys(p.keys, partitioner_, &so.positions, &so.repeats);
    for (uint32_t s = 0; s < n; ++s) {
      if (so.positions[s].empty()) continue;
      TablePullRequest* tr = x->headers[s].add_pull();
      tr->set_table(p.table);
      tr->set_encoding(EncodingOf(*t));
      auto* keys = tr->mutable_keys();
      if (so.positions[s].size() == p.keys.size()) {  // every key, in order
        keys->Add(p.keys.begin(), p.keys.end());
        continue;
      }
      keys->Reserve(static_cast<int>(so.positions[s].size()));
      for (uint32_t i : so.positions[s]) keys->AddAlreadyReserved(p.keys[i]);
    }
  }
  return absl::OkStatus();
}

absl::Status GrpcParameterStore::ReadAnswer(uint32_t s, const grpc::ByteBuffer& answer,
                                            Exchange* x) {
  PushPullResponse header;
  common::FrameReader reader;
  if (absl::Status st = common::FrameReader::Open(answer, size_t{1} << 30, &header, &reader);
      !st.ok()) {
    return BadResponse(s, st.message());
  }
  if (x->headers[s].has_push() && header.push().duplicate()) ++x->duplicates;
  uint64_t total = 0;
  for (const TableValues& tv : header.pull().tables()) {
    for (const DenseBlock& block : tv.blocks()) total += block.payload_bytes();
    total += tv.rows_bytes();
  }
  if (total != reader.remaining()) {
    return BadResponse(s, absl::StrCat("payload lengths of ", total, " bytes for ",
                                       reader.remaining(), " payload bytes"));
  }
  std::string scratch;
  // Float32 blocks are copied after every part is checked, possibly in parallel.
  const common::FrameReader start = reader;
  std::vector<BlockCopy> copies;
  for (const TableValues& tv : header.pull().tables()) {
    const size_t bpv = common::BytesPerValue(tv.encoding());
    if (bpv == 0) return BadResponse(s, "unknown encoding");
    if (auto it = x->dense_out.find(tv.table()); it != x->dense_out.end()) {
      const common::TableInfo* t = partitioner_.FindTable(tv.table());
      for (const DenseBlock& block : tv.blocks()) {
        if (block.block_id() >= t->num_blocks ||
            partitioner_.ServerForBlock(*t, block.block_id()) != s) {
          return BadResponse(s, absl::StrCat("unexpected block ", block.block_id(), " of '",
                                             tv.table(), "'"));
        }
        auto [begin, end] = partitioner_.BlockRange(*t, block.block_id());
        if (block.payload_bytes() != (end - begin) * bpv) {
          return BadResponse(s, absl::StrCat(block.payload_bytes(), " bytes for block ",
                                             block.block_id(), " of '", tv.table(), "'"));
        }
        float* out = it->second->out.data() + begin;
        if (tv.encoding() == ENCODING_FLOAT32) {
          // The one copy (below): from gRPC's receive slices into the caller's buffer.
          copies.push_back(BlockCopy{total - reader.remaining(), block.payload_bytes(),
                                     reinterpret_cast<char*>(out)});
          reader.Skip(block.payload_bytes());
        } else {
          scratch.resize(block.payload_bytes());
          reader.CopyTo(scratch.size(), scratch.data());
          RETURN_IF_ERROR(common::DecodeFloats(scratch, tv.encoding(),
                                               absl::MakeSpan(out, end - begin)));
        }
        x->received += block.payload_bytes();
      }
    } else if (auto it = x->sparse_out.find(tv.table()); it != x->sparse_out.end()) {
      Exchange::SparseOut& so = it->second;
      const auto& pos = so.positions[s];
      const size_t dim = so.info->dim;
      // Rows come in the order of the keys asked for; the keys are not echoed.
      if (tv.keys_size() != 0 || tv.rows_bytes() != pos.size() * dim * bpv) {
        return BadResponse(s, absl::StrCat(tv.rows_bytes(), " bytes and ", tv.keys_size(),
                                           " keys of '", tv.table(), "' for ", pos.size(),
                                           " rows"));
      }
      float* out = so.pull->out.data();
      const size_t row_bytes = dim * sizeof(float);
      if (tv.encoding() == ENCODING_FLOAT32) {
        // The one copy: from gRPC's receive slices into the caller's rows.
        // Runs of consecutive positions (all of them when one server has every key, which
        // then has no repeats) are copied at once.
        for (size_t j = 0; j < pos.size();) {
          size_t end = j + 1;
          while (end < pos.size() && pos[end] == pos[end - 1] + 1) ++end;
          reader.CopyTo((end - j) * row_bytes,
                        reinterpret_cast<char*>(out + size_t{pos[j]} * dim));
          j = end;
        }
      } else {
        scratch.resize(tv.rows_bytes());
        reader.CopyTo(scratch.size(), scratch.data());
        std::vector<float> decoded(pos.size() * dim);
        RETURN_IF_ERROR(common::DecodeFloats(scratch, tv.encoding(), absl::MakeSpan(decoded)));
        for (size_t j = 0; j < pos.size(); ++j) {
          std::memcpy(out + size_t{pos[j]} * dim, decoded.data() + j * dim, row_bytes);
        }
      }
      x->received += tv.rows_bytes();
    } else {
      return BadResponse(s, absl::StrCat("unrequested table '", tv.table(), "'"));
    }
  }
  CopyBlocks(start, copies);
  return absl::OkStatus();
}

void GrpcParameterStore::CopyBlocks(const common::FrameReader& reader,
                                    absl::Span<const BlockCopy> copies) const {
  // Each run of blocks walks its own copy of the reader (the slices are shared, refcounted).
  auto copy_run = [&reader](absl::Span<const BlockCopy> run) {
    common::FrameReader r = reader;
    size_t at = 0;
    for (const BlockCopy& c : run) {
      r.Skip(c.offset - at);
      r.CopyTo(c.n, c.dest);
      at = c.offset + c.n;
    }
  };
  size_t bytes = 0;
  for (const BlockCopy& c : copies) bytes += c.n;
  if (options_.parallel_copy_bytes == 0 || bytes < options_.parallel_copy_bytes) {
    copy_run(copies);
    return;
  }
  // Asked once: glibc answers hardware_concurrency() by opening and reading a sysfs file,
  // three system calls that were 16% of a 4 KB push's client CPU when asked on every answer.
  static const size_t kThreads =
      std::min<size_t>(4, std::max(1u, std::thread::hardware_concurrency()));
  const size_t threads = kThreads;
  if (threads < 2) {
    copy_run(copies);
    return;
  }
  // Contiguous runs of about equal bytes; helpers take the first ones, this thread the last.
  std::vector<std::thread> helpers;
  size_t begin = 0;
  size_t left = bytes;
  for (size_t t = threads; t > 1 && begin < copies.size(); --t) {
    const size_t share = left / t;
    size_t end = begin;
    size_t run = 0;
    while (end < copies.size() && (run < share || end == begin)) run += copies[end++].n;
    helpers.emplace_back(copy_run, copies.subspan(begin, end - begin));
    left -= run;
    begin = end;
  }
  copy_run(copies.subspan(begin));
  for (std::thread& h : helpers) h.join();
}

absl::Status GrpcParameterStore::Run(const common::PushBatch* push,
                                     const common::PushOptions& push_options,
                                     const common::PullBatch* pull,
                                     const common::PullOptions& pull_options) {
  const size_t n = stubs_.size();
  Exchange x(n);
  absl::Cleanup give_back = [&] {
    for (std::string& b : x.encoded) GiveBuffer(std::move(b));
  };
  if (pull != nullptr) RETURN_IF_ERROR(AddPull(*pull, pull_options, &x));
  if (push != nullptr) RETURN_IF_ERROR(AddPush(*push, push_options, &x));
  for (PushPullRequest& h : x.headers) {
    h.set_pull_clock(pull_options.clock);
    if (!h.has_push()) *h.mutable_header() = Header(pull_options.clock, 0);
  }
  std::vector<bool> send(n);
  std::vector<grpc::ByteBuffer> requests(n), answers(n);
  for (uint32_t s = 0; s < n; ++s) {
    send[s] = x.headers[s].has_push() || x.headers[s].pull_size() > 0;
    if (!send[s]) continue;
    common::FrameBuilder frame(x.headers[s]);
    for (absl::string_view bytes : x.payloads[s]) frame.AddAliased(bytes);
    requests[s] = frame.Build();
  }
  static const std::string kMethod = "/ps.ParameterServer/PushPull";
  std::vector<std::unique_ptr<grpc::GenericClientAsyncResponseReader>> calls(n);
  RETURN_IF_ERROR(FanOut(send, [&](uint32_t s, grpc::ClientContext* context,
                                   grpc::CompletionQueue* cq, grpc::Status* status, void* tag) {
    answers[s].Clear();
    calls[s] = data_stubs_[s]->PrepareUnaryCall(context, kMethod, requests[s], cq);
    calls[s]->StartCall();
    calls[s]->Finish(&answers[s], status, tag);
  }));
  for (uint32_t s = 0; s < n; ++s) {
    if (send[s]) RETURN_IF_ERROR(ReadAnswer(s, answers[s], &x));
  }
  // Repeated keys get the row their first occurrence received.
  for (auto& [name, so] : x.sparse_out) {
    const size_t dim = so.info->dim;
    float* out = so.pull->out.data();
    for (auto [i, first] : so.repeats) {
      std::memcpy(out + size_t{i} * dim, out + size_t{first} * dim, dim * sizeof(float));
    }
  }
  duplicates_ += x.duplicates;
  metrics_->duplicates->Increment(x.duplicates);
  bytes_sent_ += x.sent;
  metrics_->bytes_sent->Increment(x.sent);
  bytes_received_ += x.received;
  metrics_->bytes_received->Increment(x.received);
  return absl::OkStatus();
}

absl::Status GrpcParameterStore::Pull(const common::PullBatch& batch,
                                      const common::PullOptions& options) {
  return Run(nullptr, common::PushOptions(), &batch, options);
}

absl::Status GrpcParameterStore::Push(const common::PushBatch& batch,
                                      const common::PushOptions& options) {
  return Run(&batch, options, nullptr, common::PullOptions());
}

absl::Status GrpcParameterStore::PushPull(const common::PushBatch& push,
                                          const common::PushOptions& push_options,
                                          const common::PullBatch& pull,
                                          const common::PullOptions& pull_options) {
  return Run(&push, push_options, &pull, pull_options);
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
  std::vector<HeartbeatResponse> responses(n);
  std::vector<std::unique_ptr<grpc::ClientAsyncResponseReaderInterface<HeartbeatResponse>>>
      calls(n);
  RETURN_IF_ERROR(FanOut(std::vector<bool>(n, true), [&](uint32_t s, grpc::ClientContext* context,
                                                          grpc::CompletionQueue* cq,
                                                          grpc::Status* status, void* tag) {
    responses[s].Clear();
    calls[s] = stubs_[s]->AsyncHeartbeat(context, requests[s], cq);
    calls[s]->Finish(&responses[s], status, tag);
  }));
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

std::string GrpcStoreStats::Summary() const {
  return absl::StrCat("sent ", bytes_sent, " bytes, received ", bytes_received, " bytes, ",
                      retries, " retries");
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
