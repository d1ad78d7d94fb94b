// GrpcParameterStore::AsyncCalls: starting calls, reaping their answers from one completion
// queue, retrying attempts after an alarm.
//
// Queue events. Every event's tag is the Slot (one server's frame of one call) it is for:
// either the end of the slot's attempt, or, while the slot backs off before a retry
// (Slot::backing_off), its alarm. A Slot stays where it is until its call ends, and a call
// ends only when none of its slots has an attempt or an alarm pending, so a tag never
// outlives what it points at.
#include "worker/rpc/grpc_async_calls.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/busy_poll.h"
#include "common/rpc/frame.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/alarm.h"
#include "grpcpp/generic/generic_stub.h"
#include "worker/rpc/grpc_store_exchange.h"

namespace ps::worker {
namespace {

constexpr char kPushPullMethod[] = "/ps.ParameterServer/PushPull";

bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

// As GrpcParameterStore::FanOut: a RESOURCE_EXHAUSTED the server marked busy changed nothing
// and is sent again; any other RESOURCE_EXHAUSTED is final.
bool ServerBusy(const absl::Status& s, const grpc::ClientContext& context) {
  return absl::IsResourceExhausted(s) &&
         context.GetServerTrailingMetadata().count(common::kServerBusyMetadata) > 0;
}

// How often a thread with calls that wait for gRPC to let go of their payloads (draining_)
// looks whether it did, polling the queue (which lets gRPC's I/O move) in between.
constexpr absl::Duration kDrainPoll = absl::Milliseconds(1);

// How often a call waiting in a shared-memory channel looks whether the server process is
// still there (a read of /proc/PID/stat).
constexpr absl::Duration kServerCheckInterval = absl::Milliseconds(50);

// Whether the answer to `h` surely fits a channel slot's answer (its payload goes to the
// segment, so its header is all of it): a bound of the header's encoding, a block's entry at
// most 20 bytes (id and payload length), a table's 32 besides its name. A call whose answer
// did not fit would be served, its push applied, and answered ABORTED ("send it by the
// socket"): a duplicate then, and the segment given up.
bool AnswerFitsAChannelSlot(const PushPullRequest& h) {
  size_t bound = 512;
  for (const TablePullRequest& t : h.pull()) {
    bound += 32 + t.table().size() + 20 * static_cast<size_t>(t.block_ids_size());
  }
  return bound <= common::SharedChannel::kAnswerBytes;
}

}  // namespace

// One server's frame of a call.
struct GrpcParameterStore::AsyncCalls::Slot {
  Call* call = nullptr;
  uint32_t frame = 0;   // index in the Exchange's frames
  uint32_t server = 0;
  uint32_t attempt = 0;        // attempts failed so far
  bool backing_off = false;    // the pending event is the alarm, not an attempt's end
  absl::Time first_failure = absl::InfiniteFuture();
  grpc::ByteBuffer request;    // built once, resent by every retry (same sequence)
  grpc::ByteBuffer answer;
  grpc::Status outcome;
  std::unique_ptr<grpc::ClientContext> context;  // of the current attempt
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  std::unique_ptr<grpc::Alarm> alarm;
  // The current attempt went through this channel's slot (context is then null).
  std::shared_ptr<common::SharedChannel> channel;
  uint32_t channel_slot = 0;
  absl::Time channel_deadline;
  absl::Time channel_check;  // when to look next whether the server process is still there
  bool server_busy = false;  // the channel's answer said so (the socket's trailer)
};

struct GrpcParameterStore::AsyncCalls::Call {
  explicit Call(size_t n) : x(n), sequence(n, 0) {}
  CallId id = 0;
  Exchange x;
  common::PullBatch pull;           // a copy, unless the caller keeps its own alive
  std::vector<uint64_t> sequence;   // push sequence per server, 0 = no push there
  int64_t push_clock = -1;          // the push's clock, -1 = no push
  std::vector<Slot> slots;          // never resized once sent: tags point into it
  size_t unfinished = 0;            // slots with an attempt or an alarm pending
  absl::Status status;              // the first error that ends the call
};

GrpcParameterStore::AsyncCalls::AsyncCalls(GrpcParameterStore* store)
    : store_(store), poller_(store->options_.busy_poll) {}

GrpcParameterStore::AsyncCalls::~AsyncCalls() {
  closing_ = true;
  for (auto& [id, c] : running_) {
    for (Slot& slot : c->slots) {
      if (slot.backing_off && slot.alarm != nullptr) slot.alarm->Cancel();
      if (!slot.backing_off && slot.context != nullptr) slot.context->TryCancel();
    }
  }
  while (!running_.empty() || !draining_.empty()) Step();
  queue_.Shutdown();
  void* tag;
  bool ok;
  while (queue_.Next(&tag, &ok)) {
  }
}

absl::StatusOr<GrpcParameterStore::AsyncCalls::CallId> GrpcParameterStore::AsyncCalls::StartPush(
    const common::PushBatch& batch, const common::PushOptions& options) {
  return Start(&batch, options, nullptr, common::PullOptions(), false);
}

absl::StatusOr<GrpcParameterStore::AsyncCalls::CallId> GrpcParameterStore::AsyncCalls::StartPull(
    const common::PullBatch& batch, const common::PullOptions& options) {
  return Start(nullptr, common::PushOptions(), &batch, options, false);
}

absl::StatusOr<GrpcParameterStore::AsyncCalls::CallId>
GrpcParameterStore::AsyncCalls::StartPushPull(const common::PushBatch& push,
                                              const common::PushOptions& push_options,
                                              const common::PullBatch& pull,
                                              const common::PullOptions& pull_options) {
  return Start(&push, push_options, &pull, pull_options, false);
}

absl::Status GrpcParameterStore::AsyncCalls::Build(const common::PushBatch* push,
                                                   const common::PushOptions& push_options,
                                                   const common::PullBatch* pull,
                                                   const common::PullOptions& pull_options,
                                                   Call* c) {
  Exchange& x = c->x;
  if (pull != nullptr) RETURN_IF_ERROR(store_->AddPull(*pull, pull_options, &x));
  if (push != nullptr) {
    RETURN_IF_ERROR(store_->AddPush(*push, push_options, &x));
    c->push_clock = push_options.clock;
  }
  if (push == nullptr) store_->SplitPullPieces(&x);
  const size_t frames = x.headers.size();  // one per server, then a large pull's extra pieces
  size_t sends = 0;
  for (uint32_t s = 0; s < frames; ++s) {
    PushPullRequest& h = x.headers[s];
    h.set_pull_clock(pull_options.clock);
    if (h.has_push()) {
      c->sequence[s] = h.header().sequence();  // (never an extra piece: they do not push)
    } else {
      *h.mutable_header() = store_->Header(pull_options.clock, 0);
    }
    if (h.has_push() || h.pull_size() > 0) ++sends;
  }
  c->slots.resize(sends);
  x.shared.resize(frames);
  x.asked.assign(frames, 0);
  x.handoff.assign(frames, Exchange::Handoff{});
  x.following.assign(frames, Exchange::Following{});
  // The frames in turn from this worker's own (its id modulo the frames sent): workers that
  // start a call together each hand their first frame to another server (SendAll sends each
  // frame as soon as it is placed). Active frame k goes to slot (k - first) mod sends.
  const size_t first = sends == 0 ? 0 : static_cast<size_t>(store_->options_.worker_id) % sends;
  size_t k = 0;
  for (uint32_t s = 0; s < frames; ++s) {
    if (!x.headers[s].has_push() && x.headers[s].pull_size() == 0) continue;
    Slot& slot = c->slots[(k++ + sends - first) % sends];
    slot.call = c;
    slot.frame = s;
    slot.server = x.ServerOf(s);
  }
  return absl::OkStatus();
}

void GrpcParameterStore::AsyncCalls::SendAll(Call* c) {
  // Each frame goes as soon as its payload is in place, so that its server works on it while
  // this thread copies the next frame's payload. PlaceShared and BuildFrame touch only their
  // own frame's entries of the Exchange, which were all sized by Build.
  for (Slot& slot : c->slots) {
    store_->PlaceShared(slot.frame, &c->x);
    slot.request = store_->BuildFrame(slot.frame, c->x);
    Send(&slot);
  }
}

absl::StatusOr<GrpcParameterStore::AsyncCalls::CallId> GrpcParameterStore::AsyncCalls::Start(
    const common::PushBatch* push, const common::PushOptions& push_options,
    const common::PullBatch* pull, const common::PullOptions& pull_options, bool borrow_pull) {
  if (push != nullptr) WaitForLaggards();
  auto c = std::make_unique<Call>(store_->data_stubs_.size());
  if (pull != nullptr && !borrow_pull) {
    c->pull = *pull;
    pull = &c->pull;
  }
  if (absl::Status st = Build(push, push_options, pull, pull_options, c.get()); !st.ok()) {
    for (std::string& b : c->x.encoded) store_->GiveBuffer(std::move(b));
    return st;
  }
  const CallId id = next_id_++;
  c->id = id;
  c->unfinished = c->slots.size();
  Call* call = c.get();
  running_.emplace(id, std::move(c));
  if (call->slots.empty()) {
    End(call);  // nothing to send (an empty pull): done at once, as the blocking call is
    return id;
  }
  SendAll(call);
  return id;
}

void GrpcParameterStore::AsyncCalls::WaitForLaggards() {
  const uint64_t lead = store_->options_.max_sequence_lead;
  auto lagging = [&] {
    for (const auto& [id, c] : running_) {
      for (size_t s = 0; s < c->sequence.size(); ++s) {
        if (c->sequence[s] != 0 && c->unfinished > 0 &&
            store_->next_sequence_[s].load(std::memory_order_relaxed) - c->sequence[s] >= lead) {
          return true;
        }
      }
    }
    return false;
  };
  while (lagging()) Step();
}

void GrpcParameterStore::AsyncCalls::Send(Slot* slot) {
  slot->answer.Clear();
  // The reader lives in the previous attempt's call arena, which its context holds.
  slot->reader.reset();
  slot->context.reset();
  slot->channel.reset();
  slot->server_busy = false;
  if (std::shared_ptr<common::SharedChannel> channel =
          store_->ChannelFor(slot->frame, slot->call->x);
      channel != nullptr && slot->request.Length() <= common::SharedChannel::kRequestBytes &&
      AnswerFitsAChannelSlot(slot->call->x.headers[slot->frame]) &&
      in_channels_.size() < common::kMaxChannelWaits) {
    if (std::optional<uint32_t> i = channel->AcquireSlot(); i.has_value()) {
      const absl::Duration deadline = store_->options_.deadline;
      slot->channel_slot = *i;
      slot->channel_deadline = absl::Now() + deadline;
      slot->channel_check = absl::Now() + kServerCheckInterval;
      channel->Post(*i, slot->request, deadline);
      // A following payload is copied now, while the server starts on it.
      store_->CopyFollowing(slot->frame, &slot->call->x);
      slot->channel = std::move(channel);
      in_channels_.push_back(slot);
      return;
    }
  }
  // By the socket, the payload is all there before the call goes.
  store_->CopyFollowing(slot->frame, &slot->call->x);
  ++queue_events_;
  slot->context = std::make_unique<grpc::ClientContext>();
  slot->context->set_deadline(absl::ToChronoTime(absl::Now() + store_->options_.deadline));
  slot->reader = store_->data_stubs_[slot->server]->PrepareUnaryCall(
      slot->context.get(), kPushPullMethod, slot->request, &queue_);
  slot->reader->StartCall();
  slot->reader->Finish(&slot->answer, &slot->outcome, slot);
}

void GrpcParameterStore::AsyncCalls::Step() {
  void* tag;
  bool ok;
  // Calls draining end as soon as gRPC let go of their payloads; meanwhile no wait is longer
  // than kDrainPoll (no event says that it did).
  if (!draining_.empty() && EndDrained()) return;
  const bool draining = !draining_.empty();
  if (!in_channels_.empty()) {
    const bool wait = queue_events_ == 0 && !draining;
    if (StepChannels(wait) || wait) return;
    // Attempts of both kinds in flight: look at the queue for a moment, then at the channels.
    if (queue_.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + absl::Microseconds(200))) !=
        grpc::CompletionQueue::GOT_EVENT) {
      return;
    }
  } else if (draining) {
    if (queue_.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + kDrainPoll)) !=
        grpc::CompletionQueue::GOT_EVENT) {
      return;
    }
  } else {
    // Every attempt has a deadline and every alarm a time, so a tag comes; Next fails only
    // after Shutdown, which the destructor calls once nothing is in flight.
    CHECK(poller_.Next(&queue_, &tag, &ok))
        << "completion queue shut down while calls were running";
  }
  --queue_events_;
  Slot* slot = static_cast<Slot*>(tag);
  if (!slot->backing_off) {
    OnAnswer(slot);
    return;
  }
  slot->backing_off = false;
  slot->alarm.reset();
  if (closing_ || !slot->call->status.ok()) {
    if (slot->call->status.ok()) slot->call->status = absl::CancelledError("calls closed");
    SlotDone(slot->call);
    return;
  }
  Send(slot);
}

bool GrpcParameterStore::AsyncCalls::StepChannels(bool wait) {
  // The bells first: an answer written after they were read rings them again. (The vectors
  // are members, reused: this runs on every wait of every call.)
  std::vector<const common::SharedChannel*>& channels = wait_channels_;
  std::vector<uint32_t>& bells = wait_bells_;
  std::vector<Slot*>& done = done_slots_;
  channels.clear();
  bells.clear();
  done.clear();
  for (const Slot* slot : in_channels_) {
    if (std::find(channels.begin(), channels.end(), slot->channel.get()) == channels.end()) {
      channels.push_back(slot->channel.get());
      bells.push_back(slot->channel->worker_bell());
    }
  }
  const absl::Time now = absl::Now();
  absl::Time earliest = absl::InfiniteFuture();
  for (size_t i = 0; i < in_channels_.size();) {
    Slot* slot = in_channels_[i];
    std::optional<common::SharedChannel::Answer> answer =
        slot->channel->TakeAnswer(slot->channel_slot);
    if (answer.has_value()) {
      slot->answer = std::move(answer->frame);
      slot->outcome = common::ToGrpcStatus(answer->status);
      slot->server_busy = answer->server_busy;
      if (answer->status.ok()) store_->CountSharedCall();
    } else if (slot->channel->Unserved(slot->channel_slot)) {
      // Nothing of it was applied: sent again by the socket at once (OnAnswer).
      slot->outcome = grpc::Status(grpc::StatusCode::ABORTED,
                                   "the server closed its shared-memory channel: the segment is "
                                   "not this worker's any more");
    } else if (now >= slot->channel_check && slot->channel->ServerGone()) {
      // A server that died answers nothing and closes nothing: retried (by the socket, after
      // a back-off) as a call to a server that is down is.
      slot->outcome = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "the server process of this shared-memory channel is gone");
    } else if (closing_ || now >= slot->channel_deadline) {
      // Given up: its channel slot stays out of use (the server may still answer into it).
      slot->outcome = closing_ ? grpc::Status(grpc::StatusCode::CANCELLED, "calls closed")
                               : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                              "no answer through shared memory in time");
    } else {
      if (now >= slot->channel_check) slot->channel_check = now + kServerCheckInterval;
      earliest = std::min({earliest, slot->channel_deadline, slot->channel_check});
      ++i;
      continue;
    }
    done.push_back(slot);
    in_channels_[i] = in_channels_.back();
    in_channels_.pop_back();
  }
  for (Slot* slot : done) {
    slot->channel.reset();
    OnAnswer(slot);
  }
  if (!done.empty()) return true;
  if (!wait) return false;
  if (poller_.Poll([&] {
        for (size_t i = 0; i < channels.size(); ++i) {
          if (channels[i]->worker_bell() != bells[i]) return true;
        }
        return false;
      })) {
    return true;
  }
  common::SharedChannel::WaitForAnswers(channels, bells, earliest);
  return true;
}

void GrpcParameterStore::AsyncCalls::OnAnswer(Slot* slot) {
  Call* c = slot->call;
  const uint32_t s = slot->server;
  const GrpcStoreOptions& options = store_->options_;
  absl::Status st = common::FromGrpcStatus(slot->outcome);
  if (st.ok()) {
    if (slot->attempt > 0 && options.on_recovered) {
      options.on_recovered(s, slot->attempt, absl::Now() - slot->first_failure);
    }
    bool refused = false;
    if (c->status.ok()) {
      c->status = store_->ReadAnswer(slot->frame, slot->answer, &c->x);
      refused = !c->status.ok();
    }
    if (!refused) {
      // Served: its server is done with the frame's room in the segment (and any payload lent
      // there), so the call failing at another server gives up nothing of this link (before,
      // End gave up every link the call used, and with it the buffers lent in its segment).
      // An answer this process refused does give its link up (End).
      c->x.shared[slot->frame] = common::SharedArena::Region();
    }
    slot->answer.Clear();
    SlotDone(c);
    return;
  }
  if (c->x.shared[slot->frame].valid() || c->x.asked[slot->frame]) {
    // Whatever went wrong, the frame's next attempt goes by the socket (ABORTED: the server
    // no longer has the segment, and nothing changed: sent again at once).
    const bool used_shared = c->x.shared[slot->frame].valid();
    store_->OnSharedFailure(slot->frame, &c->x);
    // (An ask is not repeated either: the server would replace the segment of a later one.)
    slot->request = store_->BuildFrame(slot->frame, c->x);
    if (used_shared && absl::IsAborted(st) && c->status.ok() && !closing_) {
      Send(slot);
      return;
    }
  }
  slot->first_failure = std::min(slot->first_failure, absl::Now());
  store_->CountFailure(s, st);
  // A call that failed already (another server refused) or is being closed retries nothing.
  if (!c->status.ok() || closing_) {
    if (c->status.ok()) c->status = st;
    SlotDone(c);
    return;
  }
  const bool again = (Retryable(st) || (slot->context != nullptr ? ServerBusy(st, *slot->context)
                                                                 : absl::IsResourceExhausted(st) &&
                                                                       slot->server_busy)) &&
                     !(options.give_up_retries && options.give_up_retries());
  if (!again || slot->attempt >= options.max_retries) {
    const auto& servers = store_->config_.cluster().servers();
    c->status = common::Annotate(
        st, absl::StrCat("server ", s, " (", servers.size() > static_cast<int>(s) ? servers[s] : "?",
                         ")"));
    // Slots of c waiting to retry give up now (their alarms fire at once, cancelled).
    for (Slot& other : c->slots) {
      if (other.backing_off) other.alarm->Cancel();
    }
    SlotDone(c);
    return;
  }
  store_->CountRetry(s);
  if (options.on_retry) options.on_retry(s, slot->attempt + 1, st);
  const absl::Duration backoff = store_->Backoff(slot->attempt);
  ++slot->attempt;
  slot->backing_off = true;
  slot->alarm = std::make_unique<grpc::Alarm>();
  ++queue_events_;
  slot->alarm->Set(&queue_, absl::ToChronoTime(absl::Now() + backoff), slot);
}

void GrpcParameterStore::AsyncCalls::SlotDone(Call* c) {
  if (--c->unfinished == 0) End(c);
}

void GrpcParameterStore::AsyncCalls::End(Call* c) {
  Exchange& x = c->x;
  if (!c->status.ok()) {
    for (uint32_t f = 0; f < x.shared.size(); ++f) {
      if (x.shared[f].valid() || x.asked[f]) store_->OnSharedFailure(f, &x);
    }
  }
  if (c->status.ok()) {
    // Repeated keys get the row their first occurrence received.
    for (const Exchange::SparseOut& so : x.sparse_out) {
      const size_t dim = so.info->dim;
      float* out = so.pull->out.data();
      for (auto [i, first] : so.repeats) {
        std::memcpy(out + size_t{i} * dim, out + size_t{first} * dim, dim * sizeof(float));
      }
    }
    store_->CountExchange(x);
    // Every server the push went to has applied it.
    if (c->push_clock >= 0) store_->NoteDoneClock(c->push_clock);
  }
  // A call that ended OK at the first attempt of every frame: each server read all of its
  // frame, so gRPC reads none of it again (it may still hold its slices for a moment). Any
  // other call waits until gRPC let go of them (see common::AliasTracker) before its memory
  // is the caller's again: its own references go first, each reader before its context.
  bool drain = !c->status.ok();
  for (const Slot& slot : c->slots) drain = drain || slot.attempt > 0;
  if (drain) {
    for (Slot& slot : c->slots) {
      slot.request.Clear();
      slot.reader.reset();
      slot.context.reset();
    }
  }
  auto it = running_.find(c->id);
  std::unique_ptr<Call> call = std::move(it->second);
  running_.erase(it);
  if (drain && !x.aliases.released()) {
    draining_.push_back(std::move(call));
    return;
  }
  HandBack(call.get());
}

void GrpcParameterStore::AsyncCalls::HandBack(Call* c) {
  for (std::string& b : c->x.encoded) store_->GiveBuffer(std::move(b));
  ended_.push_back(Done{c->id, c->status});
}

bool GrpcParameterStore::AsyncCalls::EndDrained() {
  bool any = false;
  for (size_t i = 0; i < draining_.size();) {
    if (!draining_[i]->x.aliases.released()) {
      ++i;
      continue;
    }
    HandBack(draining_[i].get());
    draining_.erase(draining_.begin() + i);
    any = true;
  }
  return any;
}

bool GrpcParameterStore::AsyncCalls::Draining(CallId id) const {
  for (const auto& c : draining_) {
    if (c->id == id) return true;
  }
  return false;
}

absl::StatusOr<GrpcParameterStore::AsyncCalls::Done> GrpcParameterStore::AsyncCalls::Next() {
  if (ended_.empty() && running_.empty() && draining_.empty()) {
    return absl::FailedPreconditionError("no call in flight");
  }
  while (ended_.empty()) Step();
  Done done = std::move(ended_.front());
  ended_.pop_front();
  return done;
}

absl::Status GrpcParameterStore::AsyncCalls::Wait(CallId id) {
  while (true) {
    for (auto it = ended_.begin(); it != ended_.end(); ++it) {
      if (it->id != id) continue;
      absl::Status st = std::move(it->status);
      ended_.erase(it);
      return st;
    }
    if (running_.find(id) == running_.end() && !Draining(id)) {
      return absl::NotFoundError(absl::StrCat("call ", id, " is not pending"));
    }
    Step();
  }
}

}  // namespace ps::worker
