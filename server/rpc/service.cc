#include "server/rpc/service.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ps::server {
namespace {

RequestInfo InfoOf(const RequestHeader& h) {
  RequestInfo info;
  info.worker_id = h.worker_id();
  info.worker_incarnation = h.worker_incarnation();
  info.sequence = h.sequence();
  info.clock = h.clock();
  info.layout_fingerprint = h.layout_fingerprint();
  return info;
}

absl::Status CheckEncoding(Shard* shard, Encoding e) {
  if (common::IsKnownEncoding(e)) return absl::OkStatus();
  return shard->Reject("bad_encoding",
                       absl::InvalidArgumentError(absl::StrCat("unknown payload encoding ", e)));
}

absl::Span<const uint64_t> KeysOf(const google::protobuf::RepeatedField<uint64_t>& keys) {
  return absl::MakeConstSpan(keys.data(), keys.size());
}

// The float32 values of a payload read in place (no copy) when the bytes are float32 and
// aligned for float, as protobuf's heap-allocated strings are; empty otherwise (decode then).
absl::Span<const float> Floats(const std::string& bytes, Encoding encoding) {
  static_assert(absl::little_endian::IsLittleEndian(), "the wire format is little-endian");
  if (encoding != ENCODING_FLOAT32 || bytes.empty() ||
      reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) != 0) {
    return {};
  }
  return absl::Span<const float>(reinterpret_cast<const float*>(bytes.data()),
                                 bytes.size() / sizeof(float));
}

// Finishes `reactor` with `status`.
void Finish(grpc::ServerUnaryReactor* reactor, const absl::Status& status) {
  reactor->Finish(common::ToGrpcStatus(status));
}

constexpr const char* kMethodNames[] = {"pull", "push"};

}  // namespace

// ---- Metrics ----------------------------------------------------------------------------

struct ParameterServerService::Metrics {
  explicit Metrics(common::metrics::Registry* r)
      : requests(r->AddCounterFamily("ps_server_requests_total",
                                     "Requests answered, by method and status code.",
                                     {"method", "code"})),
        refused(r->AddCounterFamily(
            "ps_server_requests_refused_total",
            "Pulls and pushes answered with an error, by method, status code and reason "
            "(nonfinite, bad_size, unknown_table, wrong_kind, bad_block, wrong_server, "
            "layout_mismatch, stale_incarnation, bad_worker, bad_sequence, bad_clock, clock_ahead, identity, "
            "bad_encoding, bound_timeout, turn_timeout, other).",
            {"method", "code", "reason"})) {
    latency[kPull] = r->AddHistogram(
        "ps_server_pull_latency_seconds",
        "Pulls from arrival to answer (queueing and consistency-bound waits included), seconds.",
        common::metrics::LatencyBuckets());
    latency[kPush] =
        r->AddHistogram("ps_server_push_latency_seconds",
                        "Pushes from arrival to answer (queueing and optimizer included), seconds.",
                        common::metrics::LatencyBuckets());
    pull_wait = r->AddHistogram("ps_server_pull_wait_seconds",
                                "Time workers' pulls waited for the consistency bound, seconds.",
                                common::metrics::LatencyBuckets());
    auto* request_family =
        r->AddCounterFamily("ps_server_request_bytes_total",
                            "Bytes of pull and push requests (protobuf encoded).", {"method"});
    auto* response_family =
        r->AddCounterFamily("ps_server_response_bytes_total",
                            "Bytes of pull and push answers (protobuf encoded).", {"method"});
    for (Method m : {kPull, kPush}) {
      request_bytes[m] = request_family->WithLabels({kMethodNames[m]});
      response_bytes[m] = response_family->WithLabels({kMethodNames[m]});
      ok[m] = requests->WithLabels({kMethodNames[m], "OK"});
    }
  }

  common::metrics::Family<common::metrics::Counter>* const requests;
  common::metrics::Family<common::metrics::Counter>* const refused;
  common::metrics::Histogram* latency[2];
  common::metrics::Histogram* pull_wait;
  // Children looked up once: the hot path only adds.
  common::metrics::Counter* request_bytes[2];
  common::metrics::Counter* response_bytes[2];
  common::metrics::Counter* ok[2];
};

ParameterServerService::ParameterServerService(Shard* shard, const ServiceOptions& options,
                                               ServiceHooks hooks,
                                               common::metrics::Registry* metrics)
    : shard_(shard),
      options_(options),
      hooks_(std::move(hooks)),
      auth_(options.auth),
      own_registry_(metrics == nullptr ? std::make_unique<common::metrics::Registry>() : nullptr),
      metrics_(std::make_unique<Metrics>(metrics != nullptr ? metrics : own_registry_.get())),
      pool_(options.num_threads) {}

ParameterServerService::~ParameterServerService() = default;

void ParameterServerService::Record(Method method, absl::Time arrived, const absl::Status& status,
                                    size_t bytes_in, size_t bytes_out) {
  metrics_->latency[method]->Observe(absl::ToDoubleSeconds(absl::Now() - arrived));
  metrics_->request_bytes[method]->Increment(bytes_in);
  metrics_->response_bytes[method]->Increment(bytes_out);
  if (status.ok()) {
    metrics_->ok[method]->Increment();
    return;
  }
  const std::string code = absl::StatusCodeToString(status.code());
  std::string reason = RejectionReason(status);
  if (reason.empty()) reason = "other";
  metrics_->requests->WithLabels({kMethodNames[method], code})->Increment();
  metrics_->refused->WithLabels({kMethodNames[method], code, reason})->Increment();
}

void ParameterServerService::CountCall(const char* method, const absl::Status& status) {
  metrics_->requests->WithLabels({method, absl::StatusCodeToString(status.code())})->Increment();
}

absl::Status ParameterServerService::CheckWorker(const grpc::CallbackServerContext& context,
                                                 int32_t worker_id, const char* method) {
  absl::Status status = auth_.CheckWorker(auth_.Identify(context), worker_id, method);
  return status.ok() ? status : shard_->Reject("identity", std::move(status));
}

// ---- Pull -------------------------------------------------------------------------------

absl::Status ParameterServerService::HandlePull(const PullRequest& request, absl::Time deadline,
                                                PullResponse* response) {
  return ServePull(request, deadline, response, absl::Now());
}

absl::Status ParameterServerService::ServePull(const PullRequest& request, absl::Time deadline,
                                               PullResponse* response, absl::Time arrived) {
  const absl::Status status = PullImpl(request, deadline, response);
  Record(kPull, arrived, status, request.ByteSizeLong(),
         status.ok() ? response->ByteSizeLong() : 0);
  return status;
}

absl::Status ParameterServerService::PullImpl(const PullRequest& request, absl::Time deadline,
                                              PullResponse* response) {
  const RequestInfo info = InfoOf(request.header());
  RETURN_IF_ERROR(shard_->CheckLayout(info));
  // Phase 1: check every part before waiting or reading anything.
  for (const TablePullRequest& t : request.tables()) {
    RETURN_IF_ERROR(CheckEncoding(shard_, t.encoding()));
    ASSIGN_OR_RETURN(TablePart * part, shard_->FindTable(t.table()));
    if (part->info().kind == TABLE_KIND_DENSE) {
      if (!t.keys().empty()) {
        return shard_->Reject(
            "wrong_kind", absl::InvalidArgumentError(absl::StrCat(
                              "table '", t.table(), "' is dense: pull it by blocks, not keys")));
      }
      for (uint32_t b : t.block_ids()) {
        RETURN_IF_ERROR(shard_->CheckBlock(*static_cast<DenseTablePart*>(part), b, -1));
      }
    } else {
      if (!t.block_ids().empty()) {
        return shard_->Reject(
            "wrong_kind", absl::InvalidArgumentError(absl::StrCat(
                              "table '", t.table(), "' is sparse: pull it by keys, not blocks")));
      }
      RETURN_IF_ERROR(
          shard_->CheckKeys(*static_cast<SparseTablePart*>(part), KeysOf(t.keys()), -1));
    }
  }
  const absl::Time wait_start = absl::Now();
  RETURN_IF_ERROR(shard_->BeginPull(info, std::min(deadline, wait_start + options_.max_pull_wait)));
  if (info.worker_id >= 0) {
    metrics_->pull_wait->Observe(absl::ToDoubleSeconds(absl::Now() - wait_start));
  }
  // Phase 2: read.
  std::vector<float> scratch;
  uint64_t bytes_out = 0;
  for (const TablePullRequest& t : request.tables()) {
    const Encoding encoding = t.encoding();
    const size_t bpv = common::BytesPerValue(encoding);
    TablePart* part = *shard_->FindTable(t.table());
    TableValues* out = response->add_tables();
    out->set_table(t.table());
    out->set_encoding(encoding);
    if (part->info().kind == TABLE_KIND_DENSE) {
      auto* dense = static_cast<DenseTablePart*>(part);
      for (uint32_t b : t.block_ids()) {
        DenseBlock* block = out->add_blocks();
        block->set_block_id(b);
        const size_t n = dense->BlockSize(b);
        if (encoding == ENCODING_FLOAT32) {
          // Read straight into the response's buffer: no intermediate copy.
          std::string* bytes = block->mutable_values();
          bytes->resize(n * sizeof(float));
          scratch.resize(0);
          dense->Read(b, absl::Span<float>(reinterpret_cast<float*>(bytes->data()), n));
        } else {
          scratch.resize(n);
          dense->Read(b, absl::MakeSpan(scratch));
          common::EncodeFloats(scratch, encoding, block->mutable_values());
        }
        bytes_out += n * bpv;
      }
    } else {
      auto* sparse = static_cast<SparseTablePart*>(part);
      const size_t n = static_cast<size_t>(t.keys_size()) * sparse->info().dim;
      *out->mutable_keys() = t.keys();
      if (encoding == ENCODING_FLOAT32) {
        std::string* bytes = out->mutable_rows();
        bytes->resize(n * sizeof(float));
        RETURN_IF_ERROR(sparse->Read(
            KeysOf(t.keys()), absl::Span<float>(reinterpret_cast<float*>(bytes->data()), n)));
      } else {
        scratch.resize(n);
        RETURN_IF_ERROR(sparse->Read(KeysOf(t.keys()), absl::MakeSpan(scratch)));
        common::EncodeFloats(scratch, encoding, out->mutable_rows());
      }
      bytes_out += n * bpv;
    }
  }
  response->set_server_incarnation(shard_->incarnation());
  response->set_min_clock(shard_->workers().MinLiveClock());
  shard_->CountPull(bytes_out);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Pull(grpc::CallbackServerContext* context,
                                                       const PullRequest* request,
                                                       PullResponse* response) {
  const absl::Time arrived = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time deadline = absl::FromChrono(context->deadline());
  if (absl::Status s = CheckWorker(*context, request->header().worker_id(), "pull"); !s.ok()) {
    Record(kPull, arrived, s, request->ByteSizeLong(), 0);
    Finish(reactor, s);
    return reactor;
  }
  pool_.Schedule([this, reactor, request, response, deadline, arrived] {
    Finish(reactor, ServePull(*request, deadline, response, arrived));
  });
  return reactor;
}

// ---- Push -------------------------------------------------------------------------------

absl::Status ParameterServerService::HandlePush(const PushRequest& request,
                                                PushResponse* response) {
  return ServePush(request, response, absl::Now());
}

absl::Status ParameterServerService::ServePush(const PushRequest& request, PushResponse* response,
                                               absl::Time arrived) {
  const absl::Status status = PushImpl(request, response);
  Record(kPush, arrived, status, request.ByteSizeLong(),
         status.ok() ? response->ByteSizeLong() : 0);
  return status;
}

absl::Status ParameterServerService::PushImpl(const PushRequest& request, PushResponse* response) {
  RequestInfo info = InfoOf(request.header());
  info.deadline = absl::Now() + options_.max_pull_wait;  // a deterministic push's turn
  RETURN_IF_ERROR(shard_->CheckLayout(info));
  // Phase 1: resolve, decode and check every part; nothing changes on any error.
  std::vector<PendingUpdate> updates;
  std::vector<std::vector<float>> decoded;
  size_t parts = 0;
  for (const TableValues& t : request.tables()) parts += t.blocks_size() + (t.keys_size() > 0);
  updates.reserve(parts);
  decoded.reserve(parts);
  uint64_t bytes_in = 0;
  for (const TableValues& t : request.tables()) {
    RETURN_IF_ERROR(CheckEncoding(shard_, t.encoding()));
    const size_t bpv = common::BytesPerValue(t.encoding());
    ASSIGN_OR_RETURN(TablePart * part, shard_->FindTable(t.table()));
    if (part->info().kind == TABLE_KIND_DENSE) {
      auto* dense = static_cast<DenseTablePart*>(part);
      if (!t.keys().empty() || !t.rows().empty()) {
        return shard_->Reject(
            "wrong_kind", absl::InvalidArgumentError(absl::StrCat(
                              "table '", t.table(), "' is dense: push blocks, not keyed rows")));
      }
      for (const DenseBlock& block : t.blocks()) {
        const uint32_t b = block.block_id();
        if (block.values().size() % bpv != 0) {
          return shard_->Reject("bad_size",
                                absl::InvalidArgumentError(absl::StrCat(
                                    "table '", t.table(), "' block ", b, ": payload of ",
                                    block.values().size(), " bytes is not a whole number of ",
                                    common::EncodingName(t.encoding()), " values")));
        }
        RETURN_IF_ERROR(shard_->CheckBlock(*dense, b, block.values().size() / bpv));
        absl::Span<const float> values = Floats(block.values(), t.encoding());
        if (values.empty() && dense->BlockSize(b) > 0) {
          auto& buffer = decoded.emplace_back(dense->BlockSize(b));
          RETURN_IF_ERROR(
              common::DecodeFloats(block.values(), t.encoding(), absl::MakeSpan(buffer)));
          values = buffer;
        }
        {  // Gradients and deltas alike.
          RETURN_IF_ERROR(shard_->CheckFinite(*dense, absl::StrCat("block ", b), values));
        }
        updates.push_back(PendingUpdate{dense, b, {}, values});
        bytes_in += block.values().size();
      }
    } else {
      auto* sparse = static_cast<SparseTablePart*>(part);
      if (!t.blocks().empty()) {
        return shard_->Reject(
            "wrong_kind", absl::InvalidArgumentError(absl::StrCat(
                              "table '", t.table(), "' is sparse: push keyed rows, not blocks")));
      }
      if (t.rows().size() % bpv != 0) {
        return shard_->Reject("bad_size", absl::InvalidArgumentError(absl::StrCat(
                                              "table '", t.table(), "': rows payload of ",
                                              t.rows().size(), " bytes is not a whole number of ",
                                              common::EncodingName(t.encoding()), " values")));
      }
      RETURN_IF_ERROR(shard_->CheckKeys(*sparse, KeysOf(t.keys()), t.rows().size() / bpv));
      absl::Span<const float> values = Floats(t.rows(), t.encoding());
      if (values.empty() && !t.rows().empty()) {
        auto& buffer = decoded.emplace_back(t.rows().size() / bpv);
        RETURN_IF_ERROR(common::DecodeFloats(t.rows(), t.encoding(), absl::MakeSpan(buffer)));
        values = buffer;
      }
      RETURN_IF_ERROR(shard_->CheckFinite(*sparse, "rows", values));
      updates.push_back(PendingUpdate{sparse, 0, KeysOf(t.keys()), values});
      bytes_in += t.rows().size();
    }
  }
  // Phase 2.
  UpdateOptions options;
  options.kind = request.is_delta() ? UpdateKind::kDelta : UpdateKind::kGradient;
  options.delta_scale = shard_->delta_scale();
  ASSIGN_OR_RETURN(PushResult result, shard_->ApplyPush(info, updates, options, bytes_in));
  response->set_duplicate(result.duplicate);
  response->set_updates_applied(result.updates_applied);
  response->set_server_incarnation(shard_->incarnation());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Push(grpc::CallbackServerContext* context,
                                                       const PushRequest* request,
                                                       PushResponse* response) {
  const absl::Time arrived = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = CheckWorker(*context, request->header().worker_id(), "push"); !s.ok()) {
    Record(kPush, arrived, s, request->ByteSizeLong(), 0);
    Finish(reactor, s);
    return reactor;
  }
  pool_.Schedule([this, reactor, request, response, arrived] {
    Finish(reactor, ServePush(*request, response, arrived));
  });
  return reactor;
}

// ---- The rest ---------------------------------------------------------------------------

grpc::ServerUnaryReactor* ParameterServerService::Stats(grpc::CallbackServerContext* context,
                                                        const StatsRequest* /*request*/,
                                                        StatsResponse* response) {
  shard_->FillStats(response);
  if (hooks_.stats) hooks_.stats(response);
  CountCall("stats", absl::OkStatus());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Checkpoint(grpc::CallbackServerContext* context,
                                                             const CheckpointRequest* /*request*/,
                                                             CheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = auth_.CheckOperator(auth_.Identify(*context), "checkpoint"); !s.ok()) {
    CountCall("checkpoint", s);
    Finish(reactor, s);
    return reactor;
  }
  if (!hooks_.checkpoint) {
    const absl::Status status =
        absl::FailedPreconditionError("this server has no data dir to checkpoint to");
    CountCall("checkpoint", status);
    Finish(reactor, status);
    return reactor;
  }
  pool_.Schedule([this, reactor, response] {
    absl::StatusOr<CheckpointResponse> result = hooks_.checkpoint();
    if (result.ok()) *response = *std::move(result);
    CountCall("checkpoint", result.status());
    Finish(reactor, result.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::ServerInfo(grpc::CallbackServerContext* context,
                                                             const ServerInfoRequest* /*request*/,
                                                             ServerInfoResponse* response) {
  shard_->FillServerInfo(response);
  if (hooks_.server_info) hooks_.server_info(response);
  CountCall("server_info", absl::OkStatus());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Heartbeat(grpc::CallbackServerContext* context,
                                                            const HeartbeatRequest* request,
                                                            HeartbeatResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status status = HandleHeartbeat(auth_.Identify(*context), *request, response);
  CountCall("heartbeat", status);
  Finish(reactor, status);
  return reactor;
}

absl::Status ParameterServerService::HandleHeartbeat(const PeerIdentity& peer,
                                                     const HeartbeatRequest& request,
                                                     HeartbeatResponse* response) {
  response->set_server_incarnation(shard_->incarnation());
  const RequestHeader& h = request.header();
  RETURN_IF_ERROR(shard_->CheckLayout(InfoOf(h)));
  // A tool (negative id) has no worker state: its heartbeats, finished or not, change
  // nothing (a tool's client says finished when it closes).
  if (h.worker_id() < 0) return absl::OkStatus();
  if (absl::Status s = auth_.CheckWorker(peer, h.worker_id(), "heartbeat"); !s.ok()) {
    return shard_->Reject("identity", std::move(s));
  }
  WorkerTracker& workers = shard_->workers();
  if (request.finished()) {
    // Finishing takes the worker out of the bound (and, with --exit_when_done, can stop the
    // servers): only its current incarnation may, never a new one announced by this call.
    RETURN_IF_ERROR(workers.Finish(h.worker_id(), h.worker_incarnation()));
  } else {
    RETURN_IF_ERROR(workers.Touch(h.worker_id(), h.worker_incarnation()));
  }
  if (request.data_offset() > 0 || request.epoch() > 0) {
    workers.SetDataPosition(h.worker_id(), request.data_offset(), request.epoch());
  }
  if (auto saved = workers.Get(h.worker_id()); saved.has_value()) {
    response->set_data_offset(saved->data_offset());
    response->set_epoch(saved->epoch());
    response->set_clock(saved->clock());
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Shutdown(grpc::CallbackServerContext* context,
                                                           const ShutdownRequest* request,
                                                           ShutdownResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status status = HandleShutdown(auth_.Identify(*context), *request);
  CountCall("shutdown", status);
  Finish(reactor, status);
  return reactor;
}

absl::Status ParameterServerService::HandleShutdown(const PeerIdentity& peer,
                                                    const ShutdownRequest& request) {
  RETURN_IF_ERROR(auth_.CheckOperator(peer, "shutdown"));
  if (request.reason().empty()) {
    // An empty body parses as a ShutdownRequest: a stop must be asked for in so many words.
    return absl::InvalidArgumentError(
        "shutdown needs a reason (ShutdownRequest.reason): it is logged with the caller");
  }
  if (!hooks_.shutdown) {
    return absl::UnimplementedError("this server cannot be shut down remotely");
  }
  LOG(WARNING) << "shutdown requested by " << peer.name << " (final checkpoint "
               << (request.checkpoint() ? "asked for" : "not asked for") << "): "
               << absl::CHexEscape(request.reason().substr(0, 256));
  hooks_.shutdown(request.checkpoint());
  return absl::OkStatus();
}

}  // namespace ps::server
