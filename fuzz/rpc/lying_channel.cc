#include "fuzz/rpc/lying_channel.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/codec.h"
#include "common/rpc/frame_testing.h"
#include "fuzz/fuzz_env.h"
#include "glog/logging.h"

namespace ps::fuzz {
namespace {

using common::SharedChannel;

constexpr size_t kSegmentBytes = size_t{8} << 20;  // room for a channel and the arena below

// The slot and bell words as shared_channel.cc declares them (checked by CheckChannelLayout).
enum State : uint32_t { kFree = 0, kPosted = 1, kTaken = 2, kAnswered = 3 };
struct RawSlot {
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> request_bytes;
  std::atomic<uint64_t> timeout_us;
  std::atomic<uint32_t> answer_bytes;
  std::atomic<int32_t> code;
  std::atomic<uint32_t> flags;
};
struct RawBells {
  alignas(64) std::atomic<uint32_t> server;
  std::atomic<uint32_t> server_sleeping;
  alignas(64) std::atomic<uint32_t> worker;
  std::atomic<uint32_t> worker_sleepers;
  std::atomic<uint32_t> closed;
};

RawSlot* SlotOf(const SharedChannel& c, uint32_t i) {
  return reinterpret_cast<RawSlot*>(c.memory()->data() + c.offset() + SharedChannel::kBellBytes +
                                    size_t{i} * SharedChannel::kSlotBytes);
}
char* AnswerAreaOf(const SharedChannel& c, uint32_t i) {
  return reinterpret_cast<char*>(SlotOf(c, i)) + SharedChannel::kSlotHeaderBytes +
         SharedChannel::kRequestBytes;
}
RawBells* BellsOf(const SharedChannel& c) {
  return reinterpret_cast<RawBells*>(c.memory()->data() + c.offset());
}
// As SharedChannel rings it (a futex wake only when a worker thread said it sleeps).
void RingWorker(const SharedChannel& c) {
  RawBells* b = BellsOf(c);
  b->worker.fetch_add(1);
  if (b->worker_sleepers.load() != 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&b->worker), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
  }
}

// Slot i's answer fields as they are, whatever they say, and the worker rung.
void WriteRaw(const SharedChannel& c, uint32_t i, const Action& a, const std::string& area) {
  const size_t n = std::min(area.size(), SharedChannel::kAnswerBytes);
  std::memcpy(AnswerAreaOf(c, i), area.data(), n);
  const uint32_t sizes[] = {static_cast<uint32_t>(n), 0, SharedChannel::kAnswerBytes,
                            SharedChannel::kAnswerBytes + 1, UINT32_MAX};
  RawSlot* s = SlotOf(c, i);
  s->answer_bytes.store(a.answer_bytes < 5 ? sizes[a.answer_bytes] : a.any_bytes,
                        std::memory_order_relaxed);
  s->code.store(a.code, std::memory_order_relaxed);
  s->flags.store(a.flags | (a.busy ? SharedChannel::kServerBusy : 0), std::memory_order_relaxed);
  s->state.store(kAnswered, std::memory_order_release);
  RingWorker(c);
}

// The answer an honest server gives `asked`, its header and payload apart: every table and
// block asked for, values 0.25 (float32) or zero bytes (16-bit).
struct Answer {
  PushPullResponse header;
  std::string payload;
  std::string Frame() const { return common::RawFrameBytes(header.SerializeAsString(), payload); }
};
Answer Honest(const PushPullRequest& asked, const common::Partitioner& partitioner) {
  Answer a;
  if (asked.has_push()) a.header.mutable_push()->set_server_incarnation(1);
  if (asked.pull_size() == 0 && asked.has_push()) return a;
  PullResponse* pull = a.header.mutable_pull();
  pull->set_server_incarnation(1);
  for (const TablePullRequest& t : asked.pull()) {
    TableValues* v = pull->add_tables();
    v->set_table(t.table());
    v->set_encoding(t.encoding());
    const common::TableInfo* info = partitioner.FindTable(t.table());
    const size_t bpv =
        common::IsKnownEncoding(t.encoding()) ? common::BytesPerValue(t.encoding()) : 4;
    uint64_t bytes = 0;
    for (uint32_t id : t.block_ids()) {
      uint64_t n = 0;
      if (info != nullptr && id < info->num_blocks) {
        auto [begin, end] = partitioner.BlockRange(*info, id);
        n = (end - begin) * bpv;
      }
      DenseBlock* b = v->add_blocks();
      b->set_block_id(id);
      b->set_payload_bytes(n);
      bytes += n;
    }
    const uint64_t rows = info != nullptr ? t.keys_size() * uint64_t{info->dim} * bpv : 0;
    v->set_rows_bytes(rows);
    bytes += rows;
    const size_t end = a.payload.size() + bytes;
    const float quarter = 0.25f;
    for (uint64_t i = 0; bpv == sizeof(quarter) && i + sizeof(quarter) <= bytes; i += bpv) {
      a.payload.append(reinterpret_cast<const char*>(&quarter), sizeof(quarter));
    }
    a.payload.resize(end, '\0');
  }
  return a;
}

grpc::ByteBuffer OneSlice(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

void CheckChannelLayout() {
  auto made = common::SharedMemory::Create(SharedChannel::kMinSegmentBytes);
  if (!made.ok()) Fail("no shared memory for the fuzzer", made.status());
  SharedChannel c(*made, *SharedChannel::OffsetFor((*made)->size()));
  const uint32_t bell = BellsOf(c)->worker.load();
  c.WriteAnswer(1, absl::NotFoundError("abc"), nullptr, /*server_busy=*/true);
  c.PostBytes(2, "xy", 7, 9);
  c.Close();
  const RawSlot* one = SlotOf(c, 1);
  const RawSlot* two = SlotOf(c, 2);
  if (one->state != kAnswered || one->answer_bytes != 3 || one->code != 5 || one->flags != 1 ||
      std::memcmp(AnswerAreaOf(c, 1), "abc", 3) != 0 || two->state != kPosted ||
      two->request_bytes != 7 || two->timeout_us != 9 || BellsOf(c)->closed != 1 ||
      BellsOf(c)->worker.load() != bell + 2 || BellsOf(c)->server.load() != c.server_bell()) {
    Fail("the fuzzer's copy of the channel's layout is out of date (shared_channel.cc)",
         absl::InternalError("layout"));
  }
}

// A segment offered and its channel, as the server made them.
struct LyingChannel::Offered {
  std::shared_ptr<common::SharedMemory> segment;
  std::unique_ptr<SharedChannel> channel;
  bool watched = false;  // its offer named the stand-in as the server process
  // The server thread's own: whether it still serves the channel, and the slots it leaves
  // posted (kIgnore).
  bool serve = true;
  bool ignored[SharedChannel::kSlots] = {};
};

// An answer to write once the worker gave its call up.
struct LyingChannel::Late {
  SharedChannel* channel;
  uint32_t slot;
  std::string frame;
  absl::Time due;
};

// Where the scribbler flips bytes: the latest answered slot and its call's room.
struct LyingChannel::Target {
  std::shared_ptr<common::SharedMemory> segment;
  SharedChannel* channel = nullptr;
  uint32_t slot = 0;
  uint64_t room = 0;
  uint64_t room_bytes = 0;
};

// A thread that stands in for the server process: the worker watches its /proc entry.
class LyingChannel::StandIn {
 public:
  StandIn()
      : thread_([this] {
          tid_ = static_cast<int>(syscall(SYS_gettid));
          started_.Notify();
          exit_.WaitForNotification();
        }) {
    started_.WaitForNotification();
  }
  ~StandIn() { Exit(); }
  int tid() const { return tid_; }
  void Exit() {
    if (!thread_.joinable()) return;
    exit_.Notify();
    thread_.join();
  }

 private:
  int tid_ = 0;
  absl::Notification started_;
  absl::Notification exit_;
  std::thread thread_;
};

LyingChannel::LyingChannel(LyingChannelOptions options, const common::Partitioner* partitioner)
    : options_(std::move(options)), partitioner_(partitioner) {
  if (options_.stand_in) {
    stand_in_ = std::make_unique<StandIn>();
    absl::MutexLock lock(&mu_);
    stand_in_tid_ = stand_in_->tid();
  }
  server_ = std::thread([this] { Serve(); });
  if (options_.ring_bells) ringer_ = std::thread([this] { RingBells(); });
  if (options_.scribble) scribbler_ = std::thread([this] { Scribble(); });
}

LyingChannel::~LyingChannel() {
  StopNoise();
  stop_ = true;
  SharedChannel::RingControl(&control_);
  server_.join();
}

void LyingChannel::StopNoise() {
  quiet_ = true;
  if (ringer_.joinable()) ringer_.join();
  if (scribbler_.joinable()) scribbler_.join();
}

grpc::ByteBuffer LyingChannel::AnswerBySocket(const PushPullRequest& asked) {
  Answer a = Honest(asked, *partitioner_);
  if (asked.want_shared_bytes() == 0) {
    return common::RawFrame(a.header.SerializeAsString(), a.payload);
  }
  auto made = common::SharedMemory::Create(kSegmentBytes);
  if (!made.ok()) Fail("no shared memory for the fuzzer", made.status());
  auto o = std::make_unique<Offered>();
  o->segment = *std::move(made);
  const uint64_t top = *SharedChannel::OffsetFor(kSegmentBytes);
  const uint64_t at = top - 64 * (options_.channel_below % (top / 64));  // 64 at the lowest
  CHECK(SharedChannel::Fits(at, kSegmentBytes));
  o->channel = std::make_unique<SharedChannel>(o->segment, at);
  SharedSegment* offer = a.header.mutable_shared_offer();
  offer->set_id(o->segment->id());
  offer->set_path(o->segment->path());
  offer->set_bytes(o->segment->size());
  offer->set_boot_id(common::SharedMemory::BootId());
  offer->set_channel_offset(at);
  absl::MutexLock lock(&mu_);
  if (stand_in_tid_ != 0) {
    // The same descriptor through the stand-in's /proc entry (a process's threads share one
    // descriptor table).
    const std::string& path = o->segment->path();
    offer->set_path(absl::StrCat("/proc/", stand_in_tid_, path.substr(path.rfind("/fd/"))));
    o->watched = true;
  }
  offered_.push_back(std::move(o));
  SharedChannel::RingControl(&control_);
  return common::RawFrame(a.header.SerializeAsString(), a.payload);
}

void LyingChannel::Serve() {
  std::vector<Offered*> serving;
  std::vector<const SharedChannel*> channels;
  std::vector<uint32_t> bells;
  while (!stop_) {
    // The control word and the bells before the slots: a post after they were read rings
    // them again, so the wait below does not sleep through it.
    const uint32_t control = control_.load();
    serving.clear();
    channels.clear();
    bells.clear();
    {
      absl::MutexLock lock(&mu_);
      for (const auto& o : offered_) {
        if (o->serve && serving.size() + 2 < common::kMaxChannelWaits) serving.push_back(o.get());
      }
    }
    for (Offered* o : serving) {
      channels.push_back(o->channel.get());
      bells.push_back(o->channel->server_bell());
    }
    bool served = false;
    for (Offered* o : serving) {
      for (uint32_t i = 0; i < SharedChannel::kSlots && o->serve; ++i) {
        if (SlotOf(*o->channel, i)->state.load(std::memory_order_acquire) != kPosted) {
          o->ignored[i] = false;
          continue;
        }
        if (o->ignored[i]) continue;
        Handle(o, i, NextAction());
        served = true;
      }
    }
    served = AnswerLate() || served;
    if (served) continue;
    absl::Time until = absl::Now() + absl::Milliseconds(5);
    for (const Late& l : late_) until = std::min(until, l.due);
    SharedChannel::WaitForRequests(channels, bells, &control_, control, until);
  }
}

Action LyingChannel::NextAction() {
  if (honest_ || next_action_ >= options_.actions.size()) return Action();
  return options_.actions[next_action_++];
}

void LyingChannel::Handle(Offered* o, uint32_t i, const Action& a) {
  SharedChannel& c = *o->channel;
  switch (a.act) {
    case kIgnore:
      o->ignored[i] = true;
      return;
    case kClose:
      c.Close();
      o->serve = false;
      return;
    case kDie:
      if (!Die()) o->ignored[i] = true;  // no stand-in: as kIgnore
      return;
    case kRaw:
      if (!a.take_first) return WriteRaw(c, i, a, a.bytes);
      break;
    case kCloseThenServe:
      c.Close();
      break;
    default:
      break;
  }
  std::optional<SharedChannel::Request> request = c.TakeRequest(i);
  if (!request.has_value()) return;
  if (!request->status.ok()) return c.WriteAnswer(i, request->status, nullptr, false);
  PushPullRequest asked;
  if (!asked.ParseFromString(common::PartsOf(request->frame).header)) {
    return c.WriteAnswer(i, absl::InvalidArgumentError("unparseable"), nullptr, false);
  }
  Answer honest = Honest(asked, *partitioner_);
  // The values in the answer's room in the segment, where they fit, as a server writes them.
  const SharedPayload& room = asked.shared();
  const bool ours = room.segment() == o->segment->id();
  if ((a.in_segment || a.act == kLie) && ours && !honest.payload.empty() &&
      honest.payload.size() <= room.answer_capacity() &&
      o->segment->Holds(room.answer_offset(), honest.payload.size())) {
    std::memcpy(o->segment->data() + room.answer_offset(), honest.payload.data(),
                honest.payload.size());
    honest.header.set_shared_answer_bytes(honest.payload.size());
    honest.payload.clear();
  }
  if (ours) Aim(o, i, room);
  std::string frame = honest.Frame();
  switch (a.act) {
    case kSilent:
      return;
    case kLate:
      late_.push_back(Late{&c, i, std::move(frame), absl::Now() + options_.deadline * 1.1});
      return;
    case kLie: {
      const uint64_t lies[] = {honest.header.shared_answer_bytes() + 1, room.answer_capacity() + 1,
                               UINT64_MAX, a.value >> 2};
      honest.header.set_shared_answer_bytes(lies[a.value & 3]);
      if (a.flip & 1) honest.payload.assign(16, '\0');
      frame = honest.Frame();
      break;
    }
    case kGarbage:
      frame = a.bytes;
      break;
    case kCut:
      if (a.flip == 0) {
        frame.resize(a.value % (frame.size() + 1));
      } else {
        frame[a.value % frame.size()] ^= static_cast<char>(a.flip);
      }
      break;
    case kTooLarge:
      frame.resize(SharedChannel::kAnswerBytes + a.value, '\0');
      break;
    case kStatus:
      return c.WriteAnswer(i, absl::Status(static_cast<absl::StatusCode>(a.code), a.bytes), nullptr,
                           a.busy);
    case kRaw:
      return WriteRaw(c, i, a, a.honest_area ? frame : a.bytes);
    case kSwap:
      std::swap(frame, last_frame_);
      if (frame.empty()) frame = last_frame_;  // none before: its own
      break;
    default:
      break;
  }
  if (a.act != kSwap) last_frame_ = honest.Frame();
  const grpc::ByteBuffer answer = OneSlice(frame);
  c.WriteAnswer(i, absl::OkStatus(), &answer, a.busy);
}

bool LyingChannel::Die() {
  {
    absl::MutexLock lock(&mu_);
    if (stand_in_tid_ == 0) return false;
    stand_in_tid_ = 0;
    for (const auto& o : offered_) o->serve = o->serve && !o->watched;
  }
  stand_in_->Exit();
  return true;
}

bool LyingChannel::AnswerLate() {
  const absl::Time now = absl::Now();
  bool any = false;
  for (size_t k = 0; k < late_.size();) {
    if (late_[k].due > now) {
      ++k;
      continue;
    }
    const grpc::ByteBuffer frame = OneSlice(late_[k].frame);
    late_[k].channel->WriteAnswer(late_[k].slot, absl::OkStatus(), &frame, false);
    late_.erase(late_.begin() + k);
    any = true;
  }
  return any;
}

void LyingChannel::Aim(const Offered* o, uint32_t i, const SharedPayload& room) {
  const bool held = o->segment->Holds(room.answer_offset(), room.answer_capacity());
  absl::MutexLock lock(&mu_);
  target_ = std::make_unique<Target>(
      Target{o->segment, o->channel.get(), i, held ? room.answer_offset() : 0,
             held ? std::min<uint64_t>(room.answer_capacity(), 4096) : 0});
}

void LyingChannel::RingBells() {
  std::vector<const SharedChannel*> channels;
  while (!quiet_) {
    channels.clear();
    {
      absl::MutexLock lock(&mu_);
      for (const auto& o : offered_) channels.push_back(o->channel.get());
    }
    for (const SharedChannel* c : channels) RingWorker(*c);
    std::this_thread::yield();
  }
}

// XORs the pattern in, again and again: each byte is its answer's or flipped, whichever the
// worker happens to read.
void LyingChannel::Scribble() {
  const std::string& p = options_.pattern;
  while (!quiet_) {
    Target t;
    {
      absl::MutexLock lock(&mu_);
      if (target_ != nullptr) t = *target_;
    }
    if (t.segment != nullptr) {
      char* area = AnswerAreaOf(*t.channel, t.slot);
      for (size_t k = 0; k < 512; ++k) area[k] ^= p[k % p.size()];
      char* room = t.segment->data() + t.room;
      for (size_t k = 0; k < t.room_bytes; ++k) room[k] ^= p[k % p.size()];
      if (options_.scribble_fields) {
        RawSlot* s = SlotOf(*t.channel, t.slot);
        s->answer_bytes.fetch_xor(uint32_t{static_cast<uint8_t>(p[0])} << 16 | 1);
        s->code.fetch_xor(static_cast<uint8_t>(p.back()) & 31);
        s->flags.fetch_xor(1);
      }
    }
    std::this_thread::yield();
  }
}

}  // namespace ps::fuzz
