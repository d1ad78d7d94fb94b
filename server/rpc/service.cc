#include "server/rpc/service.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/codec.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/shared_channel.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/rpc/service_internal.h"

namespace ps::server {
using service_internal::Finish;
using service_internal::InfoOf;
using service_internal::kMethodNames;
using service_internal::PullViews;
using service_internal::TableOf;

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
            "layout_mismatch, stale_incarnation, bad_worker, bad_sequence, bad_clock, clock_ahead, "
            "identity, "
            "bad_encoding, bound_timeout, turn_timeout, duplicate_pending, sequence_given_up, "
            "too_many_waiting, turn_superseded, answer_too_large, server_busy, server_stopping, "
            "unknown_segment, "
            "payload_late, late_follower, unparseable, request_too_large, other).",
            {"method", "code", "reason"})),
        rejected(r->AddCounterFamily(
            "ps_rejected_requests_total",
            "Data-path requests refused, by reason (as ps_server_requests_refused_total; "
            "\"unparseable\" for frames and messages that do not parse).",
            {"reason"})) {
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
                            "Bytes of pull and push requests (protobuf encoded, or whole PushPull frames).",
                            {"method"});
    auto* response_family =
        r->AddCounterFamily("ps_server_response_bytes_total",
                            "Bytes of pull and push answers (protobuf encoded, or whole PushPull frames).",
                            {"method"});
    for (Method m : {kPull, kPush}) {
      request_bytes[m] = request_family->WithLabels({kMethodNames[m]});
      response_bytes[m] = response_family->WithLabels({kMethodNames[m]});
      ok[m] = requests->WithLabels({kMethodNames[m], "OK"});
    }
  }

  common::metrics::Family<common::metrics::Counter>* const requests;
  common::metrics::Family<common::metrics::Counter>* const refused;
  common::metrics::Family<common::metrics::Counter>* const rejected;
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
      buffers_(common::BufferPool::Create(options.max_cached_payload_bytes, &counters_)),
      channel_threads_(NewChannelThreads(options)),
      segments_alive_(new std::atomic<int>[shard->config().cluster().num_workers()]()),
      pool_(options.num_threads) {}

ParameterServerService::~ParameterServerService() {
  // No channel thread may start a call from here on.
  StopChannels();
  // Parked pulls reference this service: answer them before it goes (their callbacks finish
  // their calls at once, without the pool).
  shard_->CloseWaiters("the server is stopping");
}

// ---- Parking -----------------------------------------------------------------------------

// A reactor that owns itself (deleted when gRPC is done with it, and not before the handler
// that parked its pull has recorded the waiter's id, so OnCancel cannot race a dangling id).
class ParameterServerService::CallReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit CallReactor(WorkerTracker* tracker) : tracker_(tracker) {}

  // The handler is done with the reactor; `id` is its parked pull (0: none).
  void Started(WaiterId id) {
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      id_ = id;
      cancelled = cancelled_;
    }
    if (cancelled && id != 0) tracker_->CancelWaiter(id, Cancelled());
    Unref();
  }
  void OnCancel() override {
    WaiterId id;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      id = id_;
    }
    // The waiter's callback finishes the call; nothing when it was answered meanwhile.
    if (id != 0) tracker_->CancelWaiter(id, Cancelled());
  }
  void OnDone() override { Unref(); }

 private:
  static absl::Status Cancelled() {
    return absl::CancelledError("the client cancelled the call while its pull waited");
  }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  WorkerTracker* const tracker_;  // Not owned.
  std::atomic<int> refs_{2};      // the handler's and gRPC's
  absl::Mutex mu_;
  WaiterId id_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

ParameterServerService::WaiterId ParameterServerService::AfterBound(
    const RequestInfo& info, absl::Time deadline, std::function<absl::Status()> read, Done done,
    std::optional<absl::string_view> answer_peer, uint64_t held_bytes) {
  const absl::Time wait_start = absl::Now();
  const bool tracked = info.worker_id >= 0;
  // Answers gRPC holds are capped (max_unsent_answer_bytes*), but a pull passed the caps as
  // its call arrived, with nothing of its own held then, and more may be held by its read: it
  // may have waited for the pool behind other calls (deterministic BSP, requests of 4 MB or
  // more) or for its push's turn, or been parked with pulls that one push then released
  // together. So both caps are checked again right before each read, wherever it runs, and
  // beyond either at most one answer per reading thread (data or pool) is being read. A
  // PushPull's push was applied before this: the refusal says so (WithPushApplied), as every
  // refusal of its pull does, and the call sent again is a duplicate whose pull is read.
  // (Found in review, 2026-12-06: only parked pulls were checked again, against the total
  // only; a peer that read nothing had every call it could open, 32 by default, read on the
  // pool and held, each up to max_answer_bytes.)
  auto checked_read = [this, read = std::move(read), answer_peer]() -> absl::Status {
    if (answer_peer.has_value()) {
      if (absl::Status busy = CheckUnsentAnswers(*answer_peer, "this pull"); !busy.ok()) {
        return busy;
      }
    }
    return read();
  };
  // When parked: called by whoever moved the clock (or the tracker's timer); the read goes to
  // the pool so that the push that released it is answered without waiting for it.
  auto on_bound = [this, checked_read, done, wait_start, tracked](absl::Status status) {
    if (!status.ok()) {
      done(std::move(status));
      return;
    }
    if (tracked) metrics_->pull_wait->Observe(absl::ToDoubleSeconds(absl::Now() - wait_start));
    pool_.Schedule([checked_read, done] { done(checked_read()); });
  };
  WorkerTracker::ParkLimits limits;
  limits.per_worker = options_.max_parked_pulls_per_worker;
  limits.total = options_.max_parked_pulls;
  limits.bytes_per_worker = options_.max_parked_bytes_per_worker;
  limits.bytes_total = options_.max_parked_bytes;
  absl::StatusOr<WaiterId> parked =
      shard_->ParkPull(info, std::min(deadline, wait_start + options_.max_pull_wait), limits,
                       std::move(on_bound), held_bytes);
  if (!parked.ok()) {
    done(parked.status());
    return 0;
  }
  if (*parked != 0) return *parked;
  if (tracked) metrics_->pull_wait->Observe(absl::ToDoubleSeconds(absl::Now() - wait_start));
  done(checked_read());
  return 0;
}

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
  metrics_->rejected->WithLabels({reason})->Increment();
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
  absl::Notification answered;
  absl::Status result;
  StartPull(
      request, deadline, response, absl::Now(),
      [&](absl::Status status) {
        result = std::move(status);
        answered.Notify();
      },
      /*answer_peer=*/std::nullopt);
  answered.WaitForNotification();
  return result;
}

ParameterServerService::WaiterId ParameterServerService::StartPull(
    const PullRequest& request, absl::Time deadline, PullResponse* response, absl::Time arrived,
    Done done, std::optional<absl::string_view> answer_peer) {
  // Recorded, and counted against the caps on parked pulls' bytes while the pull waits.
  const size_t request_bytes = request.ByteSizeLong();
  auto finish = [this, request_bytes, response, arrived,
                 done = std::move(done)](absl::Status status) {
    Record(kPull, arrived, status, request_bytes, status.ok() ? response->ByteSizeLong() : 0);
    done(std::move(status));
  };
  const RequestInfo info = InfoOf(request.header());
  // Views into `request`, which lives until `done`.
  auto views = std::make_shared<const std::vector<PullTable>>(PullViews(request.tables()));
  absl::StatusOr<uint64_t> bytes = shard_->CheckPull(info, *views);
  absl::Status status = bytes.status();
  // The protobuf answer echoes the keys too (before 2026-12-05, found in review, only the
  // values were counted: a pull of 8M keys passed, read every row, and gRPC then refused to
  // send its 580 MB answer).
  if (status.ok()) {
    status = CheckAnswerSize(*bytes, AnswerHeaderBytes(request.tables(), /*echo_keys=*/true),
                             /*shared_room=*/0);
  }
  if (!status.ok()) {
    finish(std::move(status));
    return 0;
  }
  return AfterBound(
      info, deadline,
      [this, &request, response, views] {
        return ReadPull(request.tables(), *views, response, nullptr);
      },
      std::move(finish), answer_peer, /*held_bytes=*/service_internal::ParkedBytes(request));
}

uint64_t ParameterServerService::AnswerHeaderBytes(
    const google::protobuf::RepeatedPtrField<TablePullRequest>& tables, bool echo_keys) {
  // Bounds on the protobuf encoding: a table's name, encoding and field tags; a block's id,
  // its length and tags; a key's 8 bytes.
  constexpr uint64_t kPerTable = 32, kPerBlock = 24, kPerKey = 8;
  uint64_t bytes = 0;
  for (const TablePullRequest& t : tables) {
    bytes += kPerTable + t.table().size() + kPerBlock * static_cast<uint64_t>(t.block_ids_size());
    if (echo_keys) bytes += kPerKey * static_cast<uint64_t>(t.keys_size());
  }
  return bytes;
}

absl::Status ParameterServerService::CheckAnswerSize(uint64_t payload_bytes, uint64_t header_bytes,
                                                     uint64_t shared_room) {
  // Values that go into the worker's segment are bounded by the room it gave; the header is
  // built here and sent by the socket or the channel whatever the room (before 2026-12-06,
  // found in review, a room let a pull naming a block 20,000 times build a header of any size).
  const bool in_room = payload_bytes <= shared_room;
  const uint64_t bytes = in_room ? header_bytes : payload_bytes + header_bytes;
  if (bytes <= options_.max_answer_bytes) return absl::OkStatus();
  return shard_->Reject("answer_too_large",
                        absl::ResourceExhaustedError(absl::StrCat(
                            "the pull's answer", in_room ? " header" : "", " would be ", bytes,
                            " bytes, over the server's limit of ", options_.max_answer_bytes,
                            " (server.max_message_bytes)")));
}

absl::Status ParameterServerService::ReadPull(
    const google::protobuf::RepeatedPtrField<TablePullRequest>& tables,
    absl::Span<const PullTable> views, PullResponse* response, char* out, bool stream) {
  // The answer's headers first; the shard then fills their payloads part by part.
  for (const TablePullRequest& t : tables) {
    TableValues* tv = response->add_tables();
    tv->set_table(t.table());
    tv->set_encoding(t.encoding());
    for (uint32_t b : t.block_ids()) tv->add_blocks()->set_block_id(b);
    // A frame's rows follow the keys of the request, which the worker has: not echoed.
    if (out == nullptr) *tv->mutable_keys() = t.keys();
  }
  std::vector<float> scratch;
  std::string encoded;
  // A part goes to the next bytes of `out` (frames) or to its bytes field (protobuf); float32
  // is read straight into its destination, 16-bit encodings through `scratch`.
  auto sink = [&](size_t table, size_t part, size_t n,
                  absl::FunctionRef<absl::Status(absl::Span<float>)> fill) -> absl::Status {
    TableValues* tv = response->mutable_tables(static_cast<int>(table));
    const size_t bytes = n * common::BytesPerValue(tv->encoding());
    std::string* field = part == kRowsPart ? tv->mutable_rows()
                                           : tv->mutable_blocks(static_cast<int>(part))->mutable_values();
    char* dest;
    if (out == nullptr) {
      field->resize(bytes);
      dest = field->data();
    } else {
      dest = out;
      out += bytes;
      if (part == kRowsPart) {
        tv->set_rows_bytes(bytes);
      } else {
        tv->mutable_blocks(static_cast<int>(part))->set_payload_bytes(bytes);
      }
    }
    if (tv->encoding() == ENCODING_FLOAT32) {
      return fill(absl::Span<float>(reinterpret_cast<float*>(dest), n));
    }
    scratch.resize(n);
    RETURN_IF_ERROR(fill(absl::MakeSpan(scratch)));
    common::EncodeFloats(scratch, tv->encoding(), &encoded);
    std::memcpy(dest, encoded.data(), encoded.size());
    return absl::OkStatus();
  };
  // Float32 parts are filled where they stay (a 16-bit one goes through `scratch`): the shard
  // may then read a large pull's blocks on its apply threads after the sink's calls.
  const bool in_place = std::all_of(tables.begin(), tables.end(), [](const TablePullRequest& t) {
    return t.encoding() == ENCODING_FLOAT32;
  });
  RETURN_IF_ERROR(shard_->ReadPull(views, sink, stream, in_place));
  response->set_server_incarnation(shard_->incarnation());
  response->set_min_clock(shard_->workers().MinLiveClock());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Pull(grpc::CallbackServerContext* context,
                                                       const PullRequest* request,
                                                       PullResponse* response) {
  const absl::Time arrived = absl::Now();
  auto* reactor = new CallReactor(&shard_->workers());
  const absl::Time deadline = absl::FromChrono(context->deadline());
  if (absl::Status s = CheckWorker(*context, request->header().worker_id(), "pull"); !s.ok()) {
    Record(kPull, arrived, s, request->ByteSizeLong(), 0);
    Finish(reactor, s);
    reactor->Started(0);
    return reactor;
  }
  reactor->Started(StartPull(
      *request, deadline, response, arrived,
      [reactor](absl::Status status) { Finish(reactor, status); }, /*answer_peer=*/std::nullopt));
  return reactor;
}

// ---- Push -------------------------------------------------------------------------------

absl::Status ParameterServerService::HandlePush(const PushRequest& request,
                                                PushResponse* response) {
  return ServePush(request, response, absl::Now());
}

absl::Status ParameterServerService::ServePush(const PushRequest& request, PushResponse* response,
                                               absl::Time arrived, absl::Time deadline) {
  std::vector<PushTable> tables(request.tables_size());
  absl::Status status;
  // Refused at the first frame field found: counted once (before 2026-12-06, found in review,
  // once per such field).
  for (int i = 0; i < request.tables_size() && status.ok(); ++i) {
    const TableValues& t = request.tables(i);
    tables[i] = TableOf(t);
    tables[i].rows = t.rows();
    for (const DenseBlock& block : t.blocks()) {
      if (block.payload_bytes() != 0) {
        status = Unparseable(absl::InvalidArgumentError(
            "unparseable push: payload_bytes is for frames (PushPull), not Push"));
        break;
      }
      tables[i].blocks.push_back(PushTable::Block{block.block_id(), block.values()});
    }
    if (status.ok() && t.rows_bytes() != 0) {
      status = Unparseable(absl::InvalidArgumentError(
          "unparseable push: rows_bytes is for frames (PushPull), not Push"));
    }
  }
  if (status.ok()) {
    status = PushImpl(request.header(), request.is_delta(), tables, response, deadline);
  }
  Record(kPush, arrived, status, request.ByteSizeLong(),
         status.ok() ? response->ByteSizeLong() : 0);
  return status;
}

absl::Status ParameterServerService::PushImpl(const RequestHeader& header, bool is_delta,
                                              absl::Span<const PushTable> tables,
                                              PushResponse* response, absl::Time deadline,
                                              common::FollowingPayload* following) {
  PushView push;
  push.info = InfoOf(header);
  // A deterministic push's turn: waited for until the call's deadline at most (after it the
  // worker sends the push again, which then waits in its place).
  push.info.deadline = std::min(deadline, absl::Now() + options_.max_pull_wait);
  push.is_delta = is_delta;
  push.tables = tables;
  push.following = following;
  ASSIGN_OR_RETURN(PushResult result, shard_->Push(push));
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
  if (!PushesWait()) {
    Finish(reactor, ServePush(*request, response, arrived, absl::FromChrono(context->deadline())));
    return reactor;
  }
  const size_t bytes = request->ByteSizeLong();
  const absl::Time deadline = absl::FromChrono(context->deadline());
  if (absl::Status s = ServeOnPool(
          bytes, [this, reactor, request, response, arrived,
                  deadline] { Finish(reactor, ServePush(*request, response, arrived, deadline)); });
      !s.ok()) {
    context->AddTrailingMetadata(common::kServerBusyMetadata, "1");
    Record(kPush, arrived, s, bytes, 0);
    Finish(reactor, s);
  }
  return reactor;
}

// The fused call: its frames are read and answered in service_push_pull.cc.
grpc::ServerUnaryReactor* ParameterServerService::PushPull(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  const absl::Time arrived = absl::Now();
  auto* reactor = new CallReactor(&shard_->workers());
  const absl::Time deadline = absl::FromChrono(context->deadline());
  auto serve = [this, reactor, request, response, deadline, arrived,
                peer = auth_.Identify(*context)] {
    // gRPC's request object is not const, only handed out so; StartPushPull lets go of its
    // payload once the push is applied (nothing reads it after the handler).
    reactor->Started(StartPushPull(const_cast<grpc::ByteBuffer*>(request), deadline, response,
                                   arrived, &peer,
                                   [reactor](absl::Status status) { Finish(reactor, status); }));
  };
  if (!PushesWait()) {
    // No push here waits: answer on this thread (no hop to the pool and back); a pull that
    // must wait is parked, not waited for.
    serve();
    return reactor;
  }
  if (absl::Status s = ServeOnPool(request->Length(), std::move(serve)); !s.ok()) {
    context->AddTrailingMetadata(common::kServerBusyMetadata, "1");
    Record(kPush, arrived, s, request->Length(), 0);
    Finish(reactor, s);
    reactor->Started(0);
  }
  return reactor;
}

}  // namespace ps::server
