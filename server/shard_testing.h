// Helpers shared by the shard's tests (shard_test.cc, shard_push_check_test.cc).
#ifndef PS_SERVER_SHARD_TESTING_H_
#define PS_SERVER_SHARD_TESTING_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/config/config.h"
#include "glog/logging.h"
#include "server/shard.h"

#define CHECK_OK(expr)              \
  do {                              \
    const absl::Status _s = (expr); \
    CHECK(_s.ok()) << _s;           \
  } while (0)

namespace ps::server::shard_testing {

// A job with one dense table "w" of `numel` values (CONSTANT 1 initializer, blocks of 4) and
// one sparse table "emb" of dim 3, both with `optimizer`.
inline JobConfig MakeConfig(const std::string& optimizer, int num_servers = 1, int numel = 10,
                     int num_workers = 1) {
  auto config = common::ParseJobConfigText(
      absl::StrCat(R"pb(
        cluster { num_servers: )pb", num_servers, R"pb( num_workers: )pb", num_workers, R"pb(
                  dense_block_floats: 4 num_virtual_shards: 64 }
        tables {
          name: "w" kind: TABLE_KIND_DENSE shape: )pb", numel, R"pb(
          initializer { kind: CONSTANT value: 1 }
          optimizer { )pb", optimizer, R"pb( }
        }
        tables {
          name: "emb" kind: TABLE_KIND_SPARSE dim: 3
          initializer { kind: CONSTANT value: 0.5 }
          optimizer { )pb", optimizer, R"pb( }
        }
      )pb"),
      "test");
  CHECK_OK(config.status());
  return *config;
}

inline std::unique_ptr<Shard> MakeShard(const JobConfig& config, uint32_t index = 0) {
  ShardOptions options;
  options.server_index = index;
  auto shard = Shard::Create(config, options);
  CHECK_OK(shard.status());
  return *std::move(shard);
}

inline absl::string_view Bytes(absl::Span<const float> values) {
  return absl::string_view(reinterpret_cast<const char*>(values.data()),
                           values.size() * sizeof(float));
}

// Dense blocks of `table` read through the shard's own pull entry, one after the other.
inline std::vector<float> ReadBlocks(Shard& shard, const std::string& table,
                                     std::vector<uint32_t> blocks, bool stream = false) {
  const PullTable pull{table, ENCODING_FLOAT32, blocks, {}};
  std::vector<float> out;
  CHECK_OK(shard.ReadPull(
      {pull},
      [&](size_t, size_t, size_t n, absl::FunctionRef<absl::Status(absl::Span<float>)> fill) {
        out.resize(out.size() + n);
        return fill(absl::MakeSpan(out).last(n));
      },
      stream));
  return out;
}

}  // namespace ps::server::shard_testing

#endif  // PS_SERVER_SHARD_TESTING_H_
