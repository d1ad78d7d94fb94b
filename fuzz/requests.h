// Requests built from fuzzer bytes, shared by the fuzzers that feed the request handlers
// (pull_push_fuzzer: Pull/Push messages; frame_fuzzer: the same requests as PushPull frames,
// by the socket's frame and through a shared-memory segment).
//
// Each field is drawn mostly from values that pass the server's checks (the layout of
// fuzz_env.h), sometimes from ones that do not, so that inputs reach the decode, finiteness,
// exactly-once and apply paths rather than stopping at the first check.
#ifndef PS_FUZZ_REQUESTS_H_
#define PS_FUZZ_REQUESTS_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/ps.pb.h"

namespace ps::fuzz {

template <typename T>
T Pick(FuzzedDataProvider& in, const std::vector<T>& values) {
  return values[in.ConsumeIntegralInRange<size_t>(0, values.size() - 1)];
}

// "w", "emb", an unknown name or random bytes.
std::string TableName(FuzzedDataProvider& in);
// Mostly float32; fp16, bf16 or any integer now and then.
Encoding PickEncoding(FuzzedDataProvider& in);
// A header for worker 0 or 1 (or a tool, a worker beyond the job, any id), incarnation 1 (or
// another), the next sequence (or a retry, 0, any), a small clock (or an extreme one), the
// right layout fingerprint (or any). `*next_sequence` advances when the next one is used.
RequestHeader PickHeader(FuzzedDataProvider& in, uint64_t* next_sequence);
// A block of "w" on server 0 (or on server 1, one past the end, any).
uint32_t PickBlock(FuzzedDataProvider& in);
// A key of server 0 (or of server 1, any).
uint64_t PickKey(FuzzedDataProvider& in);
// A payload meant to hold `n` values in `encoding`: mostly the right size, sometimes not;
// the values are one constant (finite or not) or raw bytes from the input.
std::string Payload(FuzzedDataProvider& in, size_t n, Encoding encoding);
// 0 to 3 tables of dense blocks or sparse rows, with a header from PickHeader.
PushRequest StructuredPush(FuzzedDataProvider& in, uint64_t* next_sequence);
PullRequest StructuredPull(FuzzedDataProvider& in, uint64_t* next_sequence);
// The sparse keys a push names (for fuzz::State).
std::vector<uint64_t> KeysOf(const PushRequest& request);

// Fails unless `response`, the OK answer to a pull of `asked`, answers every table asked
// for, in order, with payloads of the asked-for sizes and, `keys_echoed`, the keys asked for
// (a PullResponse message names them; a frame's answer does not).
void CheckPullAnswer(const google::protobuf::RepeatedPtrField<TablePullRequest>& asked,
                     const PullResponse& response, bool keys_echoed);

}  // namespace ps::fuzz

#endif  // PS_FUZZ_REQUESTS_H_
