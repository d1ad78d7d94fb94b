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
#include "common/rpc/busy_poll.h"
#include "common/rpc/shared_channel.h"
#include "glog/logging.h"
#include "server/rpc/service.h"

namespace ps::server {

using common::SharedChannel;

// One thread per channel waits on its bell, takes each posted frame and serves it as a gRPC
// call is served (on this thread; a pull that must wait is parked, and its answer is written
// by whichever thread completes it). The slots it is serving are recorded here, not in the
// segment, so a worker that posts a slot again while it is served is not served twice at once.
class ParameterServerService::ChannelServer {
 public:
  ChannelServer(ParameterServerService* service, std::shared_ptr<common::SharedMemory> memory,
                uint64_t offset, int32_t worker_id, const PeerIdentity* peer)
      : service_(service),
        state_(std::make_shared<State>(std::move(memory), offset)),
        peer_(Identity(worker_id, peer)),
        poller_(service->options_.channel_busy_poll),
        thread_([this] { Run(); }) {}
  ~ChannelServer() {
    stop_.store(true, std::memory_order_release);
    state_->channel.RingServer();
    thread_.join();
    state_->channel.Close();
  }

 private:
  struct State {
    State(std::shared_ptr<common::SharedMemory> memory, uint64_t offset)
        : channel(std::move(memory), offset) {}
    SharedChannel channel;
    std::atomic<bool> serving[SharedChannel::kSlots] = {};
  };

  // Frames of the channel act as its worker: a frame naming another worker is refused
  // (PERMISSION_DENIED), with or without TLS. The segment went only to that worker.
  static PeerIdentity Identity(int32_t worker_id, const PeerIdentity* peer) {
    PeerIdentity id;
    id.role = PeerRole::kWorker;
    id.index = worker_id;
    id.authenticated = peer == nullptr || peer->authenticated || peer->role == PeerRole::kUnchecked;
    id.name = absl::StrCat("worker ", worker_id, "'s shared-memory channel",
                           peer != nullptr ? absl::StrCat(" (", peer->name, ")") : "");
    return id;
  }

  void Run() {
    in_channel_thread = true;
    while (!stop_.load(std::memory_order_acquire)) {
      const uint32_t bell = state_->channel.server_bell();
      bool served = false;
      for (uint32_t i = 0; i < SharedChannel::kSlots; ++i) {
        if (state_->serving[i].load(std::memory_order_acquire)) continue;
        std::optional<SharedChannel::Request> request = state_->channel.TakeRequest(i);
        if (!request.has_value()) continue;
        served = true;
        state_->serving[i].store(true, std::memory_order_release);
        Serve(i, *std::move(request));
      }
      if (served) continue;
      // Polls first (a call answered by a thread that was awake costs no wake-up), then
      // sleeps; a second's timeout only bounds how long a lost wake-up could delay a call.
      if (poller_.Poll([&] {
            return stop_.load(std::memory_order_relaxed) || state_->channel.server_bell() != bell;
          })) {
        continue;
      }
      state_->channel.WaitForRequests(bell, absl::Now() + absl::Seconds(1));
    }
  }

  void Serve(uint32_t slot, SharedChannel::Request request) {
    const absl::Time arrived = absl::Now();
    service_->counters_.calls_shared.fetch_add(1, std::memory_order_relaxed);
    std::shared_ptr<State> state = state_;
    if (!request.status.ok()) {
      service_->Unparseable(request.status).IgnoreError();
      service_->Record(kPush, arrived, request.status, 0, 0);
      return Answer(*state, slot, request.status, nullptr, false);
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
          call->request, deadline, &call->response, arrived, &peer,
          [state, slot, call](absl::Status status) {
            Answer(*state, slot, status, &call->response, false);
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

  static thread_local bool in_channel_thread;

  ParameterServerService* const service_;
  const std::shared_ptr<State> state_;  // shared with the answers of parked pulls
  const PeerIdentity peer_;
  std::atomic<bool> stop_{false};
  common::BusyPoller poller_;  // the thread's own
  std::thread thread_;  // last: it starts in the constructor
};

thread_local bool ParameterServerService::ChannelServer::in_channel_thread = false;

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
  if (reader.remaining() > 0 || (sp.push_bytes() > 0 && !header.has_push()) ||
      (sp.push_bytes() > 0 && !holds(sp.push_offset(), sp.push_bytes())) ||
      (sp.answer_capacity() > 0 && !holds(sp.answer_offset(), sp.answer_capacity()))) {
    return Unparseable(absl::InvalidArgumentError(
        absl::StrCat("unparseable frame: shared payload of ", sp.push_bytes(), " bytes at ",
                     sp.push_offset(), " and answer room of ", sp.answer_capacity(), " at ",
                     sp.answer_offset(), ", ", reader.remaining(),
                     " payload bytes in the frame, in a segment of ", segment->size(), " bytes")));
  }
  return segment;
}

bool ParameterServerService::OfferSharedSegment(const RequestInfo& info, uint64_t bytes,
                                                const PeerIdentity* peer, SharedSegment* offer) {
  const int32_t worker_id = info.worker_id;
  bytes = std::min<uint64_t>(bytes, options_.max_shared_bytes_per_worker);
  if (bytes <= common::SharedMemory::kReservedBytes || worker_id < 0 ||
      worker_id >= static_cast<int64_t>(shard_->config().cluster().num_workers())) {
    return false;
  }
  {
    absl::MutexLock lock(&shared_mu_);
    auto it = shared_.find(worker_id);
    if (it != shared_.end() && it->second.incarnation > info.worker_incarnation) return false;
  }
  // A segment counts against server.max_memory_bytes with its whole size (the worker may
  // touch every page of it) for as long as anything holds it; one that does not fit is not
  // made, and the worker's calls keep the socket.
  // The charge is released by the last holder (the shard's budget outlives them all: parked
  // pulls that hold a segment are the shard's, and the service goes before the shard).
  MemoryBudget& budget = shard_->memory();
  absl::Status room =
      budget.CheckRoom(bytes, absl::StrCat("worker ", worker_id, "'s shared-memory segment"));
  absl::StatusOr<std::shared_ptr<common::SharedMemory>> made =
      room.ok() ? common::SharedMemory::Create(bytes) : room;
  if (!made.ok()) {
    LOG_EVERY_T(WARNING, 10) << "no shared memory for worker " << worker_id << ": "
                             << made.status();
    return false;
  }
  const int64_t charge = static_cast<int64_t>((*made)->size());
  budget.Add(charge);
  *made = std::shared_ptr<common::SharedMemory>(
      made->get(), [held = *made, &budget, charge](common::SharedMemory*) { budget.Add(-charge); });
  offer->set_id((*made)->id());
  offer->set_path((*made)->path());
  offer->set_bytes((*made)->size());
  offer->set_boot_id(common::SharedMemory::BootId());
  const std::optional<uint64_t> channel_offset = SharedChannel::OffsetFor((*made)->size());
  std::shared_ptr<ChannelServer> channel;
  bool stopped;
  {
    absl::MutexLock lock(&shared_mu_);
    stopped = channels_stopped_;
  }
  if (channel_offset.has_value() && !stopped) {
    try {
      channel = std::make_shared<ChannelServer>(this, *made, *channel_offset, worker_id, peer);
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
