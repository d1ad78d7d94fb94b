// ParameterServerService's shared-memory segments (docs/design.md, "Shared memory between
// processes of one host"): making one for a worker that asks, and finding and checking the one
// a PushPull names.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/monotonic_time.h"
#include "common/rpc/busy_poll.h"
#include "common/rpc/shared_channel.h"
#include "glog/logging.h"
#include "server/rpc/service.h"

namespace ps::server {

using common::SharedChannel;

namespace {
// Set on the threads that serve channels (ChannelThreads): an answer written there needs no
// ring of the server's bell, since the thread looks at every slot again after each pass.
thread_local bool in_channel_thread = false;
// On such a thread: its latest wait for requests ended while it polled, and its latest spin
// long enough to judge ran on a core no other thread wanted (common/busy_wait.h): not after it
// slept, nor on a core it shared with other busy threads.
thread_local bool channel_call_polled = false;
}  // namespace

bool ParameterServerService::ChannelCallPolled() {
  return in_channel_thread && channel_call_polled;
}

bool ParameterServerService::LateFollower(int32_t worker_id) {
  const int64_t latest = late_pauses_end_ns_.load(std::memory_order_acquire);
  if (latest == kNoLatePause) return false;
  const absl::Time now = PauseNow();
  if (absl::ToUnixNanos(now) >= latest) return false;  // every pause is over
  absl::MutexLock lock(&shared_mu_);
  auto it = late_followers_.find(worker_id);
  return it != late_followers_.end() && now < it->second.until;
}

absl::Time ParameterServerService::PauseNow() const {
  if (options_.pause_clock) return options_.pause_clock();
  // Monotonic: a step of the wall clock neither lengthens nor shortens a pause.
  return common::MonotonicNow();
}

bool ParameterServerService::OwesTooMuchWaiting(int32_t worker_id, absl::Duration waited,
                                                uint64_t bytes) {
  const absl::Duration excess = ExcessWait(waited, bytes);
  if (excess <= absl::ZeroDuration()) return false;
  const absl::Time now = PauseNow();
  absl::MutexLock lock(&shared_mu_);
  WaitDebt& debt = wait_debts_[worker_id];
  debt = AddWaitDebt(debt, now, excess);
  if (debt.owed <= options_.late_following) return false;
  debt = WaitDebt{};
  return true;
}

void ParameterServerService::MarkLateFollower(int32_t worker_id) {
  const absl::Time now = PauseNow();
  absl::MutexLock lock(&shared_mu_);
  auto it = late_followers_.find(worker_id);
  const LatePause next = NextLatePause(it == late_followers_.end() ? nullptr : &it->second, now,
                                       options_.late_following_pause);
  late_followers_[worker_id] = next;
  // Only ever later (under shared_mu_), so once it is past no worker is paused.
  const int64_t end = absl::ToUnixNanos(next.until);
  if (end > late_pauses_end_ns_.load(std::memory_order_relaxed)) {
    late_pauses_end_ns_.store(end, std::memory_order_release);
  }
}

// The threads that serve the workers' channels: at most max_threads (0: one per channel),
// each channel served by one of them, given to the one with the fewest channels when it is
// made (a new thread while the cap allows and every thread serves some channel).
class ParameterServerService::ChannelThreads {
 public:
  ChannelThreads(size_t max_threads, absl::Duration busy_poll);
  ~ChannelThreads();  // REQUIRES: every channel removed
  // std::system_error when a thread was needed and could not be started.
  void Add(ChannelServer* c) ABSL_LOCKS_EXCLUDED(mu_);
  // Once it returns, c is not served and never will be.
  void Remove(ChannelServer* c) ABSL_LOCKS_EXCLUDED(mu_);
  size_t threads() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Thread;
  // One futex_waitv takes the channels' bells and the thread's control word.
  static constexpr size_t kMaxChannelsPerThread = common::kMaxChannelWaits - 1;

  const size_t max_threads_;
  const absl::Duration busy_poll_;
  absl::Mutex mu_;  // taken before a Thread's
  std::vector<std::unique_ptr<Thread>> threads_ ABSL_GUARDED_BY(mu_);
};

// A worker's channel: the server takes each posted frame and serves it as a gRPC call is
// served (on the thread of ChannelThreads that serves the channel; a pull that must wait is
// parked, and its answer is written by whichever thread completes it). The slots it is
// serving are recorded here, not in the segment, so a worker that posts a slot again while it
// is served is not served twice at once.
class ParameterServerService::ChannelServer {
 public:
  // Served from now on by one of the service's channel threads. std::system_error when no
  // thread could be started for it.
  ChannelServer(ParameterServerService* service, std::shared_ptr<common::SharedMemory> memory,
                uint64_t offset, int32_t worker_id, uint64_t incarnation, const PeerIdentity* peer)
      : service_(service),
        state_(std::make_shared<State>(std::move(memory), offset)),
        peer_(Identity(worker_id, incarnation, peer)) {
    service_->channel_threads_->Add(this);
  }
  // Takes no request once it returns (its thread may be serving another channel).
  ~ChannelServer() {
    service_->channel_threads_->Remove(this);
    state_->channel.Close();
  }

 private:
  friend class ChannelThreads;

  struct State {
    State(std::shared_ptr<common::SharedMemory> memory, uint64_t offset)
        : channel(std::move(memory), offset) {}
    SharedChannel channel;
    std::atomic<bool> serving[SharedChannel::kSlots] = {};
  };

  // Frames of the channel act as its worker's process: a frame naming another worker, or
  // another incarnation, is refused (PERMISSION_DENIED), with or without TLS. The segment went
  // only to that process.
  static PeerIdentity Identity(int32_t worker_id, uint64_t incarnation, const PeerIdentity* peer) {
    PeerIdentity id;
    id.role = PeerRole::kWorker;
    id.index = worker_id;
    id.channel_incarnation = incarnation;
    id.authenticated = peer == nullptr || peer->authenticated || peer->role == PeerRole::kUnchecked;
    id.name = absl::StrCat("worker ", worker_id, "'s shared-memory channel",
                           peer != nullptr ? absl::StrCat(" (", peer->name, ")") : "");
    return id;
  }

  // Takes and serves every posted request of a slot not being served; whether there was one.
  bool ServeReady() {
    bool served = false;
    for (uint32_t i = 0; i < SharedChannel::kSlots; ++i) {
      if (state_->serving[i].load(std::memory_order_acquire)) continue;
      std::optional<SharedChannel::Request> request = state_->channel.TakeRequest(i);
      if (!request.has_value()) continue;
      served = true;
      state_->serving[i].store(true, std::memory_order_release);
      Serve(i, *std::move(request));
    }
    return served;
  }

  void Serve(uint32_t slot, SharedChannel::Request request) {
    const absl::Time arrived = absl::Now();
    service_->counters_.calls_shared.fetch_add(1, std::memory_order_relaxed);
    std::shared_ptr<State> state = state_;
    if (!request.status.ok()) {
      // Counted and answered with its reason, as every other refusal (found in review,
      // 2026-12-06: the tagged status was dropped, so the metrics said "other").
      const absl::Status refused = service_->Unparseable(request.status);
      service_->Record(kPush, arrived, refused, 0, 0);
      return Answer(*state, slot, refused, nullptr, false);
    }
    struct Call {
      grpc::ByteBuffer request;
      grpc::ByteBuffer response;
    };
    auto call = std::make_shared<Call>();
    call->request = std::move(request.frame);
    const absl::Time deadline = arrived + request.timeout;
    // On the pool (deterministic BSP) this may run after the channel was closed: it holds
    // only what outlives the channel (the service outlives its pool).
    auto serve = [service = service_, peer = peer_, state, slot, call, deadline, arrived] {
      service->StartPushPull(
          &call->request, deadline, &call->response, arrived, &peer,
          [service, state, slot, call](absl::Status status) {
            if (status.ok() && service->channel_answers_closed_.load(std::memory_order_acquire)) {
              // The final checkpoint may have been cut before this push was applied: it is
              // not acknowledged. Sent again (to this server restarted, which restores that
              // checkpoint with its exactly-once record), it is applied at most once.
              status = absl::UnavailableError(
                  "the server stopped before this call was answered: send it again");
            }
            Answer(*state, slot, status, &call->response,
                   !status.ok() && RejectionReason(status) == kServerBusyReason);
          },
          /*from_channel=*/true);
    };
    if (!service_->PushesWait()) return serve();
    const size_t bytes = call->request.Length();
    ParameterServerService* service = service_;
    ++service->channel_pool_calls_;
    absl::Status st = service->ServeOnPool(bytes, [service, serve = std::move(serve)] {
      serve();
      --service->channel_pool_calls_;
    });
    if (!st.ok()) {
      --service->channel_pool_calls_;
      service->Record(kPush, arrived, st, bytes, 0);
      Answer(*state, slot, st, nullptr, /*server_busy=*/true);
    }
  }

  static void Answer(State& state, uint32_t slot, const absl::Status& status,
                     const grpc::ByteBuffer* response, bool server_busy) {
    state.channel.WriteAnswer(slot, status, response, server_busy);
    state.serving[slot].store(false, std::memory_order_release);
    // The slot may have been posted again while it was served; the channel's thread looks
    // at every slot again after each it serves, but a parked pull is answered elsewhere.
    if (!in_channel_thread) state.channel.RingServer();
  }

  ParameterServerService* const service_;
  const std::shared_ptr<State> state_;  // shared with the answers of parked pulls
  const PeerIdentity peer_;
};

// One thread serving some of the channels, one pass over all of them after another: it reads
// their bells, serves every posted request, and when a pass found none polls the bells, then
// sleeps on all of them (and on its own control word, rung when its channels change).
class ParameterServerService::ChannelThreads::Thread {
 public:
  explicit Thread(absl::Duration busy_poll)
      : poller_(busy_poll, common::BusyWaiter::kCheapRequestWait), thread_([this] { Run(); }) {}
  ~Thread() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    SharedChannel::RingControl(&control_);
    thread_.join();
  }

  size_t size() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return channels_.size();
  }
  void Add(ChannelServer* c) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      channels_.push_back(c);
    }
    SharedChannel::RingControl(&control_);
  }
  // Whether `c` was this thread's. Once it returns, c is not served and never will be, and
  // the thread holds nothing of it (its segment goes as soon as nothing else holds it).
  // REQUIRES: not called on this thread.
  bool Remove(ChannelServer* c) ABSL_LOCKS_EXCLUDED(mu_) {
    uint64_t removal;
    {
      absl::MutexLock lock(&mu_);  // held by a pass that serves
      auto it = std::find(channels_.begin(), channels_.end(), c);
      if (it == channels_.end()) return false;
      channels_.erase(it);
      removal = ++removals_;
    }
    // Its next pass starts by letting go of what the last one held.
    SharedChannel::RingControl(&control_);
    absl::MutexLock lock(&mu_);
    auto passed = [this, removal]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return removals_seen_ >= removal || stopped_;
    };
    mu_.Await(absl::Condition(&passed));
    return true;
  }

 private:
  void Run() {
    in_channel_thread = true;
    // What the wait needs of the channels of the last pass; the States keep their segments
    // mapped even if a channel is removed meanwhile. (Reused: this runs after every call.)
    std::vector<std::shared_ptr<ChannelServer::State>> held;
    std::vector<const SharedChannel*> channels;
    std::vector<uint32_t> bells;
    while (true) {
      const uint32_t control = control_.load(std::memory_order_acquire);
      held.clear();
      channels.clear();
      bells.clear();
      bool served = false;
      {
        absl::MutexLock lock(&mu_);
        removals_seen_ = removals_;
        if (stop_) {
          stopped_ = true;
          return;
        }
        // The bells first: a request posted after they were read rings them again.
        for (ChannelServer* c : channels_) {
          held.push_back(c->state_);
          channels.push_back(&c->state_->channel);
          bells.push_back(c->state_->channel.server_bell());
        }
        for (ChannelServer* c : channels_) served |= c->ServeReady();
      }
      if (served) continue;
      // Polls first (a call answered by a thread that was awake costs no wake-up), then
      // sleeps; a second's timeout only bounds how long a lost wake-up could delay a call.
      if (poller_.Poll([&] {
            if (control_.load(std::memory_order_relaxed) != control) return true;
            for (size_t i = 0; i < channels.size(); ++i) {
              if (channels[i]->server_bell() != bells[i]) return true;
            }
            return false;
          })) {
        channel_call_polled = !poller_.last_spin_contended();
        continue;
      }
      channel_call_polled = false;
      SharedChannel::WaitForRequests(channels, bells, &control_, control,
                                     absl::Now() + absl::Seconds(1));
    }
  }

  absl::Mutex mu_;  // held while a pass serves, so that Remove waits for it
  std::vector<ChannelServer*> channels_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;        // Run has returned
  uint64_t removals_ ABSL_GUARDED_BY(mu_) = 0;       // channels removed so far
  uint64_t removals_seen_ ABSL_GUARDED_BY(mu_) = 0;  // by the start of the latest pass
  std::atomic<uint32_t> control_{0};
  common::BusyPoller poller_;  // the thread's own; it waits for requests
  std::thread thread_;         // last: it starts in the constructor
};

ParameterServerService::ChannelThreads::ChannelThreads(size_t max_threads, absl::Duration busy_poll)
    : max_threads_(max_threads), busy_poll_(busy_poll) {}

ParameterServerService::ChannelThreads::~ChannelThreads() = default;

void ParameterServerService::ChannelThreads::Add(ChannelServer* c) {
  absl::MutexLock lock(&mu_);
  Thread* least = nullptr;
  size_t least_size = 0;
  for (const std::unique_ptr<Thread>& t : threads_) {
    const size_t n = t->size();
    if (n < kMaxChannelsPerThread && (least == nullptr || n < least_size)) {
      least = t.get();
      least_size = n;
    }
  }
  // A new thread while below the cap and every thread serves some channel (or all are full).
  if (least == nullptr ||
      (least_size > 0 && (max_threads_ == 0 || threads_.size() < max_threads_))) {
    threads_.push_back(std::make_unique<Thread>(busy_poll_));  // may throw std::system_error
    least = threads_.back().get();
  }
  least->Add(c);
}

void ParameterServerService::ChannelThreads::Remove(ChannelServer* c) {
  absl::MutexLock lock(&mu_);
  for (const std::unique_ptr<Thread>& t : threads_) {
    if (t->Remove(c)) return;
  }
}

size_t ParameterServerService::ChannelThreads::threads() {
  absl::MutexLock lock(&mu_);
  return threads_.size();
}

void ParameterServerService::ChannelThreadsDeleter::operator()(ChannelThreads* t) const {
  delete t;
}

std::unique_ptr<ParameterServerService::ChannelThreads,
                ParameterServerService::ChannelThreadsDeleter>
ParameterServerService::NewChannelThreads(const ServiceOptions& options) {
  return std::unique_ptr<ChannelThreads, ChannelThreadsDeleter>(
      new ChannelThreads(options.channel_threads, options.channel_busy_poll));
}

size_t ParameterServerService::channel_threads_started() { return channel_threads_->threads(); }

void ParameterServerService::StopChannels(absl::Duration timeout) {
  std::vector<std::shared_ptr<ChannelServer>> channels;
  {
    absl::MutexLock lock(&shared_mu_);
    channels_stopped_ = true;
    for (auto& [worker, segment] : shared_) {
      channels.push_back(std::move(segment.channel));
      segment.channel_offset = 0;
    }
  }
  channels.clear();  // joins each thread
  const absl::Time until = absl::Now() + timeout;
  while (channel_pool_calls_.load() > 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  // Calls still running (a deterministic push waiting for its turn) end without an OK: the
  // drain's final checkpoint comes next, and may miss what they apply.
  channel_answers_closed_.store(true, std::memory_order_release);
}

absl::StatusOr<std::shared_ptr<common::SharedMemory>> ParameterServerService::SharedSegmentOf(
    const PushPullRequest& header, const common::FrameReader& reader) {
  const SharedPayload& sp = header.shared();
  std::shared_ptr<common::SharedMemory> segment;
  uint64_t limit = 0;  // payload ranges end by it (the channel's start)
  {
    absl::MutexLock lock(&shared_mu_);
    auto it = shared_.find(header.header().worker_id());
    if (it != shared_.end() && it->second.memory->id() == sp.segment()) {
      segment = it->second.memory;
      limit = it->second.channel_offset != 0 ? it->second.channel_offset : segment->size();
    }
  }
  auto holds = [&](uint64_t offset, uint64_t n) {
    return segment->Holds(offset, n) && offset + n <= limit;
  };
  if (segment == nullptr) {
    return shard_->Reject(
        "unknown_segment",
        absl::AbortedError(absl::StrCat("shared segment ", absl::Hex(sp.segment()),
                                        " is not this worker's: send the call without it")));
  }
  // A following payload's count lies in the line before it (8-byte aligned), and the payload
  // is at most kMaxFollowingBytes.
  const bool bad_following =
      sp.push_follows() &&
      (sp.push_bytes() == 0 || sp.push_bytes() > common::kMaxFollowingBytes ||
       sp.push_offset() < common::kFollowingWordBytes || sp.push_offset() % 8 != 0 ||
       !holds(sp.push_offset() - common::kFollowingWordBytes, sizeof(uint64_t)));
  if (reader.remaining() > 0 || (sp.push_bytes() > 0 && !header.has_push()) ||
      (sp.push_bytes() > 0 && !holds(sp.push_offset(), sp.push_bytes())) ||
      (sp.answer_capacity() > 0 && !holds(sp.answer_offset(), sp.answer_capacity())) ||
      bad_following) {
    return Unparseable(absl::InvalidArgumentError(absl::StrCat(
        "unparseable frame: shared payload of ", sp.push_bytes(), " bytes at ", sp.push_offset(),
        sp.push_follows() ? " (following its call)" : "", " and answer room of ",
        sp.answer_capacity(), " at ", sp.answer_offset(), ", ", reader.remaining(),
        " payload bytes in the frame, in a segment of ", segment->size(), " bytes")));
  }
  return segment;
}

void ParameterServerService::DropSegment(const RequestInfo& info, uint64_t id,
                                         absl::string_view why) {
  std::shared_ptr<ChannelServer> channel;  // joined after the lock
  absl::MutexLock lock(&shared_mu_);
  if (auto it = shared_.find(info.worker_id);
      it != shared_.end() && it->second.incarnation == info.worker_incarnation &&
      it->second.memory != nullptr && it->second.memory->id() == id) {
    channel = std::move(it->second.channel);
    shared_.erase(it);
    LOG(INFO) << "worker " << info.worker_id << "'s shared-memory segment " << id
              << " let go: " << why;
  }
}

bool ParameterServerService::OfferSharedSegment(const RequestInfo& info, uint64_t bytes,
                                                const PeerIdentity* peer, SharedSegment* offer) {
  const int32_t worker_id = info.worker_id;
  bytes = std::min<uint64_t>(bytes, options_.max_shared_bytes_per_worker);
  if (bytes <= common::SharedMemory::kReservedBytes || worker_id < 0 ||
      worker_id >= static_cast<int64_t>(shard_->config().cluster().num_workers())) {
    return false;
  }
  // Nor to an incarnation too far ahead of the clock (refused after this): it would replace
  // the live one's segment, and no later incarnation could ever take its place.
  if (!shard_->workers().CheckIncarnation(worker_id, info.worker_incarnation).ok()) return false;
  {
    absl::MutexLock lock(&shared_mu_);
    auto it = shared_.find(worker_id);
    if (it != shared_.end() && it->second.incarnation > info.worker_incarnation) return false;
  }
  // Nor to an incarnation the server has heard a newer one of (a process fenced off): its
  // call is refused after this, and the segment it replaced would close the live one's.
  if (std::optional<WorkerTracker::Position> known = shard_->workers().PositionOf(worker_id);
      known.has_value() && known->incarnation > info.worker_incarnation) {
    return false;
  }
  {
    // The worker's segment so far goes before the new one is charged: the worker asks again
    // only once it has given that one up (a failed call, a new process), and a budget with
    // room for one segment would otherwise refuse every ask after the first. Calls still
    // naming it are refused (unknown_segment) and sent again by the socket; it is freed, and
    // uncharged, once the last call or parked pull holding it lets go.
    std::shared_ptr<common::SharedMemory> memory;
    std::shared_ptr<ChannelServer> channel;  // joined after the lock
    absl::MutexLock lock(&shared_mu_);
    if (auto it = shared_.find(worker_id);
        it != shared_.end() && it->second.incarnation <= info.worker_incarnation) {
      memory = std::move(it->second.memory);
      channel = std::move(it->second.channel);
      shared_.erase(it);
    }
  }
  // A segment counts against server.max_memory_bytes with its whole size (the worker may
  // touch every page of it) for as long as anything holds it; one that does not fit is not
  // made, and the worker's calls keep the socket.
  // The charge is released by the last holder (the shard's budget outlives them all: parked
  // pulls that hold a segment are the shard's, and the service goes before the shard).
  // Nor while the worker has kMaxSegmentsHeldPerWorker alive: parked pulls (up to
  // max_parked_pulls_per_worker of them) would otherwise keep a segment each charged, of a
  // worker asking again and again, and take the budget other workers' rows and segments need.
  std::atomic<int>& alive = segments_alive_[worker_id];
  if (alive.fetch_add(1, std::memory_order_acq_rel) >= kMaxSegmentsHeldPerWorker) {
    alive.fetch_sub(1, std::memory_order_acq_rel);
    LOG_EVERY_T(WARNING, 10) << "no new shared memory for worker " << worker_id << ": "
                             << kMaxSegmentsHeldPerWorker
                             << " of its segments are still held by its calls";
    return false;
  }
  // Charged before it is made, in one step with the check: workers asking at once (every
  // worker's first call of a job) each fit with the others' charges counted.
  MemoryBudget& budget = shard_->memory();
  absl::Status room =
      budget.TryCharge(bytes, absl::StrCat("worker ", worker_id, "'s shared-memory segment"));
  absl::StatusOr<std::shared_ptr<common::SharedMemory>> made =
      room.ok() ? common::SharedMemory::Create(bytes) : room;
  if (!made.ok()) {
    if (room.ok()) budget.Add(-static_cast<int64_t>(bytes));
    alive.fetch_sub(1, std::memory_order_acq_rel);
    LOG_EVERY_T(WARNING, 10) << "no shared memory for worker " << worker_id << ": "
                             << made.status();
    return false;
  }
  const int64_t charge = static_cast<int64_t>((*made)->size());
  budget.Add(charge - static_cast<int64_t>(bytes));  // the size made (whole pages)
  *made = std::shared_ptr<common::SharedMemory>(
      made->get(),
      [held = *made, &budget, charge, counts = segments_alive_, worker_id](common::SharedMemory*) {
        budget.Add(-charge);
        counts[worker_id].fetch_sub(1, std::memory_order_acq_rel);
      });
  offer->set_id((*made)->id());
  offer->set_path((*made)->path());
  offer->set_bytes((*made)->size());
  offer->set_boot_id(common::SharedMemory::BootId());
  // A worker paused for a late payload (late_followers_) follows again on this segment once
  // an answer through it says so.
  offer->set_push_may_follow(!LateFollower(worker_id));
  offer->set_push_may_follow_later(true);
  const std::optional<uint64_t> channel_offset = SharedChannel::OffsetFor((*made)->size());
  std::shared_ptr<ChannelServer> channel;
  bool stopped;
  {
    absl::MutexLock lock(&shared_mu_);
    stopped = channels_stopped_;
  }
  if (channel_offset.has_value() && !stopped) {
    try {
      channel = std::make_shared<ChannelServer>(this, *made, *channel_offset, worker_id,
                                                info.worker_incarnation, peer);
      offer->set_channel_offset(*channel_offset);
    } catch (const std::system_error& e) {  // no thread to be had: the calls use the socket
      LOG(WARNING) << "no shared-memory channel for worker " << worker_id << ": " << e.what();
    }
  }
  std::shared_ptr<ChannelServer> old;  // joined after the lock (or the new one, unused)
  absl::MutexLock lock(&shared_mu_);
  if (channel != nullptr && channels_stopped_) {
    old = std::move(channel);  // stopped meanwhile: no segment, the calls keep the socket
    return false;
  }
  WorkerSegment& w = shared_[worker_id];
  if (w.memory != nullptr && w.incarnation > info.worker_incarnation) {
    old = std::move(channel);
    return false;
  }
  w.incarnation = info.worker_incarnation;
  w.memory = *std::move(made);  // calls still using the old one hold it
  w.channel_offset = channel != nullptr ? *channel_offset : 0;
  old = std::exchange(w.channel, std::move(channel));
  return true;
}

}  // namespace ps::server
