// ParameterServerService's calls taken from a completion queue (ServeFromQueue): the tags,
// the unary calls of each method, the health check, the serving loop, and the cap on the
// requests handed to the pool. The handlers they run are service.cc's.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/busy_poll.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/parse_bound.h"
#include "glog/logging.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "server/rpc/service.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace ps::server {

// ---- Calls from a completion queue -----------------------------------------------------

namespace {
// The methods' indices in the service (their order in ps.proto, as the generated code has
// them), and one more for the health check (served through the generic service).
enum QueuedMethod {
  kPullMethod = 0,
  kPushMethod = 1,
  kPushPullMethod = 2,
  kStatsMethod = 3,
  kCheckpointMethod = 4,
  kServerInfoMethod = 5,
  kHeartbeatMethod = 6,
  kShutdownMethod = 7,
  kHealthMethod = 8,
};
constexpr int kNumQueuedMethods = 9;
// Calls each serving thread asks for ahead, per method, so that a burst of calls is not
// matched one by one (a call that finds none asked for waits in gRPC for the next).
constexpr int kCallsAskedAhead[kNumQueuedMethods] = {2, 2, 8, 1, 1, 1, 1, 1, 1};
constexpr const char kHealthCheck[] = "/grpc.health.v1.Health/Check";
// Requests at least this large are served on the pool: their work (parse, apply) would keep
// the thread that polls the queue from the small calls behind them. Below it a request is
// served inline: a 1 MB push (about 0.3 ms of work) handed to the pool cost the server 9
// context switches and 600 us of CPU per call instead of 2 and 340 us (ps_bench, 2026-12-02).
constexpr size_t kInlineRequestBytes = size_t{4} << 20;
}  // namespace

// What a tag of the queue points at. Owns itself: deleted after its last tag.
class ParameterServerService::QueuedCall {
 public:
  enum Kind { kArrived, kDone, kFinished, kRead };
  struct Tag {
    QueuedCall* call;
    Kind kind;
  };
  virtual ~QueuedCall() = default;
  // One of this call's tags came out of the queue with `ok`.
  virtual void Handle(Kind kind, bool ok) = 0;
  // A tag of this call leaves for gRPC (HandOff, just before the operation starts) and comes
  // back out of the queue, maybe on another data thread or after a pool thread answered
  // (TakeOver, before Handle). gRPC orders the two inside libgrpc, which ThreadSanitizer does
  // not instrument; these tell it so, so that what the first thread wrote (the answer's size,
  // the peer's address) is not reported as a race when the second reads it. No-ops in other
  // builds.
  void HandOff() {
#if defined(__SANITIZE_THREAD__)
    __tsan_release(this);
#endif
  }
  void TakeOver() {
#if defined(__SANITIZE_THREAD__)
    __tsan_acquire(this);
#endif
  }

 protected:
  QueuedCall(ParameterServerService* service, grpc::ServerCompletionQueue* cq, int method)
      : service_(service), cq_(cq), method_(method) {}
  void End() {
    ParameterServerService* service = service_;
    delete this;
    absl::MutexLock lock(&service->queue_mu_);
    --service->queued_calls_;
  }

  ParameterServerService* const service_;
  grpc::ServerCompletionQueue* const cq_;
  const int method_;
};

// A unary call of one of the service's methods. Deleted after its done and finish tags and
// the handler's Started(), whichever comes last; a call that never arrived only has its
// arrival tag.
class ParameterServerService::UnaryCall : public QueuedCall {
 public:
  // Answers with `status` (and the response when OK). Called exactly once.
  virtual void Finish(const absl::Status& status) = 0;
  // As CallReactor: the handler is done with the call; `id` is its parked pull (0: none).
  // Called exactly once, after the handler has taken what it needs from the context.
  void Started(WaiterId id) {
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      id_ = id;
      cancelled = cancelled_;
    }
    if (cancelled && id != 0) service_->shard_->workers().CancelWaiter(id, Cancelled());
    Unref();
  }
  absl::Time deadline() const { return absl::FromChrono(context_.deadline()); }
  // The connection, as gRPC names it ("ipv4:10.0.0.7:50122"); asked of gRPC once per call.
  const std::string& PeerAddress() {
    if (peer_address_.empty()) peer_address_ = context_.peer();
    return peer_address_;
  }
  PeerIdentity Peer() const {
    return service_->auth_.Identify(context_.auth_context().get(), context_.peer());
  }

  void Handle(Kind kind, bool ok) override {
    switch (kind) {
      case kArrived:
        if (!ok) {
          // The server is shutting down; no other tag of this call will come, and a call
          // asked for now would come back at once the same way: none is (before 2026-12-06,
          // found in review, each data thread asked for and dropped calls in a loop until the
          // server's Shutdown returned, for as long as the drain lasted).
          End();
          return;
        }
        service_->RequestQueuedCall(method_, cq_);  // the next one
        Serve();
        return;
      case kDone:
        if (context_.IsCancelled()) Cancel();
        Unref();
        return;
      case kFinished:
        // The answer is on the wire, or the call ended without it: either way gRPC let go.
        if (answer_bytes_ > 0) service_->ReleaseAnswerBytes(PeerAddress(), answer_bytes_);
        Unref();
        return;
      case kRead:
        Unref();
        return;
    }
  }

 protected:
  UnaryCall(ParameterServerService* service, grpc::ServerCompletionQueue* cq, int method)
      : QueuedCall(service, cq, method) {
    HandOff();
    context_.AsyncNotifyWhenDone(&done_tag_);
  }
  // Serves the call on this thread, or hands it on (the pool, a parked pull).
  virtual void Serve() = 0;

  // Counts the answer of `bytes` as held until its finish tag (Finish calls it once).
  void HoldAnswer(size_t bytes) {
    answer_bytes_ = bytes;
    if (bytes == 0) return;
    service_->HoldAnswerBytes(PeerAddress(), bytes);
  }

  grpc::ServerContext context_;
  Tag arrived_tag_{this, kArrived};
  Tag finished_tag_{this, kFinished};

 private:
  size_t answer_bytes_ = 0;  // set before Finish, read when its tag comes
  std::string peer_address_;  // PeerAddress(), once asked
  void Cancel() {
    WaiterId id;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      id = id_;
    }
    // The waiter's callback finishes the call; nothing when it was answered meanwhile.
    if (id != 0) service_->shard_->workers().CancelWaiter(id, Cancelled());
  }
  static absl::Status Cancelled() {
    return absl::CancelledError("the client cancelled the call while its pull waited");
  }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) End();
  }

  Tag done_tag_{this, kDone};
  std::atomic<int> refs_{3};  // the handler's, the done tag's and the finish tag's
  absl::Mutex mu_;
  WaiterId id_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// Every method is raw (ServeFromQueue): a message's bytes are parsed here, within a bound on
// what the parse takes (common/rpc/parse_bound.h), never by gRPC before the handler sees them.
// Found in review, 2026-12-06: gRPC parsed a Pull of up to max_message_bytes of empty table
// entries, about 45 times its size parsed (24 GB for 512 MiB), before anything was checked.
template <class Request, class Response>
class ParameterServerService::TypedCall final : public UnaryCall {
 public:
  // The method's handler: calls Finish and Started once each.
  using Handler = void (*)(ParameterServerService* service, TypedCall* call);
  static constexpr bool kRaw = std::is_same_v<Request, grpc::ByteBuffer>;

  TypedCall(ParameterServerService* service, grpc::ServerCompletionQueue* cq, int method,
            Handler handler)
      : UnaryCall(service, cq, method), responder_(&context_), handler_(handler) {
    HandOff();
    service->RequestAsyncUnary(method, &context_, Incoming(), &responder_, cq, cq, &arrived_tag_);
  }
  void Finish(const absl::Status& status) override {
    if (!status.ok() && RejectionReason(status) == kServerBusyReason) {
      context_.AddTrailingMetadata(common::kServerBusyMetadata, "1");
    }
    grpc::ByteBuffer answer;
    absl::Status answered = status;
    if constexpr (kRaw) {
      answer = std::move(response);
    } else {
      bool own = false;
      if (status.ok()) {
        if (grpc::Status s =
                grpc::SerializationTraits<Response>::Serialize(response, &answer, &own);
            !s.ok()) {
          answer.Clear();
          answered = absl::InternalError(absl::StrCat("the answer: ", s.error_message()));
        }
      }
      // Only the bytes wait for the peer to read them (the caps count those), not the
      // objects, which can be tens of times as large (found in review, 2026-12-06). The
      // handler is done with both: Finish is its last word.
      Response().Swap(&response);
      Request().Swap(&request);
    }
    HoldAnswer(answered.ok() ? answer.Length() : 0);
    HandOff();
    responder_.Finish(answer, common::ToGrpcStatus(answered), &finished_tag_);
  }

  Request request;
  Response response;

 private:
  void Serve() override {
    if constexpr (!kRaw) {
      // Read from the slices where they lie, as gRPC's own parse would.
      absl::Status parsed =
          bytes_.Valid()
              ? common::ParseWithin(&bytes_, service_->MaxParsedRequestBytes(method_), &request)
              : absl::InvalidArgumentError("no message");
      bytes_.Clear();
      if (!parsed.ok()) {
        Finish(service_->RefuseUnparsed(method_, std::move(parsed)));
        Started(0);
        return;
      }
    }
    handler_(service_, this);
  }
  // Where gRPC puts the request's bytes: the request itself when the handler takes bytes.
  grpc::ByteBuffer* Incoming() {
    if constexpr (kRaw) {
      return &request;
    } else {
      return &bytes_;
    }
  }

  grpc::ByteBuffer bytes_;  // the request as it came (not kRaw), until parsed
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> responder_;
  const Handler handler_;
};

// grpc.health.v1.Health/Check (what Kubernetes' probes ask), through the generic service:
// HealthCheckRequest { string service = 1; } and HealthCheckResponse { ServingStatus status
// = 1; } are encoded by hand (Debian's gRPC has no health protos). The server's own status
// answers for the service "" (NOT_FOUND for any other name, as gRPC's default service does);
// other unregistered methods get UNIMPLEMENTED.
class ParameterServerService::HealthCall final : public QueuedCall {
 public:
  HealthCall(ParameterServerService* service, grpc::ServerCompletionQueue* cq)
      : QueuedCall(service, cq, kHealthMethod), stream_(&context_) {
    HandOff();
    service->generic_.RequestCall(&context_, &stream_, cq, cq, &arrived_tag_);
  }

  void Handle(Kind kind, bool ok) override {
    switch (kind) {
      case kArrived:
        if (!ok) {
          End();  // shutting down: as UnaryCall, no next one
          return;
        }
        service_->RequestQueuedCall(method_, cq_);
        if (context_.method() != kHealthCheck) {
          HandOff();
          stream_.Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                      absl::StrCat("no method ", context_.method())),
                         &finished_tag_);
          return;
        }
        HandOff();
        stream_.Read(&request_, &read_tag_);
        return;
      case kRead:
        Answer(ok);
        return;
      case kDone:
      case kFinished:
        End();
        return;
    }
  }

 private:
  void Answer(bool read) {
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (read && request_.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    // Empty: the service "" (proto3 leaves the default out); else field 1 with its length.
    const bool overall = read && (bytes.empty() || (bytes.size() == 2 && bytes[0] == 0x0a &&
                                                    bytes[1] == 0));
    if (!overall) {
      HandOff();
      stream_.Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                  "this server answers only for the service \"\""),
                     &finished_tag_);
      return;
    }
    const char answer[2] = {0x08, service_->serving_.load() ? '\x01' : '\x02'};
    grpc::Slice slice(answer, sizeof(answer));
    HandOff();
    stream_.WriteAndFinish(grpc::ByteBuffer(&slice, 1), grpc::WriteOptions(),
                           grpc::Status::OK, &finished_tag_);
  }

  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_;
  grpc::ByteBuffer request_;
  Tag arrived_tag_{this, kArrived};
  Tag read_tag_{this, kRead};
  Tag finished_tag_{this, kFinished};
};

void ParameterServerService::ServeFromQueue() {
  // A method without a handler is an async one: the server matches its calls to the requests
  // of RequestQueuedCall. No method is left on the callback API, so gRPC starts none of its
  // callback threads (which would take turns polling the sockets and hand calls over).
  for (int m = kPullMethod; m <= kShutdownMethod; ++m) {
    MarkMethodRawCallback(m, nullptr);
    MarkMethodRaw(m);  // parsed by TypedCall, within a bound
  }
}

grpc::AsyncGenericService* ParameterServerService::health_service() { return &generic_; }

void ParameterServerService::SetServing(bool serving) { serving_ = serving; }

void ParameterServerService::RequestQueuedCall(int method, grpc::ServerCompletionQueue* cq) {
  absl::MutexLock lock(&queue_mu_);
  if (queue_stopping_) return;
  ++queued_calls_;
  if (method == kHealthMethod) {
    new HealthCall(this, cq);
  } else if (method == kPullMethod || method == kPushMethod || method == kPushPullMethod) {
    NewDataCall(method, cq);
  } else {
    NewControlCall(method, cq);
  }
}

void ParameterServerService::NewDataCall(int method, grpc::ServerCompletionQueue* cq) {
  if (method == kPullMethod) {
    using Call = TypedCall<PullRequest, PullResponse>;
    new Call(this, cq, method, [](ParameterServerService* s, Call* c) {
      const absl::Time arrived = absl::Now();
      absl::Status st = s->CheckUnsentAnswers(c->PeerAddress());
      if (st.ok()) {
        st = s->auth_.CheckWorker(c->Peer(), c->request.header().worker_id(), "pull");
        if (!st.ok()) st = s->shard_->Reject("identity", std::move(st));
      }
      if (!st.ok()) {
        s->Record(kPull, arrived, st, c->request.ByteSizeLong(), 0);
        c->Finish(st);
        c->Started(0);
        return;
      }
      c->Started(s->StartPull(
          c->request, c->deadline(), &c->response, arrived,
          [c](absl::Status status) { c->Finish(status); }, c->PeerAddress()));
    });
  } else if (method == kPushMethod) {
    using Call = TypedCall<PushRequest, PushResponse>;
    new Call(this, cq, method, [](ParameterServerService* s, Call* c) {
      const absl::Time arrived = absl::Now();
      if (absl::Status st = s->auth_.CheckWorker(c->Peer(), c->request.header().worker_id(),
                                                 "push");
          !st.ok()) {
        st = s->shard_->Reject("identity", std::move(st));
        s->Record(kPush, arrived, st, c->request.ByteSizeLong(), 0);
        c->Finish(st);
        c->Started(0);
        return;
      }
      auto serve = [s, c, arrived] {
        c->Finish(s->ServePush(c->request, &c->response, arrived, c->deadline()));
        c->Started(0);
      };
      const size_t bytes = c->request.ByteSizeLong();
      if (!s->PushesWait() && bytes < kInlineRequestBytes) return serve();
      if (absl::Status st = s->ServeOnPool(bytes, std::move(serve)); !st.ok()) {
        s->Record(kPush, arrived, st, bytes, 0);
        c->Finish(st);
        c->Started(0);
      }
    });
  } else {
    using Call = TypedCall<grpc::ByteBuffer, grpc::ByteBuffer>;
    new Call(this, cq, method, [](ParameterServerService* s, Call* c) {
      const absl::Time arrived = absl::Now();
      const size_t bytes = c->request.Length();
      auto refuse = [s, c, arrived, bytes](const absl::Status& st) {
        s->Record(kPush, arrived, st, bytes, 0);  // not parsed: counted as a push
        c->Finish(st);
        c->Started(0);
      };
      auto serve = [s, c, arrived, peer = c->Peer()] {
        c->Started(s->StartPushPull(
            &c->request, c->deadline(), &c->response, arrived, &peer,
            [c](absl::Status status) { c->Finish(status); }, /*from_channel=*/false,
            c->PeerAddress()));
      };
      if (absl::Status st = s->CheckUnsentAnswers(c->PeerAddress()); !st.ok()) return refuse(st);
      // No push here waits: answer on this thread; a pull that must wait is parked.
      if (!s->PushesWait() && bytes < kInlineRequestBytes) return serve();
      // Answers may pile up while the call waits for a pool thread: checked again as it
      // starts there, before its push is applied, so that a refusal still changes nothing.
      // (Its pull is checked once more right before its read: AfterBound.)
      absl::Status st = s->ServeOnPool(bytes, [s, c, refuse, serve = std::move(serve)] {
        if (absl::Status busy = s->CheckUnsentAnswers(c->PeerAddress()); !busy.ok()) {
          return refuse(busy);
        }
        serve();
      });
      if (!st.ok()) refuse(st);
    });
  }
}

size_t ParameterServerService::MaxParsedRequestBytes(int method) const {
  constexpr size_t kControlBytes = size_t{1} << 20;
  return method == kPullMethod || method == kPushMethod ? options_.max_answer_bytes : kControlBytes;
}

absl::Status ParameterServerService::RefuseUnparsed(int method, absl::Status status) {
  const char* reason = absl::IsResourceExhausted(status) ? "request_too_large" : "unparseable";
  static constexpr const char* kControlNames[] = {"stats", "checkpoint", "server_info", "heartbeat",
                                                  "shutdown"};
  status = shard_->Reject(reason, std::move(status));  // (first: Record reads the reason)
  if (method == kPullMethod || method == kPushMethod) {
    Record(method == kPullMethod ? kPull : kPush, absl::Now(), status, 0, 0);
  } else if (method >= kStatsMethod && method <= kShutdownMethod) {
    CountCall(kControlNames[method - kStatsMethod], status);
  }
  return status;
}

void ParameterServerService::NewControlCall(int method, grpc::ServerCompletionQueue* cq) {
  switch (method) {
    case kStatsMethod: {
      using Call = TypedCall<StatsRequest, StatsResponse>;
      new Call(this, cq, method, [](ParameterServerService* s, Call* c) {
        s->shard_->FillStats(&c->response);
        if (s->hooks_.stats) s->hooks_.stats(&c->response);
        s->CountCall("stats", absl::OkStatus());
        c->Finish(absl::OkStatus());
        c->Started(0);
      });
      return;
    }
    case kCheckpointMethod: {
      using Call = TypedCall<CheckpointRequest, CheckpointResponse>;
      new Call(this, cq, method, [](ParameterServerService* s, Call* c) {
        absl::Status status = s->auth_.CheckOperator(c->Peer(), "checkpoint");
        if (status.ok() && !s->hooks_.checkpoint) {
          status = absl::FailedPreconditionError("this server has no data dir to checkpoint to");
        }
        if (!status.ok()) {
          s->CountCall("checkpoint", status);
          c->Finish(status);
          c->Started(0);
          return;
        }
        s->pool_.Schedule([s, c] {
          absl::StatusOr<CheckpointResponse> result = s->hooks_.checkpoint();
          if (result.ok()) c->response = *std::move(result);
          s->CountCall("checkpoint", result.status());
          c->Finish(result.status());
          c->Started(0);
        });
      });
      return;
    }
    case kServerInfoMethod: {
      using Call = TypedCall<ServerInfoRequest, ServerInfoResponse>;
      new Call(this, cq, method, [](ParameterServerService* s, Call* c) {
        s->shard_->FillServerInfo(&c->response);
        if (s->hooks_.server_info) s->hooks_.server_info(&c->response);
        s->CountCall("server_info", absl::OkStatus());
        c->Finish(absl::OkStatus());
        c->Started(0);
      });
      return;
    }
    default:
      NewWorkerControlCall(method, cq);
  }
}

void ParameterServerService::NewWorkerControlCall(int method, grpc::ServerCompletionQueue* cq) {
  if (method == kHeartbeatMethod) {
    using Call = TypedCall<HeartbeatRequest, HeartbeatResponse>;
    new Call(this, cq, method, [](ParameterServerService* s, Call* c) {
      const absl::Status status = s->HandleHeartbeat(c->Peer(), c->request, &c->response);
      s->CountCall("heartbeat", status);
      c->Finish(status);
      c->Started(0);
    });
    return;
  }
  CHECK_EQ(method, kShutdownMethod);
  using Call = TypedCall<ShutdownRequest, ShutdownResponse>;
  new Call(this, cq, method, [](ParameterServerService* s, Call* c) {
    const absl::Status status = s->HandleShutdown(c->Peer(), c->request);
    s->CountCall("shutdown", status);
    c->Finish(status);
    c->Started(0);
  });
}

void ParameterServerService::ServeQueue(grpc::ServerCompletionQueue* cq,
                                        absl::Duration busy_poll) {
  for (int m = 0; m < kNumQueuedMethods; ++m) {
    for (int i = 0; i < kCallsAskedAhead[m]; ++i) RequestQueuedCall(m, cq);
  }
  void* tag;
  bool ok;
  // It waits mostly for requests (and its calls' own reads and writes).
  common::BusyPoller poller(busy_poll, common::BusyWaiter::kCheapRequestWait);
  while (poller.Next(cq, &tag, &ok)) {
    auto* t = static_cast<QueuedCall::Tag*>(tag);
    t->call->TakeOver();
    t->call->Handle(t->kind, ok);
  }
}

void ParameterServerService::StopQueue(grpc::ServerCompletionQueue* cq) {
  absl::MutexLock lock(&queue_mu_);
  if (queue_stopping_) {
    queue_mu_.Await(absl::Condition(&queue_stopped_));
    return;
  }
  queue_stopping_ = true;
  // The server is shut down: calls asked for come back unmatched, running ones end.
  queue_mu_.Await(absl::Condition(
      +[](size_t* calls) { return *calls == 0; }, &queued_calls_));
  cq->Shutdown();
  queue_stopped_ = true;
}

// ---- Requests held by the pool ----------------------------------------------------------

absl::Status ParameterServerService::ServeOnPool(size_t bytes, std::function<void()> serve) {
  {
    absl::MutexLock lock(&pool_mu_);
    // The first request always gets in: one within the message size limit must be servable.
    // (Both sums stay far below 2^64: bytes are within the message size limit.)
    if (pool_requests_ > 0 && (pool_requests_ >= options_.max_pool_requests ||
                               pool_request_bytes_ + bytes > options_.max_pool_request_bytes)) {
      const size_t held = pool_requests_;
      const size_t held_bytes = pool_request_bytes_;
      return shard_->Reject(
          kServerBusyReason,
          absl::ResourceExhaustedError(absl::StrCat(
              "server busy: ", held, " requests (", held_bytes,
              " bytes) wait for or run on its threads already (max_pool_requests ",
              options_.max_pool_requests, ", max_pool_request_bytes ",
              options_.max_pool_request_bytes, "); this one (", bytes,
              " bytes) changed nothing and may be sent again")));
    }
    ++pool_requests_;
    pool_request_bytes_ += bytes;
  }
  pool_.Schedule([this, bytes, serve = std::move(serve)] {
    serve();
    absl::MutexLock lock(&pool_mu_);
    --pool_requests_;
    pool_request_bytes_ -= bytes;
  });
  return absl::OkStatus();
}

size_t ParameterServerService::pool_requests() const {
  absl::MutexLock lock(&pool_mu_);
  return pool_requests_;
}

absl::Status ParameterServerService::CheckUnsentAnswerTotal(absl::string_view what) {
  const size_t held = unsent_answer_bytes_.load(std::memory_order_relaxed);
  if (held > options_.max_unsent_answer_bytes) {
    return UnsentAnswersBusy(held, "their peers", "max_unsent_answer_bytes",
                             options_.max_unsent_answer_bytes, what);
  }
  return absl::OkStatus();
}

absl::Status ParameterServerService::CheckUnsentAnswers(absl::string_view peer,
                                                        absl::string_view what) {
  if (absl::Status total = CheckUnsentAnswerTotal(what); !total.ok()) return total;
  // No connection holds more than all of them together: while that is within the cap, as it
  // mostly is, the check takes no lock (it runs as a call arrives and before each read).
  if (unsent_answer_bytes_.load(std::memory_order_relaxed) <=
      options_.max_unsent_answer_bytes_per_peer) {
    return absl::OkStatus();
  }
  size_t held_for_peer = 0;
  {
    absl::MutexLock lock(&unsent_mu_);
    auto it = unsent_by_peer_.find(peer);
    if (it != unsent_by_peer_.end()) held_for_peer = it->second;
  }
  if (held_for_peer <= options_.max_unsent_answer_bytes_per_peer) return absl::OkStatus();
  return UnsentAnswersBusy(held_for_peer, "this connection", "max_unsent_answer_bytes_per_peer",
                           options_.max_unsent_answer_bytes_per_peer, what);
}

absl::Status ParameterServerService::UnsentAnswersBusy(size_t held, absl::string_view takers,
                                                       absl::string_view cap, size_t limit,
                                                       absl::string_view what) {
  return shard_->Reject(kServerBusyReason, absl::ResourceExhaustedError(absl::StrCat(
                                               "server busy: ", held, " bytes of answers wait for ",
                                               takers, " to take them (", cap, " ", limit, "); ",
                                               what, " changed nothing and may be sent again")));
}

void ParameterServerService::HoldAnswerBytes(const std::string& peer, size_t bytes) {
  unsent_answer_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  absl::MutexLock lock(&unsent_mu_);
  unsent_by_peer_[peer] += bytes;
}

void ParameterServerService::ReleaseAnswerBytes(const std::string& peer, size_t bytes) {
  unsent_answer_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  absl::MutexLock lock(&unsent_mu_);
  auto it = unsent_by_peer_.find(peer);
  DCHECK(it != unsent_by_peer_.end() && it->second >= bytes);
  if (it == unsent_by_peer_.end()) return;
  it->second -= std::min(it->second, bytes);
  if (it->second == 0) unsent_by_peer_.erase(it);
}

size_t ParameterServerService::QueuedCallsForTest() {
  absl::MutexLock lock(&queue_mu_);
  return queued_calls_;
}

void ParameterServerService::WaitForPoolRequestsForTest(size_t n) {
  absl::MutexLock lock(&pool_mu_);
  auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu_) {
    return pool_requests_ == n;
  };
  pool_mu_.Await(absl::Condition(&reached));
}

}  // namespace ps::server
