// The caller's side of one GrpcParameterStore call in the store fuzzers: buffers for the four
// tables of their job (dense "w" of 21 values and "h" of 10, sparse "emb" of dim 3 and "e16" of
// dim 2), sized as the store requires, so that AddressSanitizer reports a write past one.
#ifndef PS_FUZZ_RPC_STORE_BUFFERS_H_
#define PS_FUZZ_RPC_STORE_BUFFERS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "common/parameter_store.h"

namespace ps::fuzz {

struct StoreBuffers {
  std::vector<float> w = std::vector<float>(21);
  std::vector<float> h = std::vector<float>(10);
  std::vector<uint64_t> emb_keys;
  std::vector<uint64_t> e16_keys;
  std::vector<float> emb;
  std::vector<float> e16;

  StoreBuffers(std::vector<uint64_t> emb_keys_in, std::vector<uint64_t> e16_keys_in)
      : emb_keys(std::move(emb_keys_in)), e16_keys(std::move(e16_keys_in)) {
    emb.assign(emb_keys.size() * 3, 0.5f);
    e16.assign(e16_keys.size() * 2, 0.5f);
  }
  common::PullBatch Pull() {
    common::PullBatch b;
    b.dense = {{"w", absl::MakeSpan(w)}, {"h", absl::MakeSpan(h)}};
    b.sparse = {{"emb", emb_keys, absl::MakeSpan(emb)}, {"e16", e16_keys, absl::MakeSpan(e16)}};
    return b;
  }
  common::PushBatch Push() const {
    common::PushBatch b;
    b.dense = {{"w", w}, {"h", h}};
    b.sparse = {{"emb", emb_keys, emb}, {"e16", e16_keys, e16}};
    return b;
  }
};

}  // namespace ps::fuzz

#endif  // PS_FUZZ_RPC_STORE_BUFFERS_H_
