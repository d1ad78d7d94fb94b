// libFuzzer target: the worker's side of the data path. GrpcParameterStore's pulls, pushes and
// fused calls against a server that may lie: an in-process gRPC server (no sockets) answers
// each PushPull frame with what the input says.
//
// Input: byte 0 picks the call and the kind of answer, the rest is their data
// (FuzzedDataProvider).
//   - The call (byte 0 % 3): a pull, a push, or both in one call, of two dense tables (float32
//     and fp16 on the wire) and two sparse ones (float32 and bf16), with keys drawn from the
//     input (duplicates too), into buffers of exactly the asked-for sizes (AddressSanitizer
//     reports a write past one).
//   - The answer (byte 0 / 3 % 3): raw bytes (cut into slices of a drawn size); or an answer
//     built from the request frame, each field mostly what an honest server sends and
//     sometimes not (other tables or encodings, blocks the worker did not ask for, payload
//     lengths and bytes that do not add up, an answer said to lie in shared memory in a size
//     of its own, a missing push answer); or a gRPC status.
//   - The store (byte 0 / 9 % 2): one that asks for no shared memory, or a new one that asks
//     for a segment: the server offers one it made (or an offer with another id, size, path,
//     host or channel, or none) and writes answers that fit the call's room there.
// Invariants (a violation aborts, which libFuzzer reports as a crash):
//   - the call returns a status (no crash, CHECK failure, sanitizer report or hang), within
//     its deadline and retries;
//   - an answer the worker refuses leaves its calls usable: the next honest answer is taken.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/codec.h"
#include "common/config/config.h"
#include "common/parameter_store.h"
#include "common/partitioner.h"
#include "common/rpc/frame.h"
#include "common/rpc/frame_testing.h"
#include "common/rpc/shared_memory.h"
#include "fuzz/fuzz_env.h"
#include "fuzz/requests.h"
#include "fuzz/rpc/store_buffers.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.grpc.pb.h"
#include "worker/rpc/grpc_store.h"

namespace ps::fuzz {
namespace {

enum AnswerKind { kRaw = 0, kBuilt = 1, kStatus = 2 };

// What the server answers the next frames with: set by the fuzzer thread before a call, read
// by the server's handler while the call runs (the call blocks the fuzzer thread).
struct Script {
  AnswerKind kind = kBuilt;
  FuzzedDataProvider* in = nullptr;  // null: answer honestly
};

// Answers a pull honestly or as the script says.
class LyingServer final
    : public ParameterServer::WithRawCallbackMethod_PushPull<ParameterServer::CallbackService> {
 public:
  explicit LyingServer(const common::Partitioner* partitioner) : partitioner_(partitioner) {}

  void SetScript(Script script) {
    absl::MutexLock lock(&mu_);
    script_ = script;
  }

  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    FuzzedDataProvider* in = script_.in;
    if (in != nullptr && script_.kind == kStatus) {
      const int code = in->ConsumeIntegralInRange(1, 16);
      reactor->Finish(grpc::Status(static_cast<grpc::StatusCode>(code), "scripted"));
      return reactor;
    }
    if (in != nullptr && script_.kind == kRaw) {
      const size_t cut = in->ConsumeIntegralInRange<size_t>(1, 256);
      const std::string bytes = in->ConsumeRandomLengthString(4096);
      std::vector<grpc::Slice> slices;
      for (size_t at = 0; at < bytes.size(); at += cut) slices.emplace_back(bytes.substr(at, cut));
      *response = grpc::ByteBuffer(slices.data(), slices.size());
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }
    PushPullRequest asked;
    if (!asked.ParseFromString(common::PartsOf(*request).header)) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "the worker sent no frame"));
      return reactor;
    }
    *response = Build(asked, in);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  // A drawn lie now and then (1 in 8), when there is an input.
  static bool Lie(FuzzedDataProvider* in) {
    return in != nullptr && in->ConsumeIntegralInRange(0, 7) == 7;
  }

  uint64_t Bytes(FuzzedDataProvider* in, uint64_t honest) const {
    if (!Lie(in)) return honest;
    switch (in->ConsumeIntegralInRange(0, 3)) {
      case 0:
        return honest + 1;
      case 1:
        return honest > 0 ? honest - 1 : 0;
      case 2:
        return 0;
      default:
        return in->ConsumeIntegral<uint64_t>();
    }
  }

  // The answer an honest server gives `asked`, with lies drawn from `in`.
  grpc::ByteBuffer Build(const PushPullRequest& asked, FuzzedDataProvider* in)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    PushPullResponse answer;
    if (asked.has_push() && !Lie(in)) {
      answer.mutable_push()->set_duplicate(in != nullptr && in->ConsumeIntegralInRange(0, 15) == 0);
      answer.mutable_push()->set_server_incarnation(1);
    }
    std::string payload;
    const bool pulls = asked.pull_size() > 0 || !asked.has_push();
    if (pulls) {
      PullResponse* pull = answer.mutable_pull();
      pull->set_server_incarnation(Lie(in) ? in->ConsumeIntegral<uint64_t>() : 1);
      for (const TablePullRequest& t : asked.pull()) {
        if (Lie(in)) continue;  // a table left out
        TableValues* v = pull->add_tables();
        v->set_table(Lie(in) ? Pick(*in, std::vector<std::string>{"w", "h", "emb", "e16", "x"})
                             : t.table());
        v->set_encoding(Lie(in) ? PickEncoding(*in) : t.encoding());
        const common::TableInfo* info = partitioner_->FindTable(t.table());
        const size_t bpv =
            common::IsKnownEncoding(t.encoding()) ? common::BytesPerValue(t.encoding()) : 4;
        for (uint32_t id : t.block_ids()) {
          DenseBlock* b = v->add_blocks();
          b->set_block_id(Lie(in) ? in->ConsumeIntegral<uint32_t>() : id);
          uint64_t honest = 0;
          if (info != nullptr && id < info->num_blocks) {
            auto [begin, end] = partitioner_->BlockRange(*info, id);
            honest = (end - begin) * bpv;
          }
          b->set_payload_bytes(Bytes(in, honest));
        }
        if (Lie(in)) v->add_blocks()->set_block_id(0);  // a block not asked for
        const uint64_t rows = info != nullptr ? t.keys_size() * uint64_t{info->dim} * bpv : 0;
        v->set_rows_bytes(Bytes(in, rows));
        if (Lie(in)) v->add_keys(in->ConsumeIntegral<uint64_t>());
      }
      if (Lie(in)) pull->add_tables()->set_table("w");  // a table not asked for
      if (Lie(in)) answer.set_shared_answer_bytes(in->ConsumeIntegral<uint64_t>());
    }
    // The payload: as long as the header says (capped), values from the input or 0.25s.
    uint64_t total = 0;
    for (const TableValues& v : answer.pull().tables()) {
      for (const DenseBlock& b : v.blocks()) total += b.payload_bytes();
      total += v.rows_bytes();
    }
    total = std::min<uint64_t>(Bytes(in, total), 1 << 16);
    if (in != nullptr && in->ConsumeBool()) {
      payload = in->ConsumeBytesAsString(total);
      payload.resize(total, '\0');
    } else {
      const float quarter = 0.25f;
      for (uint64_t i = 0; i + sizeof(quarter) <= total; i += sizeof(quarter)) {
        payload.append(reinterpret_cast<const char*>(&quarter), sizeof(quarter));
      }
      payload.resize(total, '\0');
    }
    Share(asked, in, &answer, &payload);
    common::FrameBuilder frame(answer);
    frame.AddSlice(grpc::Slice(payload));
    return frame.Build();
  }

  // Shared memory, as a server on the worker's host: a worker that asks is offered a segment
  // (made here), and an answer that fits the room its call gave is written there. Lies: an
  // offer of another id, size, path, host or channel; no offer; an answer said to lie there
  // in a size of its own.
  void Share(const PushPullRequest& asked, FuzzedDataProvider* in, PushPullResponse* answer,
             std::string* payload) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (asked.want_shared_bytes() > 0 && !Lie(in)) {
      auto made = common::SharedMemory::Create(
          std::min<uint64_t>(asked.want_shared_bytes(), kMaxSegmentBytes));
      if (!made.ok()) Fail("no shared memory for the fuzzer", made.status());
      segment_ = *std::move(made);
      SharedSegment* offer = answer->mutable_shared_offer();
      offer->set_id(segment_->id());
      offer->set_path(segment_->path());
      offer->set_bytes(segment_->size());
      offer->set_boot_id(common::SharedMemory::BootId());
      if (Lie(in)) {
        switch (in->ConsumeIntegralInRange(0, 4)) {
          case 0:
            offer->set_id(offer->id() + 1);
            break;
          case 1:
            offer->set_bytes(in->ConsumeIntegral<uint64_t>());
            break;
          case 2:
            offer->set_path(Pick(*in, std::vector<std::string>{"/proc/self/fd/0", "/dev/zero",
                                                               "/etc/hostname", ""}));
            break;
          case 3:
            offer->set_boot_id("another host");
            break;
          default:
            offer->set_channel_offset(in->ConsumeIntegral<uint64_t>());
            break;
        }
      }
    }
    const SharedPayload& room = asked.shared();
    if (segment_ != nullptr && room.segment() == segment_->id() &&
        answer->shared_answer_bytes() == 0 && !payload->empty() &&
        payload->size() <= room.answer_capacity() &&
        segment_->Holds(room.answer_offset(), payload->size()) && !Lie(in)) {
      std::memcpy(segment_->data() + room.answer_offset(), payload->data(), payload->size());
      answer->set_shared_answer_bytes(payload->size());
      payload->clear();
    }
  }

  // Segments offered here are at most this large (no channel: SharedChannel::kMinSegmentBytes;
  // channel_answer_fuzzer lies through one).
  static constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 20;

  const common::Partitioner* const partitioner_;
  absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<common::SharedMemory> segment_ ABSL_GUARDED_BY(mu_);
};

struct World {
  // A store that asks for no shared memory (the one of every input), and one that asks for a
  // segment of 1 MB (made again for each input that uses it: once refused, a store never asks
  // again). Every store of the second kind talks over one in-process channel: gRPC's server
  // keeps the transport of each in-process channel made until it shuts down (2 KB and more
  // each), and a channel per store made the fuzzer's memory grow about 4 KB per input
  // (docs/reliability.md).
  worker::GrpcParameterStore* Store(bool shared) {
    return shared ? shared_store.get() : store.get();
  }
  std::unique_ptr<worker::GrpcParameterStore> NewSharedStore() {
    worker::GrpcStoreOptions o = options;
    o.shared_memory_bytes = size_t{1} << 20;
    auto made = worker::GrpcParameterStore::CreateWithChannels(config, o, {shared_channel});
    CHECK(made.ok()) << made.status();
    return *std::move(made);
  }

  JobConfig config;
  worker::GrpcStoreOptions options;
  std::unique_ptr<worker::GrpcParameterStore> shared_store;
  std::unique_ptr<common::Partitioner> partitioner;
  std::unique_ptr<LyingServer> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<worker::GrpcParameterStore> store;
  std::shared_ptr<grpc::Channel> shared_channel;  // of the stores that ask for shared memory
};

World& GetWorld() {
  static World* world = [] {
    auto* w = new World;
    auto parsed = common::ParseJobConfigText(StoreJobText({"in-process"}), "answer_fuzzer");
    CHECK(parsed.ok()) << parsed.status();
    w->config = *std::move(parsed);
    CHECK(common::ExpandModelTables(&w->config).ok());
    auto partitioner = common::Partitioner::Create(w->config);
    CHECK(partitioner.ok()) << partitioner.status();
    w->partitioner = std::make_unique<common::Partitioner>(*std::move(partitioner));
    w->service = std::make_unique<LyingServer>(w->partitioner.get());
    grpc::ServerBuilder builder;
    builder.RegisterService(w->service.get());
    w->server = builder.BuildAndStart();
    CHECK(w->server != nullptr);
    worker::GrpcStoreOptions& options = w->options;
    options.deadline = absl::Seconds(5);
    options.max_retries = 2;
    options.initial_backoff = absl::Microseconds(10);
    options.max_backoff = absl::Microseconds(10);
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    channels.push_back(w->server->InProcessChannel(grpc::ChannelArguments()));
    auto store =
        worker::GrpcParameterStore::CreateWithChannels(w->config, options, std::move(channels));
    CHECK(store.ok()) << store.status();
    w->store = *std::move(store);
    w->shared_channel = w->server->InProcessChannel(grpc::ChannelArguments());
    return w;
  }();
  return *world;
}

std::vector<uint64_t> Keys(FuzzedDataProvider& in) {
  std::vector<uint64_t> keys(in.ConsumeIntegralInRange(0, 6));
  for (uint64_t& k : keys) k = in.ConsumeIntegralInRange<uint64_t>(0, 9);  // repeats likely
  return keys;
}

// The buffers of one call, its keys drawn from `in` (emb's first).
StoreBuffers BuffersOf(FuzzedDataProvider& in) {
  std::vector<uint64_t> emb = Keys(in);
  std::vector<uint64_t> e16 = Keys(in);
  return StoreBuffers(std::move(emb), std::move(e16));
}

absl::Status Call(worker::GrpcParameterStore& store, int call, StoreBuffers& buffers,
                  int64_t clock) {
  switch (call) {
    case 0:
      return store.Pull(buffers.Pull(), common::PullOptions{clock});
    case 1:
      return store.Push(buffers.Push(), common::PushOptions{clock, false});
    default:
      return store.PushPull(buffers.Push(), common::PushOptions{clock, false}, buffers.Pull(),
                            common::PullOptions{clock});
  }
}

}  // namespace
}  // namespace ps::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Seeds: each call with each kind of answer, by each store, the rest of the input a fixed
  // pattern.
  std::vector<std::pair<std::string, std::string>> seeds;
  for (int first = 0; first < 18; ++first) {
    std::string body(1, static_cast<char>(first));
    for (int j = 0; j < 96; ++j) body.push_back(static_cast<char>((j * 53 + first * 29) & 0xff));
    seeds.emplace_back("call" + std::to_string(first % 3) + "_answer" +
                           std::to_string(first / 3 % 3) + (first >= 9 ? "_shared" : ""),
                       body);
  }
  ps::fuzz::InitializeFuzzer(seeds);
  ps::fuzz::GetWorld();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ps::fuzz;
  if (size < 1) return 0;
  static int64_t clock = 0;
  const int call = data[0] % 3;
  const auto kind = static_cast<AnswerKind>(data[0] / 3 % 3);
  const bool shared = data[0] / 9 % 2 == 1;
  FuzzedDataProvider in(data + 1, size - 1);
  World& world = GetWorld();
  {
    StoreBuffers buffers = BuffersOf(in);
    if (shared) world.shared_store = world.NewSharedStore();
    world.service->SetScript(Script{kind, &in});
    Call(*world.Store(shared), call, buffers, ++clock).IgnoreError();
  }
  // The same store takes an honest answer next: a refused answer left nothing behind.
  StoreBuffers honest = BuffersOf(in);
  world.service->SetScript(Script{kBuilt, nullptr});
  const absl::Status status = Call(*world.Store(shared), call, honest, ++clock);
  if (!status.ok()) Fail("an honest answer after a lie was refused", status);
  return 0;
}
