// GrpcParameterStore's shared memory with the servers of its host: the segment asked for
// and taken up, a frame's payload placed in it (or found there, lent), what a failure gives
// up, and the memory lent for pushes (docs/design.md, "Shared memory between processes of
// one host").
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/following_payload.h"
#include "common/rpc/shared_channel.h"
#include "common/rpc/shared_memory.h"
#include "common/startup/cores.h"
#include "common/stream_copy.h"
#include "common/thread_cpu.h"
#include "glog/logging.h"
#include "worker/rpc/grpc_store.h"
#include "worker/rpc/grpc_store_exchange.h"

namespace ps::worker {

namespace {

// A LentBuffer in a region of a server's segment (kept, and the segment mapped, while it lives).
class SegmentBuffer final : public common::LentBuffer {
 public:
  SegmentBuffer(common::SharedArena::Region region, size_t floats, std::vector<size_t> starts,
                std::shared_ptr<const std::atomic<bool>> revoked)
      : LentBuffer(absl::MakeSpan(reinterpret_cast<float*>(region.data()), floats),
                   std::move(starts), std::move(revoked)),
        region_(std::move(region)) {}

 private:
  common::SharedArena::Region region_;
};

}  // namespace

std::unique_ptr<common::LentBuffer> GrpcParameterStore::LendPushBuffer(
    absl::Span<const std::string> tables) {
  if (tables.empty() || options_.shared_memory_bytes == 0 || !options_.lend_push_buffers) {
    return nullptr;
  }
  std::vector<size_t> starts = {0};
  std::optional<uint32_t> server;
  for (const std::string& name : tables) {
    const common::TableInfo* t = partitioner_.FindTable(name);
    if (t == nullptr || t->kind != TABLE_KIND_DENSE ||
        t->config->wire_encoding() != ENCODING_FLOAT32) {
      return nullptr;
    }
    for (uint32_t b = 0; b < t->num_blocks; ++b) {
      const uint32_t s = partitioner_.ServerForBlock(*t, b);
      if (server.has_value() && *server != s) return nullptr;
      server = s;
    }
    starts.push_back(starts.back() + t->numel);
  }
  if (!server.has_value()) return nullptr;
  std::shared_ptr<common::SharedArena> arena;
  std::shared_ptr<std::atomic<bool>> revoked;
  {
    absl::MutexLock lock(&shared_mu_);
    SharedLink& link = shared_[*server];
    if (link.state != SharedLink::kActive) return nullptr;
    arena = link.arena;
    if (link.lent_revoked == nullptr)
      link.lent_revoked = std::make_shared<std::atomic<bool>>(false);
    revoked = link.lent_revoked;
  }
  const uint64_t bytes = starts.back() * sizeof(float);
  // At most half the segment lent: calls need room for their answers (and copied payloads).
  const uint64_t free = arena->free_bytes();
  if (bytes == 0 || free < arena->capacity() / 2 || bytes > free - arena->capacity() / 2) {
    return nullptr;
  }
  std::optional<common::SharedArena::Region> region = AllocateInLink(*server, arena, bytes);
  if (!region.has_value()) return nullptr;
  std::memset(region->data(), 0, static_cast<size_t>(bytes));
  const size_t floats = starts.back();
  return std::make_unique<SegmentBuffer>(*std::move(region), floats, std::move(starts),
                                         std::move(revoked));
}

std::optional<common::SharedArena::Region> GrpcParameterStore::AllocateInLink(
    uint32_t server, const std::shared_ptr<common::SharedArena>& arena, uint64_t bytes) {
  // Under the lock that gives a link up: a region freed by a given-up call (OnSharedFailure),
  // whose late answer may still land in it, goes back to an arena no link holds any more.
  absl::MutexLock lock(&shared_mu_);
  const SharedLink& link = shared_[server];
  if (link.state != SharedLink::kActive || link.arena != arena) return std::nullopt;
  return common::SharedArena::Allocate(arena, static_cast<size_t>(bytes));
}

std::optional<uint64_t> GrpcParameterStore::LentOffset(absl::Span<const absl::string_view> payloads,
                                                       const common::SharedArena& arena) {
  if (payloads.empty()) return std::nullopt;
  const char* const begin = payloads.front().data();
  const char* end = begin;
  for (absl::string_view bytes : payloads) {
    if (bytes.data() != end) return std::nullopt;  // not one after the other
    end += bytes.size();
  }
  // Compared as addresses: a payload of another allocation is not in the segment.
  const auto first = reinterpret_cast<uintptr_t>(arena.memory()->data());
  const auto at = reinterpret_cast<uintptr_t>(begin);
  if (end == begin || at < first || at >= first + arena.memory()->size()) return std::nullopt;
  const uint64_t offset = at - first;
  if (!arena.Holds(offset, static_cast<uint64_t>(end - begin))) return std::nullopt;
  return offset;
}

void GrpcParameterStore::PlaceShared(uint32_t f, Exchange* x) {
  if (options_.shared_memory_bytes == 0) return;
  const uint32_t s = x->ServerOf(f);
  PushPullRequest& h = x->headers[f];
  const int64_t start_ns = absl::GetCurrentTimeNanos();
  uint64_t push = 0;
  for (absl::string_view bytes : x->payloads[f]) push += bytes.size();
  const uint64_t answer = AnswerBytes(h);
  std::shared_ptr<common::SharedArena> arena;
  std::optional<uint64_t> lent;
  std::optional<common::SharedArena::Region> region;
  bool may_follow = false;
  bool follows = false;
  {
    absl::MutexLock lock(&shared_mu_);
    SharedLink& link = shared_[s];
    if (link.declined != 0) {
      // Told once, in the next frame: the server lets the segment go (and its charge).
      h.set_declined_shared_id(link.declined);
      link.declined = 0;
    }
    if (link.state == SharedLink::kNone ||
        (link.state == SharedLink::kOff && absl::Now() >= link.reask_at)) {
      link.state = SharedLink::kAsked;
      link.ask = ++ask_tokens_;
      h.set_want_shared_bytes(options_.shared_memory_bytes);
      h.set_want_shared_boot_id(common::SharedMemory::BootId());
      x->asked[f] = link.ask;
      return;
    }
    if (link.state != SharedLink::kActive) return;
    arena = link.arena;
    may_follow = link.may_follow && link.channel != nullptr;
    // Allocated under the lock that gives a link up (as AllocateInLink): a region freed by a
    // given-up call goes back to an arena no link holds any more. A lent payload (already in
    // the segment: the server reads it there) needs the answer's room only, at least a line
    // (a valid region is what marks a frame as shared); the answer's room after a copied push
    // starts aligned.
    lent = LentOffset(x->payloads[f], *arena);
    // A payload that follows its call: dense, copied by this thread alone (not streamed for its
    // size either), between the sizes where it pays and where the server takes it.
    follows = may_follow && options_.overlap_push_copy && !lent.has_value() &&
              push >= common::kMinFollowingBytes && push <= common::kMaxFollowingBytes &&
              x->sent <= options_.stream_copy_in_bytes &&
              (options_.parallel_copy_in_bytes == 0 || push < options_.parallel_copy_in_bytes);
    for (const TableValues& t : h.push()) follows = follows && t.rows_bytes() == 0;
    if (follows) {
      x->following[f].could = true;
      follows = x->following[f].follows = link.follow_now;
    }
    if (!lent.has_value()) push = (push + 63) / 64 * 64;
    const uint64_t word = follows ? common::kFollowingWordBytes : 0;  // the count's line
    const uint64_t bytes = lent.has_value() ? std::max<uint64_t>(answer, 64) : word + push + answer;
    if (bytes > 0) region = common::SharedArena::Allocate(arena, static_cast<size_t>(bytes));
  }
  if (!region.has_value()) return;  // no room now (or nothing to place): by the socket
  if (lent.has_value()) {
    SharedPayload* sp = h.mutable_shared();
    sp->set_stream_answer(false);
    sp->set_segment(arena->memory()->id());
    sp->set_push_offset(*lent);
    sp->set_push_bytes(push);
    sp->set_answer_offset(region->offset());
    sp->set_answer_capacity(answer);
    x->handoff[f].lent = true;
    x->shared[f] = *std::move(region);
    return;
  }
  // The one copy of a push: from the caller's gradient (or its encoding) into the segment.
  std::atomic<uint64_t>* written = nullptr;
  if (follows) {
    written = common::FollowingWord(region->data());
    written->store(0, std::memory_order_relaxed);  // (published by the post)
  }
  const uint64_t payload_at = region->offset() + (follows ? common::kFollowingWordBytes : 0);
  char* const payload = region->data() + (follows ? common::kFollowingWordBytes : 0);
  char* at = payload;
  std::vector<BlockCopy> copies;
  for (absl::string_view bytes : x->payloads[f]) {
    copies.push_back(BlockCopy{0, bytes.size(), at});
    at += bytes.size();
  }
  // Streamed when the whole push, all servers' parts, is larger than the cache: the parts are
  // copied one after the other, each evicting the last. Below, streamed or not as the link's
  // chooser says, and the answer written the same way.
  bool stream = x->sent > options_.stream_copy_in_bytes;
  Exchange::Handoff& handoff = x->handoff[f];
  if (!stream && push + answer > common::kHandoffStreamBytes) {
    const uint32_t chooser = 2 * s + (answer > push ? 1 : 0);
    bool weigh = false;
    switch (options_.handoff) {
      case RpcConfig::HANDOFF_PLAIN:
        break;
      case RpcConfig::HANDOFF_STREAMED:
        stream = true;
        break;
      default:
        stream = handoff_[chooser]->Stream(&weigh);
    }
    handoff = Exchange::Handoff{true, stream, chooser, push + answer, start_ns};
    // Weighed calls only (one in HandoffChooser::Options::weigh_every of the way in use):
    // each reads this thread's and the server's CPU time, system calls.
    handoff.costed = options_.handoff == RpcConfig::HANDOFF_ADAPTIVE && weigh;
  }
  if (follows) {
    x->following[f].pending = true;
    x->following[f].stream = stream;
    x->following[f].to = payload;
    x->following[f].written = written;
  } else {
    const int64_t cpu = handoff.costed ? common::ThreadCpuNanos() : 0;
    CopyIn(x->payloads[f], copies, stream);
    if (handoff.costed) handoff.copy_cpu_ns += common::ThreadCpuNanos() - cpu;
  }
  SharedPayload* sp = h.mutable_shared();
  sp->set_stream_answer(handoff.timed && stream);  // (timed: a handoff of more than 32 KB)
  sp->set_time_call(handoff.costed);
  sp->set_segment(arena->memory()->id());
  sp->set_push_offset(payload_at);
  sp->set_push_bytes(static_cast<uint64_t>(at - payload));
  sp->set_push_follows(follows);
  sp->set_answer_offset(payload_at + push);
  sp->set_answer_capacity(answer);
  x->shared[f] = *std::move(region);
}

std::shared_ptr<common::SharedChannel> GrpcParameterStore::ChannelFor(uint32_t f,
                                                                      const Exchange& x) {
  if (!x.shared[f].valid()) return nullptr;
  absl::MutexLock lock(&shared_mu_);
  const SharedLink& link = shared_[x.ServerOf(f)];
  if (link.state != SharedLink::kActive || link.channel == nullptr ||
      link.arena->memory() != x.shared[f].memory()) {
    return nullptr;
  }
  return link.channel;
}

void GrpcParameterStore::OnSharedFailure(uint32_t f, Exchange* x) {
  const uint32_t s = x->ServerOf(f);
  // What is given up here is destroyed after the lock is let go (declared before it): when it
  // holds the last reference to the segment, its destruction unmaps it (hundreds of MB) and
  // closes its descriptors, which under shared_mu_ would stall every other thread's
  // PlaceShared, ChannelFor, AllocateInLink and ReadAnswer meanwhile. The region is freed to
  // an arena no link holds by then, so nothing allocates it again either way.
  SharedLink given_up;
  common::SharedArena::Region region;
  absl::MutexLock lock(&shared_mu_);
  SharedLink& link = shared_[s];
  if (x->shared[f].valid()) {
    if (link.state == SharedLink::kActive && link.arena->memory() == x->shared[f].memory()) {
      // The channel goes too: a call given up may still hold one of its slots. So do the
      // buffers lent in the segment: a server may still be serving an attempt given up here,
      // reading one of them, after its push returns (sent again by the socket).
      if (link.lent_revoked != nullptr) link.lent_revoked->store(true, std::memory_order_release);
      given_up = std::exchange(link, SharedLink());
    }
    // The region is not reused: an abandoned attempt's answer may still land in it. It goes
    // with the old segment, which no new call uses.
    x->headers[f].clear_shared();
    region = std::exchange(x->shared[f], common::SharedArena::Region());
    x->handoff[f].timed = false;  // retried by the socket: not a measure of either way
    x->handoff[f].lent = false;   // (a lent payload then goes in the frame)
  }
  if (x->asked[f] != 0) {
    if (link.state == SharedLink::kAsked && link.ask == x->asked[f]) {
      link.state = SharedLink::kNone;
    }
    // Its next attempt does not ask again (the next call does).
    x->headers[f].clear_want_shared_bytes();
    x->asked[f] = 0;
  }
}

void GrpcParameterStore::TakeOffer(uint32_t f, const PushPullResponse& header, Exchange* x) {
  const uint32_t s = x->ServerOf(f);
  std::shared_ptr<common::SharedArena> arena;
  std::shared_ptr<common::SharedChannel> channel;
  bool unusable = false;  // offered, but not to be opened here: never asked again
  bool exhausted = false;  // offered, but this process is out of descriptors or memory now
  uint64_t declined = 0;   // either way the server is told so
  if (header.has_shared_offer()) {
    const SharedSegment& offer = header.shared_offer();
    // Never more than was asked: a server's lie would have this process map any size.
    absl::StatusOr<std::shared_ptr<common::SharedMemory>> opened =
        offer.bytes() > options_.shared_memory_bytes
            ? absl::InvalidArgumentError(absl::StrCat("it offered ", offer.bytes(),
                                                      " bytes, more than the ",
                                                      options_.shared_memory_bytes, " asked"))
            : common::SharedMemory::Open(offer.id(), offer.path(), offer.bytes(), offer.boot_id());
    if (opened.ok()) {
      const uint64_t at = offer.channel_offset();
      if (at != 0 && common::SharedChannel::Fits(at, (*opened)->size())) {
        if (options_.shared_memory_calls) {
          channel = std::make_shared<common::SharedChannel>(*opened, at);
          if (std::optional<int> pid = common::SharedChannel::PidOfPath(offer.path())) {
            channel->WatchServer(*pid);
          }
        }
        arena = std::make_shared<common::SharedArena>(*std::move(opened), at);
      } else {
        arena = std::make_shared<common::SharedArena>(*std::move(opened));
      }
    } else if (opened.status().code() == absl::StatusCode::kResourceExhausted) {
      // Out of descriptors or memory for now: asked again later, as after a declined ask
      // (before, this was taken for a segment that can never be opened here, and the worker
      // stayed on the socket for the rest of the job after one passing EMFILE).
      exhausted = true;
      declined = offer.id();
      LOG(WARNING) << "server " << s << ": its shared memory cannot be mapped now ("
                   << opened.status() << "); payloads go by the socket until it is asked again";
    } else {
      unusable = true;
      declined = offer.id();
      LOG(INFO) << "server " << s << ": its shared memory is not usable here (" << opened.status()
                << "); payloads go by the socket";
    }
  }
  absl::MutexLock lock(&shared_mu_);
  SharedLink& link = shared_[s];
  if (link.state == SharedLink::kAsked && link.ask == x->asked[f]) {
    link.state = arena != nullptr ? SharedLink::kActive : SharedLink::kOff;
    link.arena = std::move(arena);
    link.channel = std::move(channel);
    // A server that pauses this worker for a late payload offers push_may_follow_later: the
    // answers through the segment then say when its payloads may follow again.
    const SharedSegment& offer = header.shared_offer();
    link.may_follow = offer.push_may_follow() || offer.push_may_follow_later();
    link.follow_now = offer.push_may_follow();
    if (link.state == SharedLink::kActive) {
      link.reask_after = absl::ZeroDuration();
    } else if (unusable) {
      link.reask_at = absl::InfiniteFuture();
      link.declined = declined;
    } else {
      // Declined, or not mapped for want of descriptors or memory: the server's budget, or
      // this process, may have room later (a segment it held is let go).
      if (exhausted) link.declined = declined;
      const absl::Duration first = options_.shared_memory_reask;
      link.reask_after = link.reask_after == absl::ZeroDuration()
                             ? first
                             : std::min(2 * link.reask_after, 64 * first);
      link.reask_at = absl::Now() + link.reask_after;
    }
  }
}

void GrpcParameterStore::CopyFollowing(uint32_t f, Exchange* x) {
  Exchange::Following& following = x->following[f];
  if (!following.pending) return;
  following.pending = false;
  Exchange::Handoff& handoff = x->handoff[f];
  const int64_t cpu = handoff.costed ? common::ThreadCpuNanos() : 0;
  common::CopyFollowing(x->payloads[f], following.to, following.stream, following.written);
  if (handoff.costed) handoff.copy_cpu_ns += common::ThreadCpuNanos() - cpu;
}

void GrpcParameterStore::CopyIn(absl::Span<const absl::string_view> from,
                                absl::Span<const BlockCopy> to, bool stream) {
  size_t bytes = 0;
  for (absl::string_view b : from) bytes += b.size();
  auto copy = [stream](char* dest, const char* source, size_t n) {
    if (stream) {
      common::StreamCopy(dest, source, n);
    } else {
      std::memcpy(dest, source, n);
    }
  };
  static const unsigned cores = common::UsableCores();
  if (options_.parallel_copy_in_bytes == 0 || bytes < options_.parallel_copy_in_bytes ||
      cores < 2) {
    for (size_t i = 0; i < from.size(); ++i) copy(to[i].dest, from[i].data(), from[i].size());
    return;
  }
  // Chunks of at most 1 MB, claimed by this thread and the helper as they go.
  constexpr size_t kChunk = size_t{1} << 20;
  struct Chunk {
    const char* from;
    char* to;
    size_t n;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < from.size(); ++i) {
    for (size_t at = 0; at < from[i].size(); at += kChunk) {
      chunks.push_back(
          Chunk{from[i].data() + at, to[i].dest + at, std::min(kChunk, from[i].size() - at)});
    }
  }
  absl::call_once(copy_helper_once_,
                  [this] { copy_helper_ = std::make_unique<common::ThreadPool>(1); });
  copy_helper_->ParallelFor(chunks.size(), 1, [&chunks, &copy](size_t k) {
    copy(chunks[k].to, chunks[k].from, chunks[k].n);
  });
}

}  // namespace ps::worker
