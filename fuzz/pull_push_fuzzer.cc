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
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/codec.h"
#include "fuzz/fuzz_env.h"
#include "fuzz/requests.h"

namespace ps::fuzz {
namespace {

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
  if (status.ok()) CheckPullAnswer(request.tables(), response, /*keys_echoed=*/true);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> Seeds() {
  const Layout& layout = GetLayout();
  std::vector<std::pair<std::string, std::string>> seeds;
  auto add = [&](const std::string& name, char mode, const std::string& body) {
    seeds.emplace_back(name, std::string(1, mode) + body);
  };
  PullRequest pull = ValidPull(0, 0, 3, ENCODING_FP16);
  add("pull_valid", 0, pull.SerializeAsString());
  pull.mutable_header()->set_worker_id(-1);
  add("pull_tool", 4, pull.SerializeAsString());

  PushRequest push = ValidPush(0, 1, 1, 0.5f, 2, -0.25f);
  TableValues* tw = push.mutable_tables(0);
  TableValues* te = push.mutable_tables(1);
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
  ps::fuzz::InitializeFuzzer(ps::fuzz::Seeds());
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
