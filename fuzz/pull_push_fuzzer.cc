// libFuzzer target: Pull and Push requests against ParameterServerService::HandlePull /
// HandlePush (no gRPC), over the server of fuzz_env.h, fresh for every input.
//
// Input: byte 0 picks the mode, the rest is its data.
//   mode 0: the rest is a serialized PullRequest;  mode 1: a serialized PushRequest. With
//           bit 2 of byte 0 set, the header's layout fingerprint is replaced by the right
//           one, so the request gets past CheckLayout.
//   mode 2, 3: a short sequence (1..4) of pulls and pushes built field by field from the
//           bytes (FuzzedDataProvider): table names, block ids, keys, encodings, payload
//           sizes and contents, header fields and is_delta are each drawn mostly from values
//           that pass the checks, sometimes from ones that do not, so inputs reach the
//           decode, finiteness, exactly-once and apply paths.
// Invariants (a violation aborts, which libFuzzer reports as a crash):
//   - the handlers return a status (no crash, CHECK failure, sanitizer report or hang);
//   - a rejected or duplicate push changes no value, no update count and no exactly-once
//     state (fuzz::State before and after); an applied push adds exactly one update;
//   - an OK pull answers every table asked for, with payloads of the asked-for sizes.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/codec.h"
#include "fuzz/fuzz_env.h"

namespace ps::fuzz {
namespace {

void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "INVARIANT VIOLATED: %s (status: %s)\n", what, status.ToString().c_str());
  std::abort();
}

template <typename T>
T Pick(FuzzedDataProvider& in, const std::vector<T>& values) {
  return values[in.ConsumeIntegralInRange<size_t>(0, values.size() - 1)];
}

std::string TableName(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
    case 1:
    case 2:
      return "w";
    case 3:
    case 4:
    case 5:
      return "emb";
    case 6:
      return "nope";
    default:
      return in.ConsumeRandomLengthString(8);
  }
}

Encoding PickEncoding(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 8)) {
    case 6:
      return ENCODING_FP16;
    case 7:
      return ENCODING_BF16;
    case 8:
      return static_cast<Encoding>(in.ConsumeIntegral<int32_t>());
    default:
      return ENCODING_FLOAT32;
  }
}

RequestHeader PickHeader(FuzzedDataProvider& in, uint64_t* next_sequence) {
  const Layout& layout = GetLayout();
  RequestHeader h;
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0:
      h.set_worker_id(-1);
      break;
    case 1:
    case 2:
      h.set_worker_id(0);
      break;
    case 3:
      h.set_worker_id(1);
      break;
    case 4:
      h.set_worker_id(2);
      break;  // beyond num_workers
    default:
      h.set_worker_id(in.ConsumeIntegral<int32_t>());
      break;
  }
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0:
      h.set_worker_incarnation(0);
      break;
    case 1:
      h.set_worker_incarnation(2);
      break;
    case 2:
      h.set_worker_incarnation(in.ConsumeIntegral<uint64_t>());
      break;
    default:
      h.set_worker_incarnation(1);
      break;
  }
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0:
      h.set_sequence(0);
      break;
    case 1:
      h.set_sequence(*next_sequence > 1 ? *next_sequence - 1 : 1);
      break;  // a retry
    case 2:
      h.set_sequence(in.ConsumeIntegral<uint64_t>());
      break;
    default:
      h.set_sequence((*next_sequence)++);
      break;
  }
  switch (in.ConsumeIntegralInRange(0, 6)) {
    case 0:
      h.set_clock(in.ConsumeIntegral<int64_t>());
      break;
    case 1:
      h.set_clock(std::numeric_limits<int64_t>::min());
      break;
    case 2:
      h.set_clock(std::numeric_limits<int64_t>::max());
      break;
    case 3:
      h.set_clock(-1);
      break;
    default:
      h.set_clock(in.ConsumeIntegralInRange<int64_t>(0, 3));
      break;
  }
  h.set_layout_fingerprint(in.ConsumeIntegralInRange(0, 15) == 0 ? in.ConsumeIntegral<uint64_t>()
                                                                 : layout.fingerprint);
  if (in.ConsumeBool()) h.set_server_incarnation(in.ConsumeIntegral<uint64_t>());
  return h;
}

uint32_t PickBlock(FuzzedDataProvider& in) {
  const Layout& layout = GetLayout();
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      return Pick(in, layout.other_blocks);
    case 1:
      return layout.num_blocks;
    case 2:
      return in.ConsumeIntegral<uint32_t>();
    default:
      return Pick(in, layout.my_blocks);
  }
}

uint64_t PickKey(FuzzedDataProvider& in) {
  const Layout& layout = GetLayout();
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      return Pick(in, layout.other_keys);
    case 1:
      return in.ConsumeIntegral<uint64_t>();
    default:
      return Pick(in, layout.my_keys);
  }
}

// A payload meant to hold `n` values in `encoding`: mostly the right size, sometimes not;
// the values are one constant (finite or not) or raw bytes from the input.
std::string Payload(FuzzedDataProvider& in, size_t n, Encoding encoding) {
  const size_t bpv = common::IsKnownEncoding(encoding) ? common::BytesPerValue(encoding) : 4;
  size_t bytes = n * bpv;
  switch (in.ConsumeIntegralInRange(0, 9)) {
    case 0:
      bytes = 0;
      break;
    case 1:
      bytes += 1;
      break;
    case 2:
      bytes += bpv;
      break;
    case 3:
      bytes = bytes >= bpv ? bytes - bpv : 0;
      break;
    case 4:
      bytes = in.ConsumeIntegralInRange<size_t>(0, 4 * n * bpv + 8);
      break;
    default:
      break;
  }
  if (in.ConsumeBool() || !common::IsKnownEncoding(encoding) || bytes % bpv != 0) {
    std::string raw = in.ConsumeBytesAsString(bytes);
    raw.resize(bytes, '\0');
    return raw;
  }
  const float value = Pick(in, std::vector<float>{0.5f, -1.f, 0.f, 1e30f, -1e-40f, 65520.f,
                                                  std::numeric_limits<float>::quiet_NaN(),
                                                  std::numeric_limits<float>::infinity()});
  std::string out;
  common::EncodeFloats(std::vector<float>(bytes / bpv, value), encoding, &out);
  return out;
}

PushRequest StructuredPush(FuzzedDataProvider& in, uint64_t* next_sequence) {
  const Layout& layout = GetLayout();
  PushRequest request;
  *request.mutable_header() = PickHeader(in, next_sequence);
  request.set_is_delta(in.ConsumeIntegralInRange(0, 7) == 0);
  const int tables = in.ConsumeIntegralInRange(0, 3);
  for (int i = 0; i < tables; ++i) {
    TableValues* t = request.add_tables();
    t->set_table(TableName(in));
    t->set_encoding(PickEncoding(in));
    const bool as_dense = t->table() == "w" ? in.ConsumeIntegralInRange(0, 15) != 0
                                            : in.ConsumeIntegralInRange(0, 15) == 0;
    if (as_dense) {
      const int blocks = in.ConsumeIntegralInRange(0, 3);
      for (int b = 0; b < blocks; ++b) {
        DenseBlock* block = t->add_blocks();
        block->set_block_id(PickBlock(in));
        const size_t n =
            block->block_id() < layout.num_blocks ? layout.block_sizes[block->block_id()] : 4;
        *block->mutable_values() = Payload(in, n, t->encoding());
      }
    } else {
      const int keys = in.ConsumeIntegralInRange(0, 4);
      for (int k = 0; k < keys; ++k) t->add_keys(PickKey(in));
      *t->mutable_rows() = Payload(in, keys * layout.dim, t->encoding());
    }
  }
  return request;
}

PullRequest StructuredPull(FuzzedDataProvider& in, uint64_t* next_sequence) {
  PullRequest request;
  *request.mutable_header() = PickHeader(in, next_sequence);
  const int tables = in.ConsumeIntegralInRange(0, 3);
  for (int i = 0; i < tables; ++i) {
    TablePullRequest* t = request.add_tables();
    t->set_table(TableName(in));
    t->set_encoding(PickEncoding(in));
    const bool as_dense = t->table() == "w" ? in.ConsumeIntegralInRange(0, 15) != 0
                                            : in.ConsumeIntegralInRange(0, 15) == 0;
    const int n = in.ConsumeIntegralInRange(0, 4);
    for (int j = 0; j < n; ++j) {
      if (as_dense) {
        t->add_block_ids(PickBlock(in));
      } else {
        t->add_keys(PickKey(in));
      }
    }
  }
  return request;
}

std::vector<uint64_t> KeysOf(const PushRequest& request) {
  std::vector<uint64_t> keys;
  for (const TableValues& t : request.tables())
    keys.insert(keys.end(), t.keys().begin(), t.keys().end());
  return keys;
}

void RunPush(Server& s, const PushRequest& request) {
  const std::vector<uint64_t> keys = KeysOf(request);
  const std::string before = State(*s.shard, keys);
  const uint64_t updates_before = s.shard->updates_applied();
  PushResponse response;
  const absl::Status status = s.service->HandlePush(request, &response);
  if (status.ok() && !response.duplicate()) {
    if (s.shard->updates_applied() != updates_before + 1)
      Fail("applied push not counted once", status);
    return;
  }
  if (State(*s.shard, keys) != before) {
    Fail(status.ok() ? "a duplicate push changed the state" : "a rejected push changed the state",
         status);
  }
}

void RunPull(Server& s, const PullRequest& request) {
  PullResponse response;
  // A deadline of now: a pull the consistency bound holds back fails at once instead of
  // waiting (the bound's wait itself is covered by worker_tracker_test).
  const absl::Status status = s.service->HandlePull(request, absl::Now(), &response);
  if (!status.ok()) return;
  if (response.tables_size() != request.tables_size()) Fail("pull answered other tables", status);
  for (int i = 0; i < request.tables_size(); ++i) {
    const TablePullRequest& asked = request.tables(i);
    const TableValues& got = response.tables(i);
    const size_t bpv = common::BytesPerValue(asked.encoding());
    if (got.table() != asked.table() || got.blocks_size() != asked.block_ids_size() ||
        got.keys_size() != asked.keys_size()) {
      Fail("pull answer does not match the request", status);
    }
    if (got.rows().size() != static_cast<size_t>(asked.keys_size()) * GetLayout().dim * bpv) {
      Fail("sparse pull payload has the wrong size", status);
    }
    for (const DenseBlock& block : got.blocks()) {
      if (block.values().size() != GetLayout().block_sizes[block.block_id()] * bpv)
        Fail("dense pull payload has the wrong size", status);
    }
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> Seeds() {
  const Layout& layout = GetLayout();
  std::vector<std::pair<std::string, std::string>> seeds;
  auto add = [&](const std::string& name, char mode, const std::string& body) {
    seeds.emplace_back(name, std::string(1, mode) + body);
  };
  PullRequest pull;
  *pull.mutable_header() = Header(0, 0, 0);
  auto* pw = pull.add_tables();
  pw->set_table("w");
  for (uint32_t b : layout.my_blocks) pw->add_block_ids(b);
  auto* pe = pull.add_tables();
  pe->set_table("emb");
  pe->set_encoding(ENCODING_FP16);
  for (int i = 0; i < 3; ++i) pe->add_keys(layout.my_keys[i]);
  add("pull_valid", 0, pull.SerializeAsString());
  pull.mutable_header()->set_worker_id(-1);
  add("pull_tool", 4, pull.SerializeAsString());

  PushRequest push;
  *push.mutable_header() = Header(0, 1, 1);
  auto* tw = push.add_tables();
  tw->set_table("w");
  for (uint32_t b : layout.my_blocks) {
    DenseBlock* block = tw->add_blocks();
    block->set_block_id(b);
    *block->mutable_values() = Floats(layout.block_sizes[b], 0.5f);
  }
  auto* te = push.add_tables();
  te->set_table("emb");
  for (int i = 0; i < 2; ++i) te->add_keys(layout.my_keys[i]);
  *te->mutable_rows() = Floats(2 * layout.dim, -0.25f);
  add("push_valid", 1, push.SerializeAsString());
  push.set_is_delta(true);
  push.mutable_header()->set_sequence(2);
  add("push_delta", 5, push.SerializeAsString());
  push.set_is_delta(false);
  te->set_encoding(ENCODING_BF16);
  std::string bf16;
  common::EncodeFloats(std::vector<float>(2 * layout.dim, 1.f), ENCODING_BF16, &bf16);
  *te->mutable_rows() = bf16;
  add("push_bf16", 5, push.SerializeAsString());
  tw->mutable_blocks(0)->set_block_id(layout.other_blocks[0]);
  add("push_wrong_server", 5, push.SerializeAsString());

  // Structured mode: any bytes decode to some request sequence; a few fixed patterns.
  for (int i = 0; i < 4; ++i) {
    std::string body;
    for (int j = 0; j < 48; ++j) body.push_back(static_cast<char>((j * 37 + i * 101) & 0xff));
    add("structured_" + std::to_string(i), static_cast<char>(2 + (i & 1)), body);
  }
  return seeds;
}

}  // namespace ps::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  ps::fuzz::QuietLogging();
  if (ps::fuzz::MaybeWriteSeeds(ps::fuzz::Seeds())) std::exit(0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ps::fuzz;
  if (size == 0) return 0;
  const int mode = data[0] & 3;
  Server s = NewServer();
  if (mode == 0 || mode == 1) {
    const bool fix_header = (data[0] & 4) != 0;
    if (mode == 0) {
      ps::PullRequest request;
      if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
      if (fix_header) request.mutable_header()->set_layout_fingerprint(GetLayout().fingerprint);
      RunPull(s, request);
    } else {
      ps::PushRequest request;
      if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
      if (fix_header) request.mutable_header()->set_layout_fingerprint(GetLayout().fingerprint);
      RunPush(s, request);
    }
    return 0;
  }
  FuzzedDataProvider in(data + 1, size - 1);
  uint64_t next_sequence = 1;
  const int ops = in.ConsumeIntegralInRange(1, 4);
  for (int i = 0; i < ops && in.remaining_bytes() > 0; ++i) {
    if (in.ConsumeBool()) {
      RunPush(s, StructuredPush(in, &next_sequence));
    } else {
      RunPull(s, StructuredPull(in, &next_sequence));
    }
  }
  return 0;
}
