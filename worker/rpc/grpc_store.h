// GrpcParameterStore: the ParameterStore of a worker in a distributed job.
//
// Each Pull, Push or PushPull is split by the Partitioner into one PushPull frame per server
// (common/rpc/frame.h), sent concurrently, and reassembled in order: float32 gradients go to
// the socket as slices aliasing the caller's buffers, and pulled parameters are copied once,
// from gRPC's receive slices into the caller's buffers. Sparse keys are deduplicated before
// pulling. Every call has a deadline; calls that fail with UNAVAILABLE or DEADLINE_EXCEEDED,
// or with a RESOURCE_EXHAUSTED the server marked busy (common::kServerBusyMetadata: it
// held too many requests and this one changed nothing), are retried with exponential
// back-off and jitter (pushes carry (worker, incarnation, sequence), with a sequence of their
// own per server, so a retried push is applied at most once). Other refusals, another
// RESOURCE_EXHAUSTED included (a message over the size limit, too many waiting pulls), say
// the request cannot be served as it is and are returned at once. A push goes only to the servers that hold some of its data, except under a
// consistency bound (training.staleness) or deterministic BSP, where every server hears of
// every push (an empty one at worst) so that its view of the worker's clock advances. A push
// of an empty batch is a clock tick and goes to every server.
//
// Pushes of tables with a 16-bit wire_encoding use error feedback (PushResiduals) unless
// the table sets wire_error_feedback: false. Each Push encodes its gradients once, before
// the first attempt, and every retry resends those bytes, so a retried push neither re-adds
// nor loses a residual. A push that fails for good has still moved the residuals (its
// gradient is lost either way).
#ifndef PS_WORKER_RPC_GRPC_STORE_H_
#define PS_WORKER_RPC_GRPC_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "common/parameter_store.h"
#include "common/partitioner.h"
#include "common/rpc/handoff_chooser.h"
#include "common/rpc/shared_channel.h"
#include "common/rpc/shared_memory.h"
#include "common/stream_copy.h"
#include "common/thread_pool.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/config.pb.h"
#include "proto/ps.grpc.pb.h"
#include "worker/rpc/push_residuals.h"

namespace ps::common {
class FrameReader;  // common/rpc/frame.h
}  // namespace ps::common

namespace ps::worker {

struct GrpcStoreOptions {
  // This worker's index and process incarnation (e.g. start time in ns). -1 = a tool, which
  // takes no part in exactly-once or the consistency bound.
  int32_t worker_id = 0;
  uint64_t worker_incarnation = 1;
  // Deadline of each attempt.
  absl::Duration deadline = absl::Seconds(60);
  // Retries after UNAVAILABLE / DEADLINE_EXCEEDED / a busy server; then the error is returned.
  uint32_t max_retries = 20;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // Called before each retry (server index, attempt, error); for logs and tests.
  std::function<void(uint32_t, uint32_t, const absl::Status&)> on_retry;
  // Asked before each retry (may be empty): true returns the error instead, e.g. once the
  // process was asked to stop, so that servers that are gone do not hold it for every retry.
  std::function<bool()> give_up_retries;
  // Called when a server answers again after failed attempts (server index, retries, time
  // since the first failure); for logs and recovery measurements.
  std::function<void(uint32_t, uint32_t, absl::Duration)> on_recovered;
  // Error feedback of 16-bit pushes: the most sparse rows per table that keep a residual
  // (LRU; each costs dim floats plus about 64 bytes). 0 = no feedback for sparse tables.
  size_t max_residual_rows = PushResiduals::kDefaultMaxSparseRows;
  // Float32 dense bytes of one server's pull answer from which their copy into the caller's
  // buffers is split over up to 4 threads, at most the cores the process may use (this one
  // and up to 3 helpers kept for the copies, which watch for the next one as long as
  // `busy_poll`; common/startup/cores.h), in runs of whole blocks: the copy is the last step
  // of a pull and the server has nothing to send meanwhile (rpc.parallel_copy_bytes).
  // 0 = never split, the default: on the shared 2-core development VM the helpers wait for
  // a core (1 MB pulls a tenth slower, 64 MB within the host's drift: the lab note
  // 2026-12-04-lent-gpu-pull-ranges.md; threads started per copy made 64 MB pulls slower:
  // docs/lab/2026-12-02-large-payloads.md). For workers with idle cores.
  size_t parallel_copy_bytes = 0;
  // A pull (a call without a push) of at least twice this many dense bytes from one server
  // asks for them in pieces of about this size, whole blocks each, at most max_pull_pieces
  // per server, sent at once as separate frames. The server reads (copies) each piece and
  // sends it on its own, and this side copies each answer into the caller's buffers as it
  // arrives (as every call's answers are): the two copies of a large pull overlap the transfer instead of preceding
  // and following it. Each piece is its own pull (it waits for the consistency bound, parks
  // and is retried on its own; a parked piece counts against the server's
  // max_parked_pulls_per_worker); each block is still read whole, under its lock, as in one
  // frame, where a pull was never one cut across blocks either. A call that also pushes is
  // never split (its pull must see its push). A pull that fails may have written some of the
  // caller's blocks (each whole), those of the frames answered before the failure.
  // 0 = one frame per server, the default: on the shared 2-core development VM 64 MB pulls in
  // 4-8 pieces took 40-50% more CPU per call on each side and were not faster
  // (docs/lab/2026-12-02-large-payloads-2.md). Try it where both sides have idle cores.
  size_t pull_piece_bytes = 0;
  // The most frames one server gets for one pull in pieces (see pull_piece_bytes).
  uint32_t max_pull_pieces = 8;
  // Asynchronous calls (AsyncCalls): a push starts only when this object's oldest unfinished
  // push to each server is fewer than this many sequences behind that server's next one, so
  // that its retries still count once. REQUIRES: 1..1024 (the servers remember 1024 applied
  // sequences above their floor).
  uint64_t max_sequence_lead = 512;
  // While the calling thread waits for answers it polls its completion queue for up to this
  // long before it sleeps (rpc.busy_poll_us; common/rpc/busy_poll.h). Zero: it sleeps at once.
  absl::Duration busy_poll = absl::ZeroDuration();
  // Shared memory asked of each server (rpc.shared_memory_mb; common/rpc/shared_memory.h),
  // bytes: a server on this host that grants it gets payloads through it instead of the
  // socket. 0 = never asked.
  size_t shared_memory_bytes = 0;
  // A server that answered an ask without a segment (its memory budget had no room, or it
  // could not make one) is asked again after this long, then after twice as long each time it
  // declines, up to 64 times this; so is one this process could not map for want of
  // descriptors or memory (EMFILE, ENOMEM). A segment this host cannot open (another host's)
  // is never asked for again. REQUIRES: > 0.
  absl::Duration shared_memory_reask = absl::Seconds(1);
  // With shared memory, calls go through the segment's channel when the server made one
  // (rpc.shared_memory_calls; common/rpc/shared_channel.h), else by the socket.
  bool shared_memory_calls = true;
  // A push through a channel may be posted before its payload is copied into the segment, the
  // server checking the payload as it arrives (rpc.overlap_push_copy;
  // common/rpc/following_payload.h): payloads of kMinFollowingBytes to kMaxFollowingBytes,
  // dense only, copied by one thread, to a server whose segment allows it and whose latest
  // answer through that channel said its thread has a core to wait on
  // (PushPullResponse.push_may_follow). Following pays where the server's thread checks on a
  // core of its own while the worker copies, and costs where the two share one (2 workers
  // and 2 servers training on 2 vCPUs: pull + push 0.63-0.96 of compute whole, 1.19-1.58
  // following; docs/lab/2026-12-06-following-payloads.md).
  bool overlap_push_copy = true;
  // A push payload of at least this many bytes is copied into shared memory by the calling
  // thread and a helper, where the process may use 2 cores or more: the server waits for
  // the whole payload, so a second core is idle meanwhile (64 MB pushes: 7.4 -> 10.8 GB/s on
  // the 2-core development VM, docs/lab/2026-12-03-shared-memory.md). 0 = never.
  size_t parallel_copy_in_bytes = size_t{8} << 20;
  // A push whose payloads (all servers' together) are more than this many bytes is copied
  // into shared memory with non-temporal stores (common/stream_copy.h): larger than the
  // last-level cache, the servers read it from memory whichever way it was written, and plain
  // stores would first read every line they write. 64 MB pushes on the 2-core development VM:
  // client CPU per push 9.1-10.9 -> 5.6-6.8 ms (docs/lab/2026-12-03-streamed-copies.md).
  // Default: this host's last-level cache. SIZE_MAX = never.
  size_t stream_copy_in_bytes = common::LastLevelCacheBytes();
  // Below that, a call through shared memory that hands more than common::kHandoffStreamBytes
  // (push payload and pull answer) streams both or neither (rpc.handoff): ADAPTIVE, as its
  // link's HandoffChooser says (common/rpc/handoff_chooser.h), whichever has cost less per
  // byte lately; PLAIN, neither; STREAMED, both. The way that pays depends on where the worker
  // and the server run (1 MB pushes on the development VM: plain 1,748-9,208 MB/s, streamed
  // 6,952-8,193 with one pair; plain 1.4-2.0x faster with two;
  // docs/lab/2026-12-03-cross-core-handoff.md).
  RpcConfig::Handoff handoff = RpcConfig::HANDOFF_ADAPTIVE;
  // LendPushBuffer lends (rpc.lend_push_buffers); false: it lends nothing.
  bool lend_push_buffers = true;
  // A dense pull whose float32 answers (all servers' together) are more than this many bytes
  // is copied into the caller's buffers with non-temporal stores: a pull touches twice its
  // size (the answer, then this copy), so from half the last-level cache on
  // (server::ShardOptions::stream_pull_bytes; the server's part of the same change).
  // SIZE_MAX = never.
  size_t stream_copy_bytes = common::LastLevelCacheBytes() / 2;
};

// The options of a job's worker `worker_id` (incarnation `incarnation`): deadlines, retries and
// back-off from the config's rpc section, and retries and recoveries logged as warnings.
GrpcStoreOptions JobStoreOptions(const JobConfig& config, int32_t worker_id,
                                 uint64_t incarnation);

// Counters of one store (for the trainer's throughput log).
struct GrpcStoreStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t retries = 0;
  uint64_t duplicate_pushes = 0;
  // Of the payload bytes sent and received, those that went through shared memory.
  uint64_t bytes_shared = 0;
  // Calls (frames to one server) answered through a shared-memory channel, not gRPC.
  uint64_t calls_shared = 0;
  // Of bytes_shared, push payloads the servers read where they lay in a LentBuffer (not
  // copied by this process).
  uint64_t bytes_lent = 0;
  // Calls through shared memory that handed more than common::kHandoffStreamBytes with
  // streamed or with plain stores (GrpcStoreOptions::handoff), answered.
  uint64_t handoffs_streamed = 0;
  uint64_t handoffs_plain = 0;
  // Of those, calls the server said its CPU for (PushPullResponse.served_cpu_ns), weighed by
  // what they cost both sides, not by their time: asked for with rpc.handoff adaptive only,
  // on the calls the HandoffChooser weighs (every try of a way, then one in weigh_every).
  uint64_t handoffs_served_cpu = 0;
  // Of those calls, pushes whose payload could follow its call (GrpcStoreOptions::
  // overlap_push_copy) that did, and that went whole (the server said its thread had no core
  // of its own).
  uint64_t payloads_following = 0;
  uint64_t payloads_whole = 0;

  // "sent <n> bytes, received <n> bytes, <n> retries[, <n> bytes through shared memory][, <n>
  // of <n> push payloads that could follow their call did]", the form tools/ read from the log.
  std::string Summary() const;
};

// Thread-safe.
//
// Metrics (ps_worker_, in the registry given to Create): retries and failed attempts per
// server, payload bytes sent and received, pushes the servers answered as duplicates.
class GrpcParameterStore final : public common::ParameterStore {
 public:
  // Connects to config.cluster().servers (the config must be prepared). INVALID_ARGUMENT if
  // the server list does not match the layout; errors of the credentials. The store
  // registers its metrics in `metrics` (not owned, must outlive the store; nullptr = a
  // registry of its own).
  static absl::StatusOr<std::unique_ptr<GrpcParameterStore>> Create(
      const JobConfig& config, const GrpcStoreOptions& options,
      common::metrics::Registry* metrics = nullptr);
  // With explicit channels, one per server in index order (tests: in-process channels,
  // interceptors).
  static absl::StatusOr<std::unique_ptr<GrpcParameterStore>> CreateWithChannels(
      const JobConfig& config, const GrpcStoreOptions& options,
      std::vector<std::shared_ptr<grpc::Channel>> channels,
      common::metrics::Registry* metrics = nullptr);

  ~GrpcParameterStore() override;

  // Calls kept in flight by one thread (worker/rpc/grpc_async_calls.h).
  class AsyncCalls;
  // A new set of asynchronous calls of this store; it must not outlive the store.
  std::unique_ptr<AsyncCalls> NewAsyncCalls();

  absl::Status Pull(const common::PullBatch& batch, const common::PullOptions& options) override;
  absl::Status Push(const common::PushBatch& batch, const common::PushOptions& options) override;
  // One round trip per server that holds data of the push or the pull.
  absl::Status PushPull(const common::PushBatch& push, const common::PushOptions& push_options,
                        const common::PullBatch& pull,
                        const common::PullOptions& pull_options) override;
  absl::Status Finish() override;
  // Heartbeat(epoch, offset, /*finished=*/false).
  absl::StatusOr<common::WorkerPosition> ReportPosition(uint32_t epoch,
                                                        uint64_t offset) override;
  // A region of the shared-memory segment of the one server holding every block of `tables`
  // (float32 pushes only), once the store has reached that server through one (after a first
  // call to it). At most half the segment is lent at once. A push from it is read by the
  // server where it lies (GrpcStoreStats::bytes_lent); one that cannot be (the segment was
  // given up since: the server restarted) goes by the socket.
  std::unique_ptr<common::LentBuffer> LendPushBuffer(absl::Span<const std::string> tables) override;

  // Waits until every server answers ServerInfo with this job's layout (FAILED_PRECONDITION
  // if one differs) or `timeout` passes (UNAVAILABLE naming the silent servers).
  absl::Status WaitForServers(absl::Duration timeout);
  // Where a worker is, as the servers remember it.
  using Position = common::WorkerPosition;
  // Tells every server where this worker is in its data (offset 0 and epoch 0 = say
  // nothing) and reads back what they remember: the furthest position over the servers,
  // which a restarted worker resumes from.
  absl::StatusOr<Position> Heartbeat(uint32_t epoch, uint64_t offset, bool finished);

  GrpcStoreStats stats() const;
  const common::Partitioner& partitioner() const { return partitioner_; }

 private:
  // Server `s`'s ServerInfo, its answer parsed within 1 MiB (a server's answer of many small
  // unknown fields took tens of times its size parsed by gRPC, up to the receive limit).
  absl::Status ServerInfo(uint32_t s, grpc::ClientContext* context,
                          const ServerInfoRequest& request, ServerInfoResponse* response);
  struct Metrics;
  struct Exchange;
  GrpcParameterStore(const JobConfig& config, const GrpcStoreOptions& options,
                     common::Partitioner partitioner,
                     std::vector<std::shared_ptr<grpc::Channel>> channels,
                     common::metrics::Registry* metrics);
  RequestHeader Header(int64_t clock, uint64_t sequence) const;
  // Starts call `s` on `context` with its completion on `cq`: when the call ends, `*status`
  // holds its outcome and `tag` comes out of cq->Next (whatever the call holds must live
  // until then). Returns the call's reader: it lives in the call's arena, which `context`
  // holds, so FanOut destroys it before the context.
  using StartCall = std::function<std::shared_ptr<void>(uint32_t s, grpc::ClientContext* context,
                                                        grpc::CompletionQueue* cq,
                                                        grpc::Status* status, void* tag)>;
  // Runs start(s) for every s where send[s], concurrently, with retries. The calling thread
  // waits for the answers on a completion queue of its own and reads them itself (it is
  // gRPC's poller while it waits), so an answer wakes no other thread on its way here.
  absl::Status FanOut(const std::vector<bool>& send, const StartCall& start);
  // A completion queue no other thread is using (from spare_queues_, or a new one), and back.
  std::unique_ptr<grpc::CompletionQueue> TakeQueue();
  void GiveQueue(std::unique_ptr<grpc::CompletionQueue> queue);
  // The AsyncCalls of a blocking call (from spare_calls_, or a new one), and back.
  std::unique_ptr<AsyncCalls> TakeCalls();
  void GiveCalls(std::unique_ptr<AsyncCalls> calls);
  absl::Duration Backoff(uint32_t attempt) const;
  // Metrics and stats: a failed attempt to server s, a retry of it, an exchange that ended OK,
  // a call answered through a channel.
  void CountFailure(uint32_t s, const absl::Status& status);
  void CountRetry(uint32_t s);
  void CountSharedCall();
  void CountExchange(const Exchange& x);
  // A call through shared memory that handed its bytes `streamed` or plain, answered.
  void CountHandoff(bool streamed);
  // The push and/or pull (either may be null) as one frame per server, sent and answered.
  absl::Status Run(const common::PushBatch* push, const common::PushOptions& push_options,
                   const common::PullBatch* pull, const common::PullOptions& pull_options);
  // Adds the push to x's frames: checks it (CheckPush), encodes each table (under
  // residuals_mu_) and gives every server that hears it a header with its next sequence.
  absl::Status AddPush(const common::PushBatch& batch, const common::PushOptions& options,
                       Exchange* x);
  // Every table of `batch` known and its values sized to it. Errors: NOT_FOUND for an
  // unknown table, INVALID_ARGUMENT for a wrong kind or size.
  absl::Status CheckPush(const common::PushBatch& batch) const;
  // One checked table's gradients into the frames of the servers that hold its blocks/rows.
  void AddDensePush(const common::DensePush& p, Exchange* x)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(residuals_mu_);
  void AddSparsePush(const common::SparsePush& p, std::vector<std::vector<uint32_t>>* positions,
                     Exchange* x) ABSL_EXCLUSIVE_LOCKS_REQUIRED(residuals_mu_);
  absl::Status AddPull(const common::PullBatch& batch, const common::PullOptions& options,
                       Exchange* x);
  // Splits each server's pull into pieces when GrpcStoreOptions::pull_piece_bytes says so:
  // frames after the first x->servers hold the extra pieces. REQUIRES: x has no push.
  void SplitPullPieces(Exchange* x) const;
  // Checks the answer to frame `f` and copies its values into the caller's buffers.
  absl::Status ReadAnswer(uint32_t f, const grpc::ByteBuffer& answer, Exchange* x);
  // Float32 blocks of one answer: bytes at `offset` of its payload go to `dest`.
  struct BlockCopy {
    size_t offset;
    size_t n;
    char* dest;
  };
  // Does `copies` (in payload order, offsets from where `reader` stands), split over threads
  // when they are large (GrpcStoreOptions::parallel_copy_bytes).
  // With non-temporal stores if `stream`.
  void CopyBlocks(const common::FrameReader& reader, absl::Span<const BlockCopy> copies,
                  bool stream) const;
  // Copies from[i] to to[i].dest (a push into shared memory), shared with a helper thread
  // from GrpcStoreOptions::parallel_copy_in_bytes on; with non-temporal stores if `stream`.
  void CopyIn(absl::Span<const absl::string_view> from, absl::Span<const BlockCopy> to,
              bool stream);
  // Shared memory with server s (GrpcStoreOptions::shared_memory_bytes). Frame f's payloads
  // go into a region of the server's segment when there is one with room: the frame then
  // carries only the header (and where they lie). The first frame to a server asks for a
  // segment instead (want_shared_bytes); ReadAnswer maps the offer.
  void PlaceShared(uint32_t f, Exchange* x);
  // The copy PlaceShared left for after the call was posted (a following payload), if any:
  // done now, its count raised as it goes. Called before a frame is sent, by either way.
  void CopyFollowing(uint32_t f, Exchange* x);
  // Where `payloads` lie in `arena`'s segment when they are one run of bytes inside the part
  // regions come from (a LentBuffer's), else nullopt.
  static std::optional<uint64_t> LentOffset(absl::Span<const absl::string_view> payloads,
                                            const common::SharedArena& arena);
  // The frame to send for f: its header and, unless they lie in shared memory, its payloads.
  grpc::ByteBuffer BuildFrame(uint32_t f, const Exchange& x) const;
  // Frame f's attempt ended with `status`, not OK, after it asked for or used shared memory:
  // a frame using a segment goes back to the socket, and the segment is given up (the server
  // may still write an abandoned attempt's answer into its region), so the next call asks
  // for a new one. A frame that asked asks no more in its next attempts (each ask makes the
  // server replace the worker's segment, the one a later ask got too).
  void OnSharedFailure(uint32_t f, Exchange* x);
  // A region of `bytes` in `arena` while it is still server's link's: nullopt once the link
  // was given up (or replaced), or when none is free. ABSL_LOCKS_EXCLUDED(shared_mu_).
  std::optional<common::SharedArena::Region> AllocateInLink(
      uint32_t server, const std::shared_ptr<common::SharedArena>& arena, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(shared_mu_);
  // The answer to frame f, which asked for a segment: maps the segment it offers (with its
  // channel) and makes the link active, or off when there is none it can use; only while f's
  // ask is the one in flight.
  void TakeOffer(uint32_t f, const PushPullResponse& header, Exchange* x)
      ABSL_LOCKS_EXCLUDED(shared_mu_);
  // The channel frame f may be sent through: the one of the segment its payloads lie in,
  // while that is the server's current segment; nullptr: by the socket.
  std::shared_ptr<common::SharedChannel> ChannelFor(uint32_t f, const Exchange& x)
      ABSL_LOCKS_EXCLUDED(shared_mu_);
  // Pull answer bytes frame f asks for (float32 or encoded, as the server will send them).
  uint64_t AnswerBytes(const PushPullRequest& h) const;
  // Encode buffers reused across calls (16-bit payloads, sparse rows).
  std::string TakeBuffer();
  void GiveBuffer(std::string buffer);

  const JobConfig config_;
  const GrpcStoreOptions options_;
  const common::Partitioner partitioner_;
  // One per server, for every call: PushPull frames, and the control calls, whose answers the
  // store parses itself within a bound (common::ParseWithin).
  std::vector<std::unique_ptr<grpc::GenericStub>> data_stubs_;
  // Under a consistency bound (or deterministic BSP) every server hears of every push.
  const bool push_to_all_;
  // Next push sequence per server.
  std::unique_ptr<std::atomic<uint64_t>[]> next_sequence_;
  // The steps this worker knows it has completed (RequestHeader.done_clock, in every header):
  // the clock of its newest push that every server it went to applied, or the clock the
  // servers remembered for it before its first push (where a restarted worker resumes).
  std::atomic<int64_t> done_clock_{0};
  std::atomic<bool> pushed_{false};  // a push was built: Heartbeat no longer moves done_clock_
  void NoteDoneClock(int64_t clock);
  absl::Mutex queues_mu_;
  // Idle completion queues (one per thread that has called concurrently, at most).
  std::vector<std::unique_ptr<grpc::CompletionQueue>> spare_queues_ ABSL_GUARDED_BY(queues_mu_);
  // Idle AsyncCalls of blocking calls (nothing pending), as many as threads called at once.
  std::vector<std::unique_ptr<AsyncCalls>> spare_calls_ ABSL_GUARDED_BY(queues_mu_);
  absl::Mutex buffers_mu_;
  std::vector<std::string> spare_buffers_ ABSL_GUARDED_BY(buffers_mu_);
  // Shared memory per server.
  struct SharedLink {
    enum State { kNone, kAsked, kActive, kOff } state = kNone;
    // When kOff: when to ask again (InfiniteFuture: never), and the wait that led there.
    absl::Time reask_at = absl::InfiniteFuture();
    absl::Duration reask_after = absl::ZeroDuration();
    // When kAsked: the token of the ask in flight (from ask_tokens_). Only its frame's answer
    // or failure moves the link on: an older asking frame failing late, or answered after a
    // later ask made the server replace its segment, must not.
    uint64_t ask = 0;
    // The id of a segment offered that this process cannot open, to be told to the server
    // (PushPullRequest.declined_shared_id) in the next frame to it; 0 = none.
    uint64_t declined = 0;
    std::shared_ptr<common::SharedArena> arena;  // when kActive
    std::shared_ptr<common::SharedChannel> channel;  // when kActive and the segment has one
    // The server takes payloads after their call on this segment (its offer's push_may_follow
    // or push_may_follow_later).
    bool may_follow = false;
    // Its latest answer through the channel said the next payload may follow (its thread
    // found that call while polling on a core of its own, and this worker is not paused for a
    // late payload); before any, the offer's push_may_follow.
    bool follow_now = true;
    // The revocation flag of the buffers lent in this segment (LendPushBuffer; made by the
    // first lend): set when the link is given up after a failed call, whose attempts a server
    // may still be serving, reading lent memory (LentBuffer::revoked).
    std::shared_ptr<std::atomic<bool>> lent_revoked;
  };
  absl::Mutex shared_mu_;
  std::vector<SharedLink> shared_ ABSL_GUARDED_BY(shared_mu_);
  uint64_t ask_tokens_ ABSL_GUARDED_BY(shared_mu_) = 0;
  // Per server, two: plain or streamed stores for the calls through its shared memory that
  // hand mostly push payload ([2s]) and mostly answer ([2s + 1]), whose costs per byte differ
  // (GrpcStoreOptions::handoff). Kept across segments: they measure where the two processes
  // run, not the segment.
  std::vector<std::unique_ptr<common::HandoffChooser>> handoff_;
  // CopyIn's helper, started by the first large copy.
  absl::once_flag copy_helper_once_;
  std::unique_ptr<common::ThreadPool> copy_helper_;
  // CopyBlocks' helpers (GrpcStoreOptions::parallel_copy_bytes), started by the first copy
  // they take.
  mutable absl::once_flag copy_out_once_;
  mutable std::unique_ptr<common::ThreadPool> copy_out_;
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> retries_{0};
  std::atomic<uint64_t> duplicates_{0};
  std::atomic<uint64_t> bytes_shared_{0};
  std::atomic<uint64_t> bytes_lent_{0};
  std::atomic<uint64_t> calls_shared_{0};
  std::atomic<uint64_t> handoffs_[2] = {0, 0};  // [plain, streamed]
  std::atomic<uint64_t> handoffs_served_cpu_{0};
  std::atomic<uint64_t> following_[2] = {0, 0};  // [whole, following]
  // Held while a Push encodes (not while it sends).
  absl::Mutex residuals_mu_;
  PushResiduals residuals_ ABSL_GUARDED_BY(residuals_mu_);
  std::unique_ptr<common::metrics::Registry> own_registry_;  // when none was given
  std::unique_ptr<Metrics> metrics_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_RPC_GRPC_STORE_H_
