#include "worker/rpc/grpc_store.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
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
#include "common/rpc/parse_bound.h"
#include "common/rpc/unary_call.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "worker/rpc/grpc_async_calls.h"
#include "worker/rpc/grpc_store_exchange.h"
#include "worker/rpc/unanswered.h"

namespace ps::worker {

namespace {
// The most a server's answer to a control call (a heartbeat) may take parsed.
constexpr size_t kMaxControlAnswerBytes = size_t{1} << 20;
}  // namespace
namespace {

bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

// RESOURCE_EXHAUSTED that the server marked as "busy, send it again" (it held too many
// requests; this one changed nothing). Every other RESOURCE_EXHAUSTED (a message over the
// size limit, too many waiting pulls) says the request itself cannot be served: final.
bool ServerBusy(const absl::Status& s, const grpc::ClientContext& context) {
  return absl::IsResourceExhausted(s) &&
         context.GetServerTrailingMetadata().count(common::kServerBusyMetadata) > 0;
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
        bytes_shared(r->AddCounter(
            "ps_worker_bytes_shared_total",
            "Of the parameter bytes pushed and pulled, those that went through shared memory "
            "with a server on this host.")),
        calls_shared(r->AddCounter(
            "ps_worker_calls_shared_total",
            "Calls to a server on this host answered through its shared-memory channel instead "
            "of gRPC (one per server a step's call reaches).")),
        duplicates(r->AddCounter(
            "ps_worker_push_duplicates_total",
            "Push answers saying the server had applied the push already (after a retry).")) {
    auto* handoffs = r->AddCounterFamily(
        "ps_worker_handoffs_total",
        "Calls through shared memory handing more than 32 KB, by the stores that wrote their "
        "bytes: plain or streamed (non-temporal; rpc.handoff).",
        {"way"});
    handoff_plain = handoffs->WithLabels({"plain"});
    handoff_streamed = handoffs->WithLabels({"streamed"});
    auto* family = r->AddCounterFamily(
        "ps_worker_rpc_retries_total",
        "RPCs to each server retried after UNAVAILABLE, DEADLINE_EXCEEDED or a busy server's "
        "RESOURCE_EXHAUSTED.",
        {"server"});
    for (size_t s = 0; s < num_servers; ++s) {
      retries.push_back(family->WithLabels({absl::StrCat(s)}));
    }
  }

  common::metrics::Family<common::metrics::Counter>* const failures;
  common::metrics::Counter* const bytes_sent;
  common::metrics::Counter* const bytes_received;
  common::metrics::Counter* const bytes_shared;
  common::metrics::Counter* const calls_shared;
  common::metrics::Counter* const duplicates;
  common::metrics::Counter* handoff_plain;
  common::metrics::Counter* handoff_streamed;
  std::vector<common::metrics::Counter*> retries;  // per server
};

absl::StatusOr<std::unique_ptr<GrpcParameterStore>> GrpcParameterStore::Create(
    const JobConfig& config, const GrpcStoreOptions& options, common::metrics::Registry* metrics) {
  ASSIGN_OR_RETURN(auto credentials, common::MakeChannelCredentials(config.security()));
  grpc::ChannelArguments args = common::MakeChannelArguments(config.rpc());
  // The store retries by itself (back-off, exactly-once by sequence numbers): gRPC's retry
  // layer only added its per-call bookkeeping to every call. A call that never reached its
  // server comes back UNAVAILABLE and FanOut retries it.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const std::string& address : config.cluster().servers()) {
    channels.push_back(grpc::CreateCustomChannel(address, credentials, args));
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
  if (options.max_sequence_lead < 1 || options.max_sequence_lead > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("max_sequence_lead ", options.max_sequence_lead,
                                                   " is outside 1..1024"));
  }
  if (options.shared_memory_reask <= absl::ZeroDuration()) {
    // Each ask costs the server a segment's making: a refused one is not asked again at once.
    return absl::InvalidArgumentError(
        absl::StrCat("shared_memory_reask ", absl::FormatDuration(options.shared_memory_reask),
                     " is not positive"));
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
    data_stubs_.push_back(std::make_unique<grpc::GenericStub>(channels[s]));
    next_sequence_[s] = 1;
    handoff_.push_back(std::make_unique<common::HandoffChooser>());
    handoff_.push_back(std::make_unique<common::HandoffChooser>());
  }
  absl::MutexLock lock(&shared_mu_);
  shared_.resize(channels.size());
}

GrpcParameterStore::~GrpcParameterStore() {
  absl::MutexLock lock(&queues_mu_);
  spare_calls_.clear();  // nothing pending in them: each only shuts its queue down
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

std::unique_ptr<GrpcParameterStore::AsyncCalls> GrpcParameterStore::NewAsyncCalls() {
  return std::make_unique<AsyncCalls>(this);
}

std::unique_ptr<GrpcParameterStore::AsyncCalls> GrpcParameterStore::TakeCalls() {
  {
    absl::MutexLock lock(&queues_mu_);
    if (!spare_calls_.empty()) {
      std::unique_ptr<AsyncCalls> calls = std::move(spare_calls_.back());
      spare_calls_.pop_back();
      return calls;
    }
  }
  return NewAsyncCalls();
}

void GrpcParameterStore::GiveCalls(std::unique_ptr<AsyncCalls> calls) {
  // A blocking call reaps its own call on every path, so nothing is pending here.
  DCHECK_EQ(calls->pending(), 0u);
  absl::MutexLock lock(&queues_mu_);
  spare_calls_.push_back(std::move(calls));
}

RequestHeader GrpcParameterStore::Header(int64_t clock, uint64_t sequence) const {
  RequestHeader h;
  h.set_worker_id(options_.worker_id);
  h.set_worker_incarnation(options_.worker_incarnation);
  h.set_sequence(sequence);
  h.set_clock(clock);
  h.set_done_clock(done_clock_.load(std::memory_order_relaxed));
  h.set_layout_fingerprint(partitioner_.layout_fingerprint());
  return h;
}

void GrpcParameterStore::NoteDoneClock(int64_t clock) {
  int64_t done = done_clock_.load(std::memory_order_relaxed);
  while (clock > done && !done_clock_.compare_exchange_weak(done, clock)) {
  }
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

void GrpcParameterStore::CountFailure(uint32_t s, const absl::Status& status) {
  metrics_->failures->WithLabels({absl::StrCat(s), absl::StatusCodeToString(status.code())})
      ->Increment();
}

void GrpcParameterStore::CountSharedCall() {
  ++calls_shared_;
  metrics_->calls_shared->Increment();
}

void GrpcParameterStore::CountHandoff(bool streamed) {
  ++handoffs_[streamed ? 1 : 0];
  (streamed ? metrics_->handoff_streamed : metrics_->handoff_plain)->Increment();
}

void GrpcParameterStore::CountRetry(uint32_t s) {
  ++retries_;
  metrics_->retries[s]->Increment();
}

void GrpcParameterStore::CountExchange(const Exchange& x) {
  duplicates_ += x.duplicates;
  metrics_->duplicates->Increment(x.duplicates);
  bytes_sent_ += x.sent;
  metrics_->bytes_sent->Increment(x.sent);
  bytes_received_ += x.received;
  bytes_shared_ += x.shared_bytes;
  bytes_lent_ += x.lent_bytes;
  metrics_->bytes_shared->Increment(x.shared_bytes);
  metrics_->bytes_received->Increment(x.received);
}

absl::Status GrpcParameterStore::FanOut(const std::vector<bool>& send, const StartCall& start) {
  const size_t n = data_stubs_.size();
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
    // Declared after the contexts, so destroyed before them (each lives in its context's call).
    std::vector<std::shared_ptr<void>> readers(n);
    for (uint32_t s : pending) {
      contexts[s] = std::make_unique<grpc::ClientContext>();
      contexts[s]->set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
      readers[s] = start(s, contexts[s].get(), queue.get(), &outcome[s],
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
      const bool again = (Retryable(status[s]) || ServerBusy(status[s], *contexts[s])) &&
                         !(options_.give_up_retries && options_.give_up_retries());
      if (!again || attempt >= options_.max_retries) {
        return common::Annotate(status[s], absl::StrCat("server ", s, " (",
                                                        static_cast<uint32_t>(config_.cluster().servers_size()) > s
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

absl::Status GrpcParameterStore::Run(const common::PushBatch* push,
                                     const common::PushOptions& push_options,
                                     const common::PullBatch* pull,
                                     const common::PullOptions& pull_options) {
  // The answers come to the AsyncCalls' queue, which this thread reads itself (it is gRPC's
  // poller while it waits), so an answer wakes no other thread on its way here.
  std::unique_ptr<AsyncCalls> calls = TakeCalls();
  absl::Cleanup give_back = [&] { GiveCalls(std::move(calls)); };
  ASSIGN_OR_RETURN(const AsyncCalls::CallId id,
                   calls->Start(push, push_options, pull, pull_options, /*borrow_pull=*/true));
  return calls->Wait(id);
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
  options.busy_poll = absl::Microseconds(config.rpc().busy_poll_us());
  options.shared_memory_bytes = size_t{config.rpc().shared_memory_mb()} << 20;
  options.shared_memory_calls = config.rpc().shared_memory_calls();
  options.overlap_push_copy = config.rpc().overlap_push_copy();
  options.handoff = config.rpc().handoff();
  options.lend_push_buffers = config.rpc().lend_push_buffers();
  options.parallel_copy_bytes = static_cast<size_t>(config.rpc().parallel_copy_bytes());
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
  const size_t n = data_stubs_.size();
  std::vector<HeartbeatRequest> requests(n);
  for (auto& r : requests) {
    *r.mutable_header() = Header(0, 0);
    r.set_epoch(epoch);
    r.set_data_offset(offset);
    r.set_finished(finished);
  }
  // By the generic stub, parsed here within a bound (common/rpc/parse_bound.h): a server's
  // answer of many small unknown fields took tens of times its size parsed (found in review,
  // 2026-12-06), and a heartbeat's answer is three numbers.
  std::vector<grpc::ByteBuffer> answers(n);
  RETURN_IF_ERROR(FanOut(
      std::vector<bool>(n, true), [&](uint32_t s, grpc::ClientContext* context,
                                      grpc::CompletionQueue* cq, grpc::Status* status, void* tag) {
        answers[s].Clear();
        grpc::ByteBuffer request;
        bool own = false;
        (void)grpc::SerializationTraits<HeartbeatRequest>::Serialize(requests[s], &request, &own);
        std::unique_ptr<grpc::ClientAsyncResponseReader<grpc::ByteBuffer>> call =
            data_stubs_[s]->PrepareUnaryCall(context, "/ps.ParameterServer/Heartbeat", request, cq);
        call->StartCall();
        call->Finish(&answers[s], status, tag);
        return std::shared_ptr<void>(std::move(call));
      }));
  std::vector<HeartbeatResponse> responses(n);
  for (size_t s = 0; s < n; ++s) {
    if (absl::Status read = common::ParseWithin(&answers[s], kMaxControlAnswerBytes, &responses[s]);
        !read.ok()) {
      return absl::InternalError(
          absl::StrCat("server ", s, " answered a heartbeat wrongly: ", read.message()));
    }
  }
  Position saved;
  for (size_t s = 0; s < n; ++s) {
    const HeartbeatResponse& r = responses[s];
    // A clock is a count of steps: a negative one, or one near 2^63 (which the step after
    // it overflows), is a server's bug or lie, and must not reach the other servers.
    if (r.clock() < 0 || r.clock() > common::kMaxClock) {
      return absl::InternalError(
          absl::StrCat("server ", s, " remembers this worker at clock ", r.clock()));
    }
    if (std::make_pair(r.epoch(), r.data_offset()) > std::make_pair(saved.epoch, saved.offset)) {
      saved.epoch = r.epoch();
      saved.offset = r.data_offset();
    }
    saved.clock = std::max(saved.clock, r.clock());
  }
  // Before this process's first push, the clock the servers remember is the one it resumes
  // from; later, a server may have applied a push of this process that another has not yet.
  if (!pushed_.load(std::memory_order_relaxed)) NoteDoneClock(saved.clock);
  return saved;
}

absl::StatusOr<common::WorkerPosition> GrpcParameterStore::ReportPosition(uint32_t epoch,
                                                                          uint64_t offset) {
  return Heartbeat(epoch, offset, /*finished=*/false);
}

absl::Status GrpcParameterStore::Finish() {
  return Heartbeat(0, 0, /*finished=*/true).status();
}

absl::Status GrpcParameterStore::ServerInfo(uint32_t s, grpc::ClientContext* context,
                                            const ServerInfoRequest& request,
                                            ServerInfoResponse* response) {
  return common::BoundedUnaryCall(*data_stubs_[s], context, "/ps.ParameterServer/ServerInfo",
                                  request, kMaxControlAnswerBytes, response);
}

absl::Status GrpcParameterStore::WaitForServers(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<bool> ready(data_stubs_.size(), false);
  absl::Status last_error;
  while (true) {
    for (uint32_t s = 0; s < data_stubs_.size(); ++s) {
      if (ready[s]) continue;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(2))));
      context.set_wait_for_ready(true);
      ServerInfoRequest request;
      ServerInfoResponse response;
      absl::Status st = ServerInfo(s, &context, request, &response);
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
          last_error = ServerInfo(s, &probe, request, &response);
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
  return absl::StrCat(
      "sent ", bytes_sent, " bytes, received ", bytes_received, " bytes, ", retries, " retries",
      bytes_shared > 0 ? absl::StrCat(", ", bytes_shared, " bytes through shared memory") : "",
      payloads_following + payloads_whole > 0
          ? absl::StrCat(", ", payloads_following, " of ", payloads_following + payloads_whole,
                         " push payloads that could follow their call did")
          : "");
}

GrpcStoreStats GrpcParameterStore::stats() const {
  GrpcStoreStats s;
  s.bytes_sent = bytes_sent_;
  s.bytes_received = bytes_received_;
  s.retries = retries_;
  s.duplicate_pushes = duplicates_;
  s.bytes_shared = bytes_shared_;
  s.bytes_lent = bytes_lent_;
  s.calls_shared = calls_shared_;
  s.handoffs_plain = handoffs_[0];
  s.handoffs_streamed = handoffs_[1];
  s.handoffs_served_cpu = handoffs_served_cpu_;
  s.payloads_whole = following_[0];
  s.payloads_following = following_[1];
  return s;
}

}  // namespace ps::worker
