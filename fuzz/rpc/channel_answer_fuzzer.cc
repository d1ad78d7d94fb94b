// libFuzzer target: the worker's side of a shared-memory channel (common/rpc/shared_channel.h).
// GrpcParameterStore's calls against a server on its host that lies through the channel of the
// segment it offers (fuzz/rpc/lying_channel.h): the answers it writes into the slots, the slot
// fields themselves, the bells, and the segment while the worker reads it.
//
// Each input makes a new store that asks for a segment. Its first call asks by the socket (an
// in-process gRPC server, no sockets), which offers an 8 MiB segment, large enough for a
// channel (SharedChannel::kMinSegmentBytes), the channel where OffsetFor puts it or lower. The
// next calls are posted in that channel (or in the next segment's, once a failure gave one up),
// and a thread acting as the server serves each posted slot as the input's next Action says:
// honest; a frame that says its values lie in the segment in a size of its own; raw bytes; an
// honest frame cut short or with a byte flipped; one too large for the slot (ABORTED: the
// worker sends the call again by the socket at once); another call's answer; a status of any
// code 1..16 and message, busy or not (RESOURCE_EXHAUSTED and busy: retried); raw slot fields
// (state kAnswered with answer_bytes above kAnswerBytes, codes outside 0..16, any flags),
// before or after taking the request; the channel closed before or after taking it
// (Unserved); the request taken and never answered, or never taken; answered after the
// worker's deadline; the server process gone (ServerGone).
//
// Input: read front to back, a byte at a time (past the end every field reads 0):
//   byte 0: bit 0 two servers (two segments, two channels waited on at once), bits 1-2 the
//     deadline of an attempt (kDeadlines), bits 3-4 retries (0..2), bit 5 pulls in pieces
//     (up to 8 frames, so slots, at once), bit 6 offers name a stand-in thread as the server
//     process, bit 7 a thread rings the worker's bells without end;
//   byte 1: bit 0 a scribbler (flips bytes of the latest answer in its slot and its room in
//     the segment while the worker copies it out), bit 1 it flips the slot's answer fields
//     too, bits 2-3 the calls after the first (1..4);
//   byte 2: 0 the channel where OffsetFor puts it, else 4 more bytes say how far below;
//   with a scribbler: 8 bytes it XORs in;
//   per call: its kind (pull, push, both), then the keys of the two sparse tables (a count,
//     then the keys);
//   then actions until the input ends (ParseAction), taken in the order the server thread
//   finds posted slots; past them it answers honestly.
// Invariants (a violation aborts, which libFuzzer reports as a crash):
//   - every call returns a status (no crash, CHECK failure, sanitizer report or hang) within
//     (retries + 2) deadlines (a frame's attempt through the channel, which may be sent again
//     at once by the socket, then its retries by the socket) and 3 s for a loaded machine;
//   - afterwards, served honestly, a call of the same store ends OK, or with DEADLINE_EXCEEDED
//     or UNAVAILABLE (a slow machine, or a stand-in gone, with no retries left).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config/config.h"
#include "common/parameter_store.h"
#include "common/partitioner.h"
#include "common/rpc/frame_testing.h"
#include "fuzz/fuzz_env.h"
#include "fuzz/rpc/lying_channel.h"
#include "fuzz/rpc/store_buffers.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.grpc.pb.h"
#include "worker/rpc/grpc_store.h"

namespace ps::fuzz {
namespace {

// Short deadlines keep an input to milliseconds: a slot never answered costs one. The longest
// is past the worker's 50 ms between looks at the server process (ServerGone), and is taken
// only with a stand-in to look at: an input with it costs 50 ms or more.
constexpr absl::Duration kDeadlines[] = {absl::Milliseconds(4), absl::Milliseconds(8),
                                         absl::Milliseconds(16), absl::Milliseconds(60)};
constexpr size_t kMaxActions = 32;

// Reads the input front to back; past its end every field reads 0, so that seeds are easy to
// write by hand and a cut input is still one.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{Byte()} << (8 * i);
    return v;
  }
  uint64_t U64() { return U32() | uint64_t{U32()} << 32; }
  std::string Bytes(size_t n) {
    n = std::min(n, size_ - std::min(at_, size_));
    std::string s(reinterpret_cast<const char*>(data_ + at_), n);
    at_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

struct CallPlan {
  int kind = 0;  // pull, push, both
  std::vector<uint64_t> emb_keys;
  std::vector<uint64_t> e16_keys;
};

struct Plan {
  bool two_servers = false;
  absl::Duration deadline;
  uint32_t max_retries = 0;
  bool pieces = false;
  LyingChannelOptions server;
  std::vector<CallPlan> calls;
};

std::vector<uint64_t> Keys(Reader& in) {
  std::vector<uint64_t> keys(in.Byte() % 7);
  for (uint64_t& k : keys) k = in.Byte() % 10;  // repeats likely
  return keys;
}

Action ParseAction(Reader& in) {
  Action a;
  a.act = static_cast<Act>(in.Byte() % kActs);
  const uint8_t f = in.Byte();
  a.busy = f & 1;
  a.in_segment = f & 2;
  a.take_first = f & 4;
  a.honest_area = f & 8;
  switch (a.act) {
    case kLie:
    case kCut:
      a.value = in.U64();
      a.flip = in.Byte();
      break;
    case kTooLarge:
      a.value = 1 + in.Byte() * 16;
      break;
    case kGarbage:
      a.bytes = in.Bytes(in.Byte() * 4);
      break;
    case kStatus:
      a.code = 1 + in.Byte() % 16;
      a.bytes = in.Bytes(in.Byte());
      break;
    case kRaw: {
      a.answer_bytes = in.Byte();
      a.any_bytes = in.U32();
      const uint8_t code = in.Byte();
      const int32_t codes[] = {0, 1, 8, 10, 16, 17, -1, INT32_MIN, INT32_MAX};
      a.code = code < 9 ? codes[code] : static_cast<int32_t>(in.U32());
      a.flags = in.Byte() & 1 ? in.U32() : 0;
      a.bytes = in.Bytes(in.Byte() * 2);
      break;
    }
    default:
      break;
  }
  return a;
}

Plan ParsePlan(Reader& in) {
  Plan p;
  const uint8_t g = in.Byte();
  p.two_servers = g & 1;
  p.max_retries = ((g >> 3) & 3) % 3;
  p.pieces = g & 0x20;
  p.server.stand_in = g & 0x40;
  p.server.ring_bells = g & 0x80;
  const int d = (g >> 1) & 3;
  p.deadline = kDeadlines[d == 3 && !p.server.stand_in ? 0 : d];
  p.server.deadline = p.deadline;
  const uint8_t h = in.Byte();
  p.server.scribble = h & 1;
  p.server.scribble_fields = h & 2;
  const int calls = 2 + ((h >> 2) & 3);
  if (in.Byte() != 0) p.server.channel_below = in.U32();
  if (p.server.scribble) {
    p.server.pattern = in.Bytes(8);
    if (p.server.pattern.empty()) p.server.pattern = "\x01";
  }
  for (int i = 0; i < calls; ++i) {
    CallPlan c;
    c.kind = in.Byte() % 3;
    c.emb_keys = Keys(in);
    c.e16_keys = Keys(in);
    p.calls.push_back(std::move(c));
  }
  while (!in.empty() && p.server.actions.size() < kMaxActions) {
    p.server.actions.push_back(ParseAction(in));
  }
  return p;
}

// The in-process gRPC server every input's store asks by: it hands each frame to the input's
// LyingChannel.
class SocketServer final
    : public ParameterServer::WithRawCallbackMethod_PushPull<ParameterServer::CallbackService> {
 public:
  void SetServer(LyingChannel* server) {
    absl::MutexLock lock(&mu_);
    server_ = server;
  }

  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    PushPullRequest asked;
    if (!asked.ParseFromString(common::PartsOf(*request).header)) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "the worker sent no frame"));
      return reactor;
    }
    // Under the lock: an input's server goes only after SetServer(nullptr), so a call that
    // comes after its input ended never reaches it.
    absl::MutexLock lock(&mu_);
    if (server_ == nullptr) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "between inputs"));
      return reactor;
    }
    *response = server_->AnswerBySocket(asked);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  absl::Mutex mu_;
  LyingChannel* server_ ABSL_GUARDED_BY(mu_) = nullptr;
};

struct World {
  JobConfig configs[2];  // one server, two
  std::unique_ptr<common::Partitioner> partitioners[2];
  std::unique_ptr<SocketServer> service;
  std::unique_ptr<grpc::Server> server;
  // One in-process channel for every store: gRPC's server keeps the transport of each one
  // made until it shuts down (answer_fuzzer.cc).
  std::shared_ptr<grpc::Channel> channel;
};

World& GetWorld() {
  static World* world = [] {
    auto* w = new World;
    const std::string texts[] = {StoreJobText({"a"}), StoreJobText({"a", "b"})};
    for (int k = 0; k < 2; ++k) {
      auto parsed = common::ParseJobConfigText(texts[k], "channel_answer_fuzzer");
      CHECK(parsed.ok()) << parsed.status();
      w->configs[k] = *std::move(parsed);
      CHECK(common::ExpandModelTables(&w->configs[k]).ok());
      auto partitioner = common::Partitioner::Create(w->configs[k]);
      CHECK(partitioner.ok()) << partitioner.status();
      w->partitioners[k] = std::make_unique<common::Partitioner>(*std::move(partitioner));
    }
    w->service = std::make_unique<SocketServer>();
    grpc::ServerBuilder builder;
    builder.RegisterService(w->service.get());
    w->server = builder.BuildAndStart();
    CHECK(w->server != nullptr);
    w->channel = w->server->InProcessChannel(grpc::ChannelArguments());
    return w;
  }();
  return *world;
}

std::unique_ptr<worker::GrpcParameterStore> NewStore(const Plan& plan) {
  World& world = GetWorld();
  worker::GrpcStoreOptions o;
  o.deadline = plan.deadline;
  o.max_retries = plan.max_retries;
  o.initial_backoff = absl::Microseconds(10);
  o.max_backoff = absl::Microseconds(10);
  o.shared_memory_bytes = size_t{8} << 20;    // what the server offers
  o.pull_piece_bytes = plan.pieces ? 16 : 0;  // "w" in up to 6 pieces, with "h" 8
  std::vector<std::shared_ptr<grpc::Channel>> channels(plan.two_servers ? 2 : 1, world.channel);
  auto made = worker::GrpcParameterStore::CreateWithChannels(world.configs[plan.two_servers], o,
                                                             std::move(channels));
  CHECK(made.ok()) << made.status();
  return *std::move(made);
}

// Runs call `c` and fails unless it ends within its attempts' deadlines.
absl::Status TimedCall(worker::GrpcParameterStore& store, const Plan& plan, const CallPlan& c,
                       int64_t clock) {
  StoreBuffers b(c.emb_keys, c.e16_keys);
  const absl::Time start = absl::Now();
  absl::Status status;
  switch (c.kind) {
    case 0:
      status = store.Pull(b.Pull(), common::PullOptions{clock});
      break;
    case 1:
      status = store.Push(b.Push(), common::PushOptions{clock, false});
      break;
    default:
      status = store.PushPull(b.Push(), common::PushOptions{clock, false}, b.Pull(),
                              common::PullOptions{clock});
  }
  const absl::Duration took = absl::Now() - start;
  const absl::Duration bound = (plan.max_retries + 2) * plan.deadline + absl::Seconds(3);
  if (took > bound) {
    Fail(absl::StrCat("a call took ", absl::FormatDuration(took), ", past ",
                      absl::FormatDuration(bound))
             .c_str(),
         status);
  }
  return status;
}

// Seeds: each action after an honest answer, and the input's switches one at a time.
std::vector<std::pair<std::string, std::string>> Seeds() {
  // The calls cycle through a pull, a fused call and a push, each with a few keys.
  const std::string calls[] = {std::string("\x00\x02\x01\x02\x01\x05", 6),
                               std::string("\x02\x03\x04\x04\x06\x01\x07", 7),
                               std::string("\x01\x01\x03\x00", 4)};
  auto input = [&](uint8_t g, uint8_t h, const std::string& actions) {
    std::string s = {static_cast<char>(g), static_cast<char>(h), '\0'};
    if (h & 1) s += std::string("\x01\x00\x80\x00\x00\x00\x00\x02", 8);
    for (int i = 0; i < 2 + ((h >> 2) & 3); ++i) s += calls[i % 3];
    return s + actions;
  };
  const uint8_t g = 2 | 8;                  // 8 ms deadlines, one retry
  const uint8_t h = 4;                      // two calls after the ask
  const std::string honest("\x00\x02", 2);  // the values in the segment
  std::vector<std::pair<std::string, std::string>> seeds;
  for (int act = 0; act < kActs; ++act) {
    std::string a = {static_cast<char>(act), '\x02'};
    a += std::string(16, '\0');  // its parameters, zero (then honest answers)
    seeds.emplace_back("act" + std::to_string(act), input(g, h, honest + a));
  }
  seeds.emplace_back("busy", input(g, h, honest + std::string("\x05\x01\x07\x04", 4) + "busy"));
  seeds.emplace_back("raw_code_17",
                     input(g, h, honest + std::string("\x06\x04\x03\0\0\0\0\x05\0\0", 10)));
  seeds.emplace_back(
      "raw_before_taking",
      input(g, h, std::string("\x06\x00\x04\0\0\0\0\0\0\x10", 10) + std::string(32, 'x')));
  seeds.emplace_back("two_servers_in_pieces", input(g | 1 | 0x20, h, honest + honest + honest));
  seeds.emplace_back("server_gone", input(6 | 0x40, h, honest + std::string("\x0d\0", 2)));
  seeds.emplace_back("bells", input(g | 0x80, h, honest + honest));
  seeds.emplace_back("scribbler", input(g, h | 1 | 2, honest + honest + honest));
  std::string low = input(g, h, honest + honest);
  low.replace(2, 1, std::string("\x01\x10\0\0\0", 5));  // the channel 16 lines lower
  seeds.emplace_back("channel_lower", low);
  return seeds;
}

}  // namespace
}  // namespace ps::fuzz

// LeakSanitizer (clang 14) can catch gRPC's timer manager starting or collecting a timer thread
// ("grpc_global_timer": 40 bytes from gpr_malloc holding a grpc_core::Thread, 40 more from its
// constructor), which it reported once in 25,000 inputs here: this fuzzer's retries set alarms
// and its short deadlines fire, and a timer that fires with one timer thread waiting starts
// another. What this project's code allocates and leaks is still reported (its stack names
// that code); what gRPC allocates on its behalf, with stacks that end in gpr_malloc, is not.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:grpc_core::Thread::Thread\nleak:gpr_malloc\n";
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // -use_counters=0 unless the command line says otherwise (it comes later): the threads of
  // an input (the worker polling its channels, the server thread, the noise) run loops a
  // number of times that depends on timing, so hit counts are noise here. With them, the
  // "features" grew to four times the edges in 30 s, libFuzzer's entropic schedule spent two
  // thirds of the time ranking them, and it ran 65-90 inputs a second instead of 110-180.
  static std::vector<char*> args;
  static char no_counters[] = "-use_counters=0";
  args.assign(*argv, *argv + *argc);
  args.insert(args.begin() + 1, no_counters);
  args.push_back(nullptr);
  *argc = static_cast<int>(args.size()) - 1;
  *argv = args.data();
  ps::fuzz::InitializeFuzzer(ps::fuzz::Seeds());
  ps::fuzz::CheckChannelLayout();
  ps::fuzz::GetWorld();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ps::fuzz;
  Reader in(data, size);
  const Plan plan = ParsePlan(in);
  World& world = GetWorld();
  auto server =
      std::make_unique<LyingChannel>(plan.server, world.partitioners[plan.two_servers].get());
  world.service->SetServer(server.get());
  auto store = NewStore(plan);
  int64_t clock = 0;
  for (const CallPlan& c : plan.calls) {
    // Whatever the lies made of it: only that it ended, and in time (TimedCall), is checked.
    TimedCall(*store, plan, c, ++clock).IgnoreError();
  }
  // Served honestly now, the same store still works: what the lies left behind (slots and
  // segments given up, a closed channel, a server gone) holds no call up.
  server->StopNoise();
  server->BeHonest();
  const absl::Status status = TimedCall(*store, plan, CallPlan(), ++clock);
  if (!status.ok() && !absl::IsDeadlineExceeded(status) && !absl::IsUnavailable(status)) {
    Fail("an honest answer after the lies was refused", status);
  }
  store.reset();
  world.service->SetServer(nullptr);
  return 0;
}
