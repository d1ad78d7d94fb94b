// The server both fuzzers run against, built without sockets (as server/rpc/service_test
// does): server 0 of a two-server layout with a dense table "w" (21 values in blocks of 4,
// Adam with clip_norm) and a sparse table "emb" (dim 3, SGD with weight decay), under SSP
// with staleness 1 and two workers, so that pulls go through the consistency bound.
//
// Also the cheap state fingerprint the fuzzers compare before and after a request, and the
// seed-corpus writer (a fuzzer started with PS_FUZZ_WRITE_SEEDS=<dir> writes its seeds there
// and exits instead of fuzzing; tools/fuzz.sh --regen-corpus uses it).
//
// Thread-compatible: libFuzzer calls a target from one thread.
#ifndef PS_FUZZ_FUZZ_ENV_H_
#define PS_FUZZ_FUZZ_ENV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"
#include "proto/ps.pb.h"
#include "server/rpc/service.h"
#include "server/shard.h"

namespace ps::fuzz {

// What a fuzzer needs to know about the layout to build requests that pass the checks.
struct Layout {
  uint64_t fingerprint = 0;
  std::vector<uint32_t> my_blocks;     // blocks of "w" on server 0
  std::vector<uint32_t> other_blocks;  // blocks of "w" on server 1
  uint32_t num_blocks = 0;
  std::vector<size_t> block_sizes;   // values in each block of "w"
  std::vector<uint64_t> my_keys;     // small keys owned by server 0
  std::vector<uint64_t> other_keys;  // small keys owned by server 1
  uint32_t dim = 0;                  // of "emb"
};

// The prepared config (parsed once; CHECK-fails if the text above stops parsing).
const JobConfig& Config();
const Layout& GetLayout();

// A fresh shard and a service over it. The service's pool has one idle thread; it offers
// workers shared-memory segments of up to `max_shared_bytes_per_worker` (0: none).
struct Server {
  std::unique_ptr<server::Shard> shard;
  std::unique_ptr<server::ParameterServerService> service;
};
Server NewServer(size_t max_shared_bytes_per_worker = 0);

// Every value of "w" on this server, the rows of "emb" for Layout::my_keys and for the
// owned keys among `extra_keys` (at most 64 of them), the update count and, `with_workers`,
// the workers' incarnations, clocks and exactly-once state, as bytes. A missing row reads as
// its deterministic initial value and is not created.
std::string State(server::Shard& shard, absl::Span<const uint64_t> extra_keys,
                  bool with_workers = true);

// A valid header for worker `worker` (incarnation 1).
RequestHeader Header(int32_t worker, uint64_t sequence, int64_t clock);

// Float32 bytes of `n` copies of `value`.
std::string Floats(size_t n, float value);

// A push every check passes: `worker`'s `sequence` at `clock`, `dense` for every value of "w"
// on server 0 and `row` for every value of the first `keys` of Layout::my_keys in "emb".
PushRequest ValidPush(int32_t worker, uint64_t sequence, int64_t clock, float dense, size_t keys,
                      float row);
// A pull every check passes: `worker` at `clock`, the blocks of "w" on server 0 and the
// first `keys` of Layout::my_keys in "emb", in `encoding`.
PullRequest ValidPull(int32_t worker, int64_t clock, size_t keys, Encoding encoding);

// Reports a broken invariant and aborts (libFuzzer reports the input as a crash).
[[noreturn]] void Fail(const char* what, const absl::Status& status);

// glog to stderr at ERROR and above only (the handlers log nothing on bad input, but
// RocksDB-related code may).
void QuietLogging();

// If PS_FUZZ_WRITE_SEEDS is set, writes each seed as <dir>/<name> and returns true.
bool MaybeWriteSeeds(const std::vector<std::pair<std::string, std::string>>& seeds);

// A fuzzer's LLVMFuzzerInitialize: QuietLogging, then, if PS_FUZZ_WRITE_SEEDS is set, writes
// `seeds` there and exits.
void InitializeFuzzer(const std::vector<std::pair<std::string, std::string>>& seeds);

}  // namespace ps::fuzz

#endif  // PS_FUZZ_FUZZ_ENV_H_
