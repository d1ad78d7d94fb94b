// ParameterServerService's fused call: PushPull, the frames of a push and its pull in one
// round trip, by the socket or through a worker's shared-memory channel (the other data-path
// methods are in service.cc).
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/following_payload.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/shared_channel.h"
#include "common/rpc/shared_memory.h"
#include "common/status_macros.h"
#include "common/thread_cpu.h"
#include "glog/logging.h"
#include "grpcpp/generic/async_generic_service.h"
#include "server/rpc/service.h"
#include "server/rpc/service_internal.h"

namespace ps::server {

// ---- PushPull (frames) ------------------------------------------------------------------

namespace {
// Frame headers are small (sparse keys are the bulk); the message size limit caps them too.
constexpr size_t kMaxFrameHeaderBytes = size_t{256} << 20;

// A frame without a push is a pull, even of no table (it still checks the worker and waits
// for the bound, as Pull does).
bool Pulls(const PushPullRequest& header) { return header.pull_size() > 0 || !header.has_push(); }

// A fused call refused after its push was applied (its pull was refused as it parked, waited
// in vain, or was refused as it was read) says so, its code and reason unchanged: sent again,
// the push is a duplicate and applies nothing.
absl::Status WithPushApplied(const absl::Status& status) {
  absl::Status out(status.code(), absl::StrCat(status.message(),
                                               " (the call's push was applied before its pull "
                                               "was refused: sent again, it is a duplicate)"));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}
}  // namespace

absl::Status ParameterServerService::Unparseable(absl::Status status) {
  {
    absl::MutexLock lock(&log_mu_);
    const absl::Time now = absl::Now();
    if (now - last_unparseable_log_ >= absl::Seconds(10)) {
      LOG(WARNING) << "refused an unparseable request (" << status.message() << ")"
                   << (unlogged_unparseable_ > 0 ? absl::StrCat("; ", unlogged_unparseable_,
                                                                " more since the last report")
                                                 : "");
      last_unparseable_log_ = now;
      unlogged_unparseable_ = 0;
    } else {
      ++unlogged_unparseable_;
    }
  }
  return shard_->Reject("unparseable", std::move(status));
}

bool ParameterServerService::PushesWait() const {
  return shard_->config().training().deterministic();
}

absl::Status ParameterServerService::FramePushParts(const PushPullRequest& header,
                                                    common::FrameReader* reader,
                                                    common::BufferPool::Buffer* scratch,
                                                    std::vector<absl::string_view>* pieces,
                                                    std::vector<PushTable>* tables) {
  // The lengths must cut the payload exactly: sum them before taking anything.
  common::PayloadLengths lengths(reader->remaining());
  for (const TableValues& t : header.push()) {
    if (!t.rows().empty()) return absl::InvalidArgumentError("a frame's rows field is not empty");
    for (const DenseBlock& block : t.blocks()) {
      if (!block.values().empty()) {
        return absl::InvalidArgumentError("a frame's block values field is not empty");
      }
      lengths.Add(block.payload_bytes());
    }
    lengths.Add(t.rows_bytes());
  }
  if (!lengths.Exact()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the header's payload lengths do not add up to the ", reader->remaining(),
                     " payload bytes of the frame"));
  }
  // Dense blocks are taken where they lie, as the views of the slices they span (the shard
  // checks and applies them there); sparse rows, read by key, are made contiguous (in place
  // when they lie in one aligned slice, else gathered into the scratch buffer).
  uint64_t rows_bytes = 0;
  for (const TableValues& t : header.push()) rows_bytes += t.rows_bytes();
  if (rows_bytes > 0) *scratch = buffers_->Acquire(rows_bytes);
  pieces->clear();
  tables->resize(header.push_size());
  size_t offset = 0;
  std::vector<std::pair<size_t, size_t>> spans;  // each block's [first, end) in `pieces`
  for (int i = 0; i < header.push_size(); ++i) {
    const TableValues& t = header.push(i);
    PushTable& p = (*tables)[i];
    p = service_internal::TableOf(t);
    for (const DenseBlock& block : t.blocks()) {
      const size_t first = pieces->size();
      reader->Pieces(block.payload_bytes(), pieces);
      spans.emplace_back(first, pieces->size());
      p.blocks.push_back(PushTable::Block{block.block_id(), {}, {}});
    }
    p.rows = reader->Next(t.rows_bytes(), alignof(float), scratch->data.get() + offset);
    offset += t.rows_bytes();
  }
  // Spans into `pieces` only now: it may have grown while it was filled.
  size_t k = 0;
  for (PushTable& p : *tables) {
    for (PushTable::Block& b : p.blocks) {
      const auto [first, end] = spans[k++];
      b.pieces = absl::MakeConstSpan(*pieces).subspan(first, end - first);
    }
  }
  return absl::OkStatus();
}

struct ParameterServerService::PushPullCall {
  PushPullRequest header;
  PushPullResponse answer;
  std::vector<PullTable> pull_views;  // views into `header`
  uint64_t pull_bytes = 0;
  Method method = kPush;  // an unparseable frame counts as a push
  size_t bytes_in = 0;
  std::shared_ptr<common::SharedMemory> shared;  // the worker's segment, if the call names it
  bool push_applied = false;                     // (or found a duplicate of one applied)
  // SharedPayload.time_call: the CPU time spent on it so far (PushPullResponse.served_cpu_ns),
  // from `cpu_start` on the thread serving it now.
  bool timed = false;
  int64_t cpu_ns = 0;
  int64_t cpu_start = 0;
};

absl::Status ParameterServerService::PushPullBegin(const grpc::ByteBuffer& request,
                                                   const PeerIdentity* peer, bool from_channel,
                                                   PushPullCall* call, absl::Time deadline) {
  PushPullRequest& header = call->header;
  common::FrameReader reader;
  Method* method = &call->method;
  if (absl::Status s =
          common::FrameReader::Open(request, kMaxFrameHeaderBytes, &header, &reader, &counters_);
      !s.ok()) {
    return Unparseable(std::move(s));
  }
  call->bytes_in = request.Length();
  if (header.shared().time_call()) {
    call->timed = true;
    call->cpu_start = common::ThreadCpuNanos();
  }
  *method = header.has_push() ? kPush : kPull;
  if (!header.has_push() && (header.push_size() > 0 || reader.remaining() > 0)) {
    return Unparseable(absl::InvalidArgumentError("unparseable frame: a payload without a push"));
  }
  if (from_channel && header.want_shared_bytes() > 0) {
    return Unparseable(absl::InvalidArgumentError(
        "unparseable frame: a call through a shared-memory channel asks for a segment"));
  }
  if (from_channel && header.declined_shared_id() != 0) {
    // Its channel's thread would let go of (join) its own channel: a worker declines only
    // a segment it could not open, which has no channel it could call through.
    return Unparseable(absl::InvalidArgumentError(
        "unparseable frame: a call through a shared-memory channel declines a segment"));
  }
  const RequestInfo info = service_internal::InfoOf(header.header());
  if (peer != nullptr) {
    // Identity from the connection: the frame's worker id must be the caller's own.
    if (absl::Status s =
            auth_.CheckWorker(*peer, info.worker_id, service_internal::kMethodNames[*method]);
        !s.ok()) {
      return shard_->Reject("identity", std::move(s));
    }
    // A channel's frames are its process's: a frame of another incarnation would fence that
    // process off (or end its parked pulls) from the thread serving the channel, which must
    // never let go of a segment's channel (ChannelThreads::Remove waits for that thread). A
    // tool's read (a negative id) keeps no incarnation and passes, as on the socket.
    if (peer->channel_incarnation.has_value() && info.worker_id >= 0 &&
        info.worker_incarnation != *peer->channel_incarnation) {
      // One no path takes (too far ahead of the clock) is refused as on every path.
      if (absl::Status s =
              shard_->workers().CheckIncarnation(info.worker_id, info.worker_incarnation);
          !s.ok()) {
        return shard_->Reject("bad_sequence", std::move(s));
      }
      return shard_->Reject("identity",
                            absl::PermissionDeniedError(absl::StrCat(
                                peer->name, ": a frame of incarnation ", info.worker_incarnation,
                                " through the channel of incarnation ", *peer->channel_incarnation,
                                "; a process calls through its own segment's channel only")));
    }
  }
  // The pull is checked before the push is applied (and before a segment is offered, which
  // replaces the worker's): a bad pull changes nothing either. Its clocks are checked again
  // before it waits (clocks only rise, so that passes too); a plain pull does nothing before.
  call->pull_views = service_internal::PullViews(header.pull());
  ASSIGN_OR_RETURN(call->pull_bytes, shard_->CheckPull(info, call->pull_views));
  if (Pulls(header) && (header.has_push() || header.want_shared_bytes() > 0)) {
    RequestInfo pull_info = info;
    pull_info.clock = header.pull_clock();
    RETURN_IF_ERROR(shard_->CheckPullClocks(pull_info));
  }
  if (header.has_shared()) {
    ASSIGN_OR_RETURN(call->shared, SharedSegmentOf(header, reader));
    const uint64_t n = header.shared().push_bytes();
    if (n > 0) {
      // Used where it lies. The worker can still write its segment, so the shard reads each
      // value of it once after the check (PushTable::payload_may_change).
      counters_.bytes_shared_in.fetch_add(n, std::memory_order_relaxed);
      reader.Append(absl::string_view(call->shared->data() + header.shared().push_offset(), n));
      call->bytes_in += n;
    }
  }
  // A frame's answer does not echo the keys, but has a header per table and block.
  const uint64_t room = call->shared != nullptr ? header.shared().answer_capacity() : 0;
  RETURN_IF_ERROR(CheckAnswerSize(call->pull_bytes,
                                  AnswerHeaderBytes(header.pull(), /*echo_keys=*/false), room));
  if (from_channel && call->pull_bytes > room &&
      call->pull_bytes > common::SharedChannel::kAnswerBytes) {
    // Its values would go into the channel's slot, which cannot hold them: refused before the
    // push, not after the read (found in review, 2026-12-05: the push was applied, up to
    // max_answer_bytes read on the channel's thread, and the answer dropped). Workers send
    // such calls by the socket.
    return shard_->Reject(
        "answer_too_large",
        absl::ResourceExhaustedError(absl::StrCat(
            "a call through a shared-memory channel whose pull's ", call->pull_bytes,
            " bytes fit neither its segment's room of ", room, " bytes nor the channel's ",
            common::SharedChannel::kAnswerBytes, ": send it by the socket")));
  }
  if (header.has_push()) {
    common::BufferPool::Buffer scratch;
    std::vector<absl::string_view> pieces;
    std::vector<PushTable> tables;
    // A payload the worker writes after posting the call: the shard waits for its bytes as it
    // checks them, no longer than MaxWait (a count that never comes holds this thread no
    // longer), and never past the call's deadline. By the socket a worker sends a call only
    // once its copy is done: no wait at all there.
    std::optional<common::FollowingPayload> following;
    absl::Status status;
    if (call->shared != nullptr && header.shared().push_follows()) {
      const SharedPayload& sp = header.shared();
      if (LateFollower(info.worker_id)) {
        return shard_->Reject(
            "late_follower",
            // ABORTED, as for a segment the server no longer takes: nothing changed, and the
            // worker sends the call again at once by the socket, then asks for a new segment
            // (offered without push_may_follow while the pause lasts).
            absl::AbortedError(absl::StrCat(
                "worker ", info.worker_id,
                "'s payload written after its call came late before: send payloads whole "
                "until the answers say it may follow again")));
      }
      following.emplace(
          common::FollowingWord(call->shared->data() + sp.push_offset() -
                                common::kFollowingWordBytes),
          call->shared->data() + sp.push_offset(), sp.push_bytes(),
          from_channel
              ? std::min(deadline, absl::Now() + common::FollowingPayload::MaxWait(sp.push_bytes()))
              : absl::InfinitePast());
      // Sparse rows may be gathered as the frame is cut: all of it first.
      bool rows = false;
      for (const TableValues& t : header.push()) rows = rows || t.rows_bytes() > 0;
      if (rows) status = shard_->AwaitPayload(&*following);
    }
    if (status.ok()) {
      status = FramePushParts(header, &reader, &scratch, &pieces, &tables);
      if (!status.ok()) {
        status = Unparseable(
            absl::InvalidArgumentError(absl::StrCat("unparseable frame: ", status.message())));
      } else {
        for (PushTable& t : tables) t.payload_may_change = call->shared != nullptr;
        status = PushImpl(header.header(), header.is_delta(), tables, call->answer.mutable_push(),
                          deadline, following.has_value() ? &*following : nullptr);
      }
    }
    buffers_->Release(std::move(scratch));
    if (following.has_value()) {
      // Waiting for the worker's copy is not what serving the call cost (CPU while polling).
      call->cpu_ns -= absl::ToInt64Nanoseconds(following->waited_cpu());
      // A payload that did not come in time, came only after late_following of waiting, or
      // whose wait took its worker's debt of waits beyond honest copies over late_following,
      // pauses its worker: it sends its payloads whole for a while (late_following_pause). So
      // a worker that raises its count just in time, or just under late_following, again and
      // again, holds a channel thread that long at most once per pause (found in review,
      // 2026-12-06: one that waited 9 ms each time was never paused).
      if ((!status.ok() && RejectionReason(status) == "payload_late") ||
          following->waited() > options_.late_following ||
          OwesTooMuchWaiting(info.worker_id, following->waited(), header.shared().push_bytes())) {
        MarkLateFollower(info.worker_id);
      }
      if (status.ok()) {
        counters_.bytes_following.fetch_add(header.shared().push_bytes(),
                                            std::memory_order_relaxed);
      }
    }
    RETURN_IF_ERROR(status);
    call->push_applied = true;
  }
  if (header.declined_shared_id() != 0) {
    DropSegment(info, header.declined_shared_id(),
                "declined: the worker cannot open it here (another container?); its payloads go "
                "by the socket");
  }
  if (header.want_shared_bytes() > 0 &&
      (header.want_shared_boot_id().empty() ||
       header.want_shared_boot_id() == common::SharedMemory::BootId())) {
    SharedSegment offer;
    if (OfferSharedSegment(info, header.want_shared_bytes(), peer, &offer)) {
      *call->answer.mutable_shared_offer() = std::move(offer);
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterServerService::PushPullAnswer(PushPullCall* call,
                                                    grpc::ByteBuffer* response) {
  if (call->timed) call->cpu_start = common::ThreadCpuNanos();
  common::BufferPool::Buffer out;
  // The answer goes straight into the worker's segment when it has room there.
  const SharedPayload& sp = call->header.shared();
  char* shared_out =
      call->shared != nullptr && call->pull_bytes > 0 && call->pull_bytes <= sp.answer_capacity()
          ? call->shared->data() + sp.answer_offset()
          : nullptr;
  if (Pulls(call->header)) {
    char* dest = shared_out;
    if (dest == nullptr) {
      out = buffers_->Acquire(call->pull_bytes);
      dest = out.data.get();
    }
    if (absl::Status s =
            ReadPull(call->header.pull(), call->pull_views, call->answer.mutable_pull(), dest,
                     /*stream=*/dest == shared_out && sp.stream_answer());
        !s.ok()) {
      if (out.data != nullptr) buffers_->Release(std::move(out));
      return s;
    }
  }
  if (call->shared != nullptr && ChannelCallPolled() &&
      !LateFollower(call->header.header().worker_id())) {
    call->answer.set_push_may_follow(true);
  }
  if (call->timed) {
    call->cpu_ns += common::ThreadCpuNanos() - call->cpu_start;
    // At least 1: 0 says "not measured".
    call->answer.set_served_cpu_ns(static_cast<uint64_t>(std::max<int64_t>(call->cpu_ns, 1)));
  }
  if (shared_out != nullptr) {
    call->answer.set_shared_answer_bytes(call->pull_bytes);
    counters_.bytes_shared_out.fetch_add(call->pull_bytes, std::memory_order_relaxed);
  }
  common::FrameBuilder frame(call->answer);
  if (call->pull_bytes > 0 && shared_out == nullptr) {
    frame.AddSlice(buffers_->MakeSlice(std::move(out), call->pull_bytes));
  } else if (out.data != nullptr) {
    // A pull of nothing (Acquire(0) hands any idle buffer out): back to the pool, not freed
    // (found in review, 2026-12-06: each such call took a reused buffer out for good).
    buffers_->Release(std::move(out));
  }
  *response = frame.Build();
  return absl::OkStatus();
}

ParameterServerService::WaiterId ParameterServerService::StartPushPull(
    grpc::ByteBuffer* request, absl::Time deadline, grpc::ByteBuffer* response, absl::Time arrived,
    const PeerIdentity* peer, Done done, bool from_channel,
    std::optional<absl::string_view> answer_peer) {
  auto call = std::make_shared<PushPullCall>();
  auto finish = [this, call, response, arrived, done = std::move(done)](absl::Status status) {
    if (!status.ok() && call->push_applied) status = WithPushApplied(status);
    // A segment offered to a call whose pull is then refused: the worker never hears of it
    // (it asks again on its next call), so the server does not keep it (charged, one of the
    // worker's two) until then, or for good if the worker is gone. Letting go of it waits
    // for its channel thread's next pass (ChannelThreads::Remove), so it runs on the pool:
    // the thread finishing the call may be the tracker's timer thread, which must not block,
    // or a channel thread, which would wait for its own pass (found in review, 2026-12-06;
    // channel frames cannot claim the newer incarnation that refuses a parked pull there
    // either: PushPullBegin). A later ask's segment stays (DropSegment).
    if (!status.ok() && call->answer.has_shared_offer()) {
      pool_.Schedule([this, info = service_internal::InfoOf(call->header.header()),
                      id = call->answer.shared_offer().id()] {
        DropSegment(info, id, "offered in an answer that was refused");
      });
    }
    Record(call->method, arrived, status, call->bytes_in,
           status.ok() ? response->Length() + call->answer.shared_answer_bytes() : 0);
    done(std::move(status));
  };
  auto answer = [this, call, response] { return PushPullAnswer(call.get(), response); };
  absl::Status begun = PushPullBegin(*request, peer, from_channel, call.get(), deadline);
  if (call->timed) call->cpu_ns += common::ThreadCpuNanos() - call->cpu_start;
  if (!begun.ok()) {
    finish(std::move(begun));
    return 0;
  }
  if (!Pulls(call->header)) {
    finish(answer());
    return 0;
  }
  RequestInfo pull_info = service_internal::InfoOf(call->header.header());
  pull_info.clock = call->header.pull_clock();
  // While it waits the call keeps its header (which holds the pull), not the push's payload:
  // applied already, it is let go here.
  request->Clear();
  return AfterBound(pull_info, deadline, std::move(answer), std::move(finish), answer_peer,
                    /*held_bytes=*/service_internal::ParkedBytes(call->header));
}

absl::Status ParameterServerService::HandlePushPull(const grpc::ByteBuffer& request,
                                                    absl::Time deadline,
                                                    grpc::ByteBuffer* response) {
  absl::Notification answered;
  absl::Status result;
  grpc::ByteBuffer copy = request;  // slices shared, not copied
  StartPushPull(&copy, deadline, response, absl::Now(), nullptr, [&](absl::Status status) {
    result = std::move(status);
    answered.Notify();
  });
  answered.WaitForNotification();
  return result;
}

}  // namespace ps::server
