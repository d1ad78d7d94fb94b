// The worker-side store fuzzers' job and the caller's side of one GrpcParameterStore call:
// four tables (dense "w" of 21 values and "h" of 10 in fp16 on the wire, sparse "emb" of dim 3
// and "e16" of dim 2 in bf16), and buffers for them sized as the store requires, so that
// AddressSanitizer reports a write past one.
#ifndef PS_FUZZ_RPC_STORE_BUFFERS_H_
#define PS_FUZZ_RPC_STORE_BUFFERS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/parameter_store.h"

namespace ps::fuzz {

// The job's JobConfig text, its servers named `servers` (in-process names, not addresses).
inline std::string StoreJobText(const std::vector<std::string>& servers) {
  return absl::StrCat("cluster { num_servers: ", servers.size(), " servers: \"",
                      absl::StrJoin(servers, "\" servers: \""), R"(" num_workers: 1
                      dense_block_floats: 4 }
    security { plaintext: true }
    tables { name: "w" kind: TABLE_KIND_DENSE shape: 21 }
    tables { name: "h" kind: TABLE_KIND_DENSE shape: 10 wire_encoding: ENCODING_FP16 }
    tables { name: "emb" kind: TABLE_KIND_SPARSE dim: 3 }
    tables { name: "e16" kind: TABLE_KIND_SPARSE dim: 2 wire_encoding: ENCODING_BF16 }
  )");
}

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
