// The ParameterServer gRPC service over one Shard: from a completion queue in a GrpcServer
// (ServeFromQueue), on the callback API when registered with a plain ServerBuilder (tests).
//
// The service checks who the caller is (auth.h) and decodes bytes into the shard's
// wire-independent requests (PushView, PullTable); the shard validates them, in full before
// anything changes, as it does for the in-process store: a bad request gets a precise status,
// counted under its reason, and leaves the server's state as it was.
//
// The data path is PushPull, which carries frames (common/rpc/frame.h) instead of protobuf
// messages: dense push payloads are checked and applied where gRPC received them, as the
// pieces of the receive slices they span (no copy in user space; sparse rows, read by key,
// are gathered once into a pooled buffer when they span slices), and pull payloads are read
// from the tables into a pooled buffer that becomes the response's slice, so payload bytes
// are copied at most once in user space on each side and no call maps fresh memory in
// steady state.
//
// Threads. A call is served on the gRPC thread that received it, except a push of a
// deterministic-BSP job, which may wait for its turn and goes to the worker pool. A pull (Pull,
// or the pull part of a PushPull) that the consistency bound does not let through yet holds no
// thread: it is parked in the WorkerTracker (WhenBound) and its read runs on the worker pool
// once clocks move; it ends with DEADLINE_EXCEEDED at min(call deadline, max_pull_wait),
// CANCELLED when the client goes away, UNAVAILABLE when the server stops. Parked pulls are
// capped per worker and in all (RESOURCE_EXHAUSTED, reason "too_many_waiting"). So no client,
// honest or not, can make pulls hold the threads other workers' calls need.
//
// Memory a client can make the service hold is capped as well: requests handed to the pool
// (max_pool_requests, max_pool_request_bytes) and answers its peers have not taken
// (max_unsent_answer_bytes). Beyond them a call gets RESOURCE_EXHAUSTED, reason
// "server_busy", with the trailer common::kServerBusyMetadata that tells a client it may send
// the call again: nothing changed. (Calls per connection are GrpcServer's cap.)
#ifndef PS_SERVER_RPC_SERVICE_H_
#define PS_SERVER_RPC_SERVICE_H_

#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "common/rpc/following_payload.h"
#include "common/rpc/frame.h"
#include "common/rpc/shared_memory.h"
#include "common/thread_pool.h"
#include "grpcpp/generic/async_generic_service.h"
#include "proto/ps.grpc.pb.h"
#include "server/rpc/auth.h"
#include "server/rpc/late_pause.h"
#include "server/shard.h"

namespace ps::server {

// The rejection reason (RejectionReason) of a call refused because the server holds too many
// requests already (ServiceOptions::max_pool_requests); its answer carries
// common::kServerBusyMetadata.
inline constexpr char kServerBusyReason[] = "server_busy";

struct ServiceOptions {
  // Threads running pulls and pushes. REQUIRES: > 0.
  int num_threads = 4;
  // Longest a pull waits for the consistency bound (also capped by the call's deadline).
  absl::Duration max_pull_wait = absl::Minutes(10);
  // Pulls parked waiting for the consistency bound (they hold no thread, but memory and a
  // call): at most this many per worker and in all; more get RESOURCE_EXHAUSTED.
  // REQUIRES: > 0.
  size_t max_parked_pulls_per_worker = 16;
  size_t max_parked_pulls = 1024;
  // Bytes of the requests parked pulls keep (a pull's request; a PushPull frame's header,
  // its payload is let go once the push is applied), per worker and in all; a pull beyond
  // them gets RESOURCE_EXHAUSTED (too_many_waiting) instead of parking. REQUIRES: > 0.
  uint64_t max_parked_bytes_per_worker = uint64_t{256} << 20;
  uint64_t max_parked_bytes = uint64_t{1} << 30;
  // Whose calls are checked, and how (server/rpc/auth.h): who may act as which worker, who
  // may administer.
  AuthOptions auth;
  // Idle payload buffers kept for reuse (receive gathers and pull answers), bytes.
  size_t max_cached_payload_bytes = size_t{512} << 20;
  // The largest pull answer served, bytes (server.max_message_bytes: gRPC would not send a
  // larger one). A pull asking for more (e.g. one block named many times) is refused with
  // RESOURCE_EXHAUSTED, reason answer_too_large, before anything is allocated or read. The
  // values of an answer written into the worker's shared segment, within the room the call
  // gave it, are bounded by that room instead; its header still by this.
  uint64_t max_answer_bytes = uint64_t{512} << 20;
  // Requests handed to the pool (those of 4 MB or more, and pushes of a deterministic-BSP
  // job) hold their bytes from arrival until served. At most this many such requests, and
  // this many of their bytes, wait for or run on the pool at once; one more is refused with
  // RESOURCE_EXHAUSTED (reason "server_busy", the trailer kServerBusyMetadata set) and
  // changes nothing. A request is always let in when none is held, so any request within
  // the message size limit can be served. REQUIRES: > 0.
  size_t max_pool_requests = 64;
  size_t max_pool_request_bytes = size_t{1} << 30;
  // Answers handed to gRPC that their peers have not taken yet, bytes: a peer that does not
  // read keeps its answers in this server until its calls end. While more than this is
  // held, new Pull and PushPull calls get RESOURCE_EXHAUSTED ("server_busy", retryable) and
  // change nothing. It is checked again as a call handed to the pool starts there (still
  // before anything changes), and right before each pull is read, wherever that runs (a
  // pull refused there that came with a push applied first says so: sent again, that push is
  // a duplicate). Counted for calls from a completion queue (ServeFromQueue).
  size_t max_unsent_answer_bytes = size_t{2} << 30;
  // The same per connection (the peer's address and port, as gRPC names it): while more than
  // this is held for one connection, that connection's new Pull and PushPull calls are
  // refused the same way (checked where max_unsent_answer_bytes is), so that one peer that
  // does not read cannot take the whole max_unsent_answer_bytes and have every other peer's
  // pulls refused.
  size_t max_unsent_answer_bytes_per_peer = size_t{512} << 20;
  // Largest shared-memory segment made for a worker that asks for one (one per worker; a
  // worker's new one replaces its old one), bytes. 0 = none is made. A replaced segment lives
  // on while calls or parked pulls hold it: a worker with kMaxSegmentsHeldPerWorker segments
  // alive gets no new one until one goes.
  size_t max_shared_bytes_per_worker = 0;
  // How long a thread serving workers' shared-memory channels polls them for the next call
  // before it sleeps (server.busy_poll_us; common/rpc/busy_poll.h). Zero: it sleeps at once.
  absl::Duration channel_busy_poll = absl::ZeroDuration();
  // A worker whose push payload, written after its call (common/rpc/following_payload.h), was
  // waited for longer than this, or whose waits took longer than honest copies by more than
  // this together (a debt that drains at 1/32 of the time passing: server/rpc/late_pause.h),
  // sends its payloads whole for a while (late_following_pause). An honest worker copies a
  // following payload of at most 4 MB in well under a millisecond (1 MB: 30-40 us on the
  // development VM); 10 ms leaves room for its being descheduled once.
  absl::Duration late_following = absl::Milliseconds(10);
  // How long such a worker sends its payloads whole (its answers and new offers lack
  // push_may_follow, and a frame of it whose payload follows is refused at once) after its
  // first late payload: each later one doubles the pause (at most 64x), and each 64 of these
  // of quiet after a pause ended take one doubling off (server/rpc/late_pause.h). So a worker
  // that never writes its count, or writes it just in time, holds a channel thread
  // (FollowingPayload::MaxWait, at most 310 ms) once per 10 s at first and at most once per
  // 11 minutes in the long run; one that writes it just under late_following each time is
  // paused once its waits beyond honest copies pass late_following together; and an honest
  // worker late now and then (a loaded host) follows again 20 s later. 0: no pause.
  absl::Duration late_following_pause = absl::Seconds(10);
  // The clock those pauses are timed by; null: a monotonic clock (tests set their own).
  std::function<absl::Time()> pause_clock;
  // Most threads that serve the workers' shared-memory channels, each serving its channels
  // one pass after another; 0 = a thread per channel. ps_server: half the cores it may use,
  // at least 1 (co-located workers need the other half).
  size_t channel_threads = 0;
};

// Hooks into the process that owns the service (checkpointing, shutdown).
struct ServiceHooks {
  // Writes a checkpoint now and returns what was written.
  std::function<absl::StatusOr<CheckpointResponse>()> checkpoint;
  // Starts a graceful shutdown (returns at once).
  std::function<void(bool checkpoint)> shutdown;
  // Fills restore facts of ServerInfo (restored checkpoint, updates lost).
  std::function<void(ServerInfoResponse*)> server_info;
  // Fills checkpoint facts of Stats.
  std::function<void(StatsResponse*)> stats;
};

// Thread-safe.
//
// Metrics (registered in the registry given to the constructor): latency histograms of pulls
// and pushes from arrival to answer (ps_server_{pull,push}_latency_seconds), the time pulls
// wait for the consistency bound, request and response bytes, answers by method and code,
// and refused requests by method, code and reason (the reason Shard::Reject tagged the status
// with; "other" when none). Each pull or push costs a few atomic adds; a refused one also a
// lookup under a mutex.
class ParameterServerService final
    : public ::ps::ParameterServer::WithRawCallbackMethod_PushPull<
          ::ps::ParameterServer::CallbackService> {
 public:
  // `shard` is not owned and must outlive the service. The service registers its metrics in
  // `metrics` (not owned, must outlive the service; nullptr = a registry of its own).
  ParameterServerService(Shard* shard, const ServiceOptions& options, ServiceHooks hooks,
                         common::metrics::Registry* metrics = nullptr);
  // Parked pulls get UNAVAILABLE; queued work runs, then the pool's threads are joined.
  ~ParameterServerService() override;

  // Segments of one worker that may be alive at once (ServiceOptions::max_shared_bytes_per_worker):
  // its current one and one replaced while a call or a parked pull still held it.
  static constexpr int kMaxSegmentsHeldPerWorker = 2;

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const PullRequest* request, PullResponse* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const PushRequest* request, PushResponse* response) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const StatsRequest* request, StatsResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const CheckpointRequest* request,
                                       CheckpointResponse* response) override;
  grpc::ServerUnaryReactor* ServerInfo(grpc::CallbackServerContext* context,
                                       const ServerInfoRequest* request,
                                       ServerInfoResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* context,
                                     const ShutdownRequest* request,
                                     ShutdownResponse* response) override;

  // The request handlers without gRPC around them (used by the service and by tests/fuzzers).
  // They count in the metrics as requests do.
  // They block the calling thread while a pull waits for the bound (the gRPC methods do not).
  absl::Status HandlePull(const PullRequest& request, absl::Time deadline,
                          PullResponse* response);
  absl::Status HandlePush(const PushRequest& request, PushResponse* response);
  // Heartbeat from `peer`: PERMISSION_DENIED when the peer is not the worker the header
  // names; FAILED_PRECONDITION for `finished` from an incarnation that is not the worker's
  // current one (only the running process may say it is done). A tool's heartbeat (negative
  // id) changes nothing.
  absl::Status HandleHeartbeat(const PeerIdentity& peer, const HeartbeatRequest& request,
                               HeartbeatResponse* response);
  // Shutdown from `peer`: PERMISSION_DENIED unless an operator; INVALID_ARGUMENT without a
  // reason; UNIMPLEMENTED without a shutdown hook. Logs who asked and why.
  absl::Status HandleShutdown(const PeerIdentity& peer, const ShutdownRequest& request);
  // A PushPull frame; `response` receives the answer frame when OK.
  absl::Status HandlePushPull(const grpc::ByteBuffer& request, absl::Time deadline,
                              grpc::ByteBuffer* response);
  // The asynchronous form (StartPushPull): `done` gets the status once the call is answered;
  // `request` is cleared once its push is applied.
  void StartPushPullForTest(grpc::ByteBuffer* request, absl::Time deadline,
                            grpc::ByteBuffer* response, std::function<void(absl::Status)> done,
                            bool from_channel = false) {
    StartPushPull(request, deadline, response, absl::Now(), nullptr, std::move(done), from_channel);
  }

  // Every method from a completion queue (GrpcServer's way). gRPC's callback API hands each
  // call from the thread that polled the socket to an executor thread and back, and its own
  // polling threads take turns with the others (four to seven context switches per call); a
  // thread that polls a queue of its own reads a request, serves it and writes the answer
  // itself. Call once, before the service is registered with a server that has `cq`
  // (ServerBuilder::AddCompletionQueue) and health_service() as its generic service. A
  // service built without it serves on the callback API (tests with in-process servers).
  void ServeFromQueue();
  // grpc.health.v1.Health/Check for ServeFromQueue (register with
  // ServerBuilder::RegisterAsyncGenericService; gRPC's default health service would bring
  // the callback threads back). It answers SERVING until SetServing(false).
  grpc::AsyncGenericService* health_service();
  void SetServing(bool serving);
  // Serves calls of `cq` on the calling thread (any number of threads may) until StopQueue
  // has shut the queue down and it is drained. After each event the thread polls the queue
  // for up to `busy_poll` before it sleeps (common/rpc/busy_poll.h).
  void ServeQueue(grpc::ServerCompletionQueue* cq, absl::Duration busy_poll = absl::ZeroDuration());
  // After the server's Shutdown: no new calls are asked for, calls still running (parked
  // pulls included: the server's shutdown cancels them) are answered, then `cq` is shut
  // down. Idempotent.
  void StopQueue(grpc::ServerCompletionQueue* cq);

  // Stops serving the shared-memory channels, as the gRPC server's shutdown stops the socket's
  // calls: each channel is taken off its thread once the call being served ends, the channel is
  // closed (its worker's calls not taken yet end ABORTED and go by the socket), and calls a
  // channel handed to the pool are waited for, up to `timeout`; those still running then are
  // answered UNAVAILABLE when they end, never OK. Segments made after it get no channel. A
  // server's drain calls it before the final checkpoint, so that no push is acknowledged
  // after it; the destructor too. Idempotent.
  void StopChannels(absl::Duration timeout = absl::Seconds(5)) ABSL_LOCKS_EXCLUDED(shared_mu_);
  // Threads started so far to serve the shared-memory channels (ServiceOptions::channel_threads).
  size_t channel_threads_started();

  // Payload copies and buffer allocations of the frame path (tests assert zero-copy on them).
  const common::DataPathCounters& data_path_counters() const { return counters_; }

  // Requests handed to the pool and not yet done (see max_pool_requests).
  size_t pool_requests() const ABSL_LOCKS_EXCLUDED(pool_mu_);
  // Bytes of answers given to gRPC and not yet taken (see max_unsent_answer_bytes).
  size_t unsent_answer_bytes() const {
    return unsent_answer_bytes_.load(std::memory_order_relaxed);
  }
  // Blocks until exactly `n` requests are held by the pool.
  void WaitForPoolRequestsForTest(size_t n) ABSL_LOCKS_EXCLUDED(pool_mu_);
  // Calls from the completion queues alive: asked for, or running until their last tag.
  size_t QueuedCallsForTest() ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Runs `task` on the pool, outside its caps (tests hold the pool's threads with it).
  void RunOnPoolForTest(std::function<void()> task) { pool_.Schedule(std::move(task)); }

 private:
  struct Metrics;
  // A PushPull frame counts as a push when it carries one, as a pull otherwise.
  enum Method { kPull = 0, kPush = 1 };
  // The reactor of Pull and PushPull: takes a parked pull back when the client cancels.
  class CallReactor;
  // What a PushPull's answer needs once its pull may read.
  struct PushPullCall;
  // Calls taken from a completion queue (ServeQueue): what a tag points at, a unary call of
  // a method, and the health check.
  class QueuedCall;
  class UnaryCall;
  template <class Request, class Response>
  class TypedCall;
  class HealthCall;
  // Asks `cq` for the next call of `method` (an index of the service's methods, or the
  // health check after them), unless StopQueue has begun.
  void RequestQueuedCall(int method, grpc::ServerCompletionQueue* cq)
      ABSL_LOCKS_EXCLUDED(queue_mu_);
  // The calls of RequestQueuedCall, by kind of method.
  void NewDataCall(int method, grpc::ServerCompletionQueue* cq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_);
  void NewControlCall(int method, grpc::ServerCompletionQueue* cq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_);
  // The most a request of `method` may take parsed (TypedCall): max_answer_bytes for Pull and
  // Push, 1 MiB for the control methods, whose requests are a few fields.
  size_t MaxParsedRequestBytes(int method) const;
  // Counts a request refused before it was parsed (`status` from common::ParseWithin) and
  // gives the refusal its reason: request_too_large or unparseable.
  absl::Status RefuseUnparsed(int method, absl::Status status);
  void NewWorkerControlCall(int method, grpc::ServerCompletionQueue* cq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_);
  // Called exactly once with a call's outcome (after it was counted in the metrics).
  using Done = std::function<void(absl::Status)>;
  using WaiterId = WorkerTracker::WaiterId;

  // Serves a pull, with the latency counted from `arrived`: `done` gets its status, at once
  // or, when the pull is parked, later on another thread. Returns the parked pull's id (0 when
  // not parked). `answer_peer`: the connection its answer goes to, for a call from a
  // completion queue (ServerContext::peer(): its answer is counted until taken, and checked
  // as AfterBound says); nullopt for others (the callback API, HandlePull: not counted).
  // `request`, `response` and the bytes of `answer_peer` must live until `done` is called.
  WaiterId StartPull(const PullRequest& request, absl::Time deadline, PullResponse* response,
                     absl::Time arrived, Done done, std::optional<absl::string_view> answer_peer);
  // `deadline`: the call's (a deterministic push waits for its turn until then at most).
  absl::Status ServePush(const PushRequest& request, PushResponse* response, absl::Time arrived,
                         absl::Time deadline = absl::InfiniteFuture());
  // As StartPull for a frame. `peer`: the caller, checked against the frame's worker id
  // before this returns; nullptr = not checked (tests).
  // `from_channel`: the frame came through a shared-memory channel (it may not ask for a
  // segment: the channel's thread would replace its own). `request` is cleared once the push
  // is applied: a pull that waits for the bound keeps only the frame's header. `answer_peer`:
  // as StartPull's (nullopt for a channel's call too: its answer goes into the segment).
  WaiterId StartPushPull(grpc::ByteBuffer* request, absl::Time deadline, grpc::ByteBuffer* response,
                         absl::Time arrived, const PeerIdentity* peer, Done done,
                         bool from_channel = false,
                         std::optional<absl::string_view> answer_peer = std::nullopt);
  // Whether this thread serves channels and found the call it serves while polling, not after
  // sleeping: its answer tells the worker that its next payload may follow its call
  // (PushPullResponse.push_may_follow).
  static bool ChannelCallPolled();
  // Decoding done: the shard checks and applies the push (Shard::Push), waiting for a
  // `following` payload's bytes as it checks them (PushView::following).
  absl::Status PushImpl(const RequestHeader& header, bool is_delta,
                        absl::Span<const PushTable> tables, PushResponse* response,
                        absl::Time deadline, common::FollowingPayload* following = nullptr);
  // A frame up to its pull: parsed, checked (pull included), push applied.
  absl::Status PushPullBegin(const grpc::ByteBuffer& request, const PeerIdentity* peer,
                             bool from_channel, PushPullCall* call, absl::Time deadline);
  // The answer frame of `call`, with its pull read now.
  absl::Status PushPullAnswer(PushPullCall* call, grpc::ByteBuffer* response);
  // The segment of a PushPull that names one (header.shared), its ranges checked: ABORTED
  // when it is not the worker's current segment (it asks for a new one and sends the call
  // again without it), INVALID_ARGUMENT for a range outside it.
  absl::StatusOr<std::shared_ptr<common::SharedMemory>> SharedSegmentOf(
      const PushPullRequest& header, const common::FrameReader& reader);
  // Makes (or replaces) the worker's segment and describes it in `offer`; false (no offer)
  // when off, when making it fails, for a worker id outside the job, or while a newer
  // incarnation of the worker has one. A segment large enough gets a channel, served as
  // `peer` (nullptr: identities not checked).
  bool OfferSharedSegment(const RequestInfo& info, uint64_t bytes, const PeerIdentity* peer,
                          SharedSegment* offer);
  // Lets go of the worker's segment `id` (its current incarnation's), logging `why`: one it
  // could not open (PushPullRequest.declined_shared_id), or one offered in an answer that was
  // then refused. Any other id changes nothing (a later ask's segment stays). Waits for the
  // channel's thread to finish its pass. REQUIRES: not on a channel thread.
  void DropSegment(const RequestInfo& info, uint64_t id, absl::string_view why);
  // Runs `read` once the consistency bound lets `info`'s pull through (at once on this thread,
  // or on the pool after parking, capped by max_pull_wait), records the wait, then `done` with
  // read's status; `done` gets the refusal instead when the pull may not wait. Returns the
  // parked pull's id, 0 when it did not park. `answer_peer`: the connection the answer goes
  // back to, when gRPC holds it there until taken (a call from a completion queue; nullopt
  // for others, such as a shared-memory channel's, whose answer goes into the worker's
  // segment): that connection's answers not yet taken, and all connections' together, are
  // checked against their caps (CheckUnsentAnswers) right before `read`, wherever it runs;
  // beyond one, `done` gets server_busy instead of the read. Its bytes must live until `done`
  // is called. `held_bytes`: what the pull keeps of its request while parked (counted against
  // max_parked_bytes*).
  WaiterId AfterBound(const RequestInfo& info, absl::Time deadline,
                      std::function<absl::Status()> read, Done done,
                      std::optional<absl::string_view> answer_peer, uint64_t held_bytes);
  // True when a push may wait for its deterministic-BSP turn (it is then served on the pool).
  bool PushesWait() const;
  // Runs `serve` (a call's whole work) on the pool, counted against max_pool_requests and
  // max_pool_request_bytes until it returns, and returns OK; or, when the request's `bytes`
  // do not fit, returns RESOURCE_EXHAUSTED ("server_busy", counted) without running it: the
  // caller answers the call with that status, and nothing has changed.
  absl::Status ServeOnPool(size_t bytes, std::function<void()> serve)
      ABSL_LOCKS_EXCLUDED(pool_mu_);
  // RESOURCE_EXHAUSTED ("server_busy", counted) while more than max_unsent_answer_bytes of
  // answers wait for their peers, or more than max_unsent_answer_bytes_per_peer for the
  // connection `peer` (ServerContext::peer()); OK otherwise. `what` names what the refusal
  // left unchanged ("this call", "this pull").
  absl::Status CheckUnsentAnswers(absl::string_view peer, absl::string_view what = "this call")
      ABSL_LOCKS_EXCLUDED(unsent_mu_);
  // The server-wide half of CheckUnsentAnswers.
  absl::Status CheckUnsentAnswerTotal(absl::string_view what);
  // Their busy refusal: `held` bytes of answers wait for `takers` over `cap` (`limit`).
  absl::Status UnsentAnswersBusy(size_t held, absl::string_view takers, absl::string_view cap,
                                 size_t limit, absl::string_view what);
  // RESOURCE_EXHAUSTED (answer_too_large) for a pull answer of `payload_bytes` of values and
  // `header_bytes` of the rest over max_answer_bytes, unless its values go into a shared
  // segment's room of `shared_room` bytes (0: none).
  absl::Status CheckAnswerSize(uint64_t payload_bytes, uint64_t header_bytes, uint64_t shared_room);
  // A bound on the bytes of an answer to `tables` besides the values: names, block headers,
  // and the keys when the answer echoes them (a protobuf PullResponse; a frame does not).
  static uint64_t AnswerHeaderBytes(
      const google::protobuf::RepeatedPtrField<TablePullRequest>& tables, bool echo_keys);
  // Answers of `bytes` for `peer` handed to gRPC, and taken (or dropped with their call).
  void HoldAnswerBytes(const std::string& peer, size_t bytes) ABSL_LOCKS_EXCLUDED(unsent_mu_);
  void ReleaseAnswerBytes(const std::string& peer, size_t bytes) ABSL_LOCKS_EXCLUDED(unsent_mu_);
  // Reads a pull Shard::CheckPull accepted (`views` of `tables`) into `out` (the payload
  // bytes CheckPull returned; payload lengths go into the answer's headers) or, with
  // out == nullptr, into the answer's bytes fields. `stream`: Shard::ReadPull's.
  absl::Status ReadPull(const google::protobuf::RepeatedPtrField<TablePullRequest>& tables,
                        absl::Span<const PullTable> views, PullResponse* response, char* out,
                        bool stream = false);
  // The pushed tables of a frame, their payloads taken from `reader`: dense blocks as views
  // of the receive slices (kept in `pieces`), sparse rows contiguous (gathered into `scratch`,
  // acquired here from buffers_, where they span slices).
  absl::Status FramePushParts(const PushPullRequest& header, common::FrameReader* reader,
                              common::BufferPool::Buffer* scratch,
                              std::vector<absl::string_view>* pieces,
                              std::vector<PushTable>* tables);
  // Counts an unparseable request and logs it (at most once per 10 s).
  absl::Status Unparseable(absl::Status status);
  void Record(Method method, absl::Time arrived, const absl::Status& status, size_t bytes_in,
              size_t bytes_out);
  // Counts an answer of one of the other methods.
  void CountCall(const char* method, const absl::Status& status);
  // The peer of `context` may act as worker `worker_id` (see PeerAuthorizer::CheckWorker);
  // a refusal is counted under the reason "identity".
  absl::Status CheckWorker(const grpc::CallbackServerContext& context, int32_t worker_id,
                           const char* method);

  Shard* const shard_;  // Not owned.
  const ServiceOptions options_;
  const ServiceHooks hooks_;
  const PeerAuthorizer auth_;
  std::unique_ptr<common::metrics::Registry> own_registry_;  // when none was given
  std::unique_ptr<Metrics> metrics_;
  common::DataPathCounters counters_;
  const std::shared_ptr<common::BufferPool> buffers_;
  // Serves the calls a worker posts in its segment's channel, on one of ChannelThreads'.
  class ChannelServer;
  class ChannelThreads;
  struct ChannelThreadsDeleter {
    void operator()(ChannelThreads* t) const;
  };
  static std::unique_ptr<ChannelThreads, ChannelThreadsDeleter> NewChannelThreads(
      const ServiceOptions& options);
  // Before shared_: goes after the channels it serves.
  const std::unique_ptr<ChannelThreads, ChannelThreadsDeleter> channel_threads_;
  // Segments of each worker alive (its current one and replaced ones still held), by worker
  // id; shared with the segments' deleters, which may run after the service is gone.
  std::shared_ptr<std::atomic<int>[]> segments_alive_;
  // Each worker's shared-memory segment (the latest its newest incarnation asked for).
  struct WorkerSegment {
    uint64_t incarnation = 0;
    std::shared_ptr<common::SharedMemory> memory;
    uint64_t channel_offset = 0;             // 0: no channel; payload ranges lie below it
    std::shared_ptr<ChannelServer> channel;  // destroyed (joined) outside shared_mu_
  };
  absl::Mutex shared_mu_;
  absl::flat_hash_map<int32_t, WorkerSegment> shared_ ABSL_GUARDED_BY(shared_mu_);
  // Set by StopChannels: segments made from then on get no channel.
  bool channels_stopped_ ABSL_GUARDED_BY(shared_mu_) = false;
  // Workers whose payload, written after its call, did not come in time or was waited for
  // longer than ServiceOptions::late_following, by worker id: until `until`, their answers
  // and new offers lack push_may_follow, and a frame of theirs that says its payload follows
  // is refused at once ("late_follower", ABORTED). See ServiceOptions::late_following_pause.
  absl::flat_hash_map<int32_t, LatePause> late_followers_ ABSL_GUARDED_BY(shared_mu_);
  // The latest end of a pause in late_followers_, in PauseNow()'s Unix nanoseconds
  // (kNoLatePause: none yet): answers after it skip shared_mu_.
  static constexpr int64_t kNoLatePause = std::numeric_limits<int64_t>::min();
  std::atomic<int64_t> late_pauses_end_ns_{kNoLatePause};
  // Whether `worker_id` is paused now (late_followers_).
  bool LateFollower(int32_t worker_id) ABSL_LOCKS_EXCLUDED(shared_mu_);
  // Pauses `worker_id` for a payload that came late (late_followers_).
  void MarkLateFollower(int32_t worker_id) ABSL_LOCKS_EXCLUDED(shared_mu_);
  // What `worker_id`'s waits for its payloads took beyond honest copies, draining with time
  // (late_pause.h, WaitDebt); reset when it pauses the worker.
  absl::flat_hash_map<int32_t, WaitDebt> wait_debts_ ABSL_GUARDED_BY(shared_mu_);
  // Adds a wait of `waited` for a payload of `bytes` to `worker_id`'s debt: whether the debt
  // is now over ServiceOptions::late_following (and then it is reset). Takes no lock when the
  // wait was no longer than an honest copy.
  bool OwesTooMuchWaiting(int32_t worker_id, absl::Duration waited, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(shared_mu_);
  // The time pauses are measured in (ServiceOptions::pause_clock).
  absl::Time PauseNow() const;

  // Channel calls handed to the pool (deterministic BSP) and not yet served.
  std::atomic<int> channel_pool_calls_{0};
  // Set once StopChannels stopped waiting for them: a channel call answered later is
  // answered UNAVAILABLE, never OK (the final checkpoint may not hold what it applied).
  std::atomic<bool> channel_answers_closed_{false};
  absl::Mutex log_mu_;
  absl::Time last_unparseable_log_ ABSL_GUARDED_BY(log_mu_) = absl::InfinitePast();
  uint64_t unlogged_unparseable_ ABSL_GUARDED_BY(log_mu_) = 0;
  grpc::AsyncGenericService generic_;  // the health check (ServeFromQueue)
  std::atomic<bool> serving_{true};
  absl::Mutex queue_mu_;
  bool queue_stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  bool queue_stopped_ ABSL_GUARDED_BY(queue_mu_) = false;
  // QueuedCalls alive (asked for, or running until their last tag).
  size_t queued_calls_ ABSL_GUARDED_BY(queue_mu_) = 0;
  // Requests held by the pool (ServeOnPool) and their bytes.
  mutable absl::Mutex pool_mu_;
  size_t pool_requests_ ABSL_GUARDED_BY(pool_mu_) = 0;
  size_t pool_request_bytes_ ABSL_GUARDED_BY(pool_mu_) = 0;
  // Answers between Finish and their finish tag (UnaryCall).
  std::atomic<size_t> unsent_answer_bytes_{0};
  // The same per connection; connections without answers held have no entry.
  absl::Mutex unsent_mu_;
  absl::flat_hash_map<std::string, size_t> unsent_by_peer_ ABSL_GUARDED_BY(unsent_mu_);
  common::ThreadPool pool_;
};

}  // namespace ps::server

#endif  // PS_SERVER_RPC_SERVICE_H_
