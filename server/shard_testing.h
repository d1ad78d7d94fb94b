// Helpers shared by the shard's tests (shard_test.cc, shard_push_check_test.cc,
// shard_ranged_apply_test.cc, shard_pull_read_test.cc).
#ifndef PS_SERVER_SHARD_TESTING_H_
#define PS_SERVER_SHARD_TESTING_H_

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
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

// A job of one dense table "w" of 2 blocks of `block_floats` values (64k unless said) with
// `w_optimizer` and a small one "b" (a block of its own) with `b_optimizer`, both initialized
// by `initializer`.
inline JobConfig TwoTableConfig(const std::string& w_optimizer, const std::string& b_optimizer,
                                const std::string& initializer, int num_workers,
                                int block_floats = 65536) {
  auto config = common::ParseJobConfigText(
      absl::StrCat("cluster { num_servers: 1 num_workers: ", num_workers,
                   " dense_block_floats: ", block_floats, " }\n",
                   "tables { name: \"w\" kind: TABLE_KIND_DENSE shape: ", 2 * block_floats,
                   " initializer { ", initializer, " } optimizer { ", w_optimizer, " } }\n",
                   "tables { name: \"b\" kind: TABLE_KIND_DENSE shape: 100 initializer { ",
                   initializer, " } optimizer { ", b_optimizer, " } }\n"),
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

// The same read in place (Shard::ReadPull's `in_place`): the output sized first, each block
// filled where it stays, so that a large read may go in ranges on the apply threads.
inline std::vector<float> ReadBlocksInPlace(Shard& shard, const std::string& table,
                                            std::vector<uint32_t> blocks, bool stream = false) {
  const common::TableInfo& info = *shard.partitioner().FindTable(table);
  std::vector<size_t> starts = {0};
  for (uint32_t b : blocks) {
    auto [begin, end] = shard.partitioner().BlockRange(info, b);
    starts.push_back(starts.back() + (end - begin));
  }
  std::vector<float> out(starts.back(), std::numeric_limits<float>::quiet_NaN());
  const PullTable pull{table, ENCODING_FLOAT32, blocks, {}};
  CHECK_OK(shard.ReadPull(
      {pull},
      [&](size_t, size_t part, size_t n, absl::FunctionRef<absl::Status(absl::Span<float>)> fill) {
        CHECK_EQ(n, starts[part + 1] - starts[part]);
        return fill(absl::MakeSpan(out).subspan(starts[part], n));
      },
      stream, /*in_place=*/true));
  return out;
}

// Every block of "w", in order, as a push table over `grad`.
inline PushTable WholeTable(const Shard& shard, const std::vector<float>& grad) {
  const common::TableInfo& info = *shard.partitioner().FindTable("w");
  PushTable table;
  table.table = "w";
  for (uint32_t blk = 0; blk < info.num_blocks; ++blk) {
    auto [begin, end] = shard.partitioner().BlockRange(info, blk);
    table.blocks.push_back({blk, Bytes(absl::MakeConstSpan(grad).subspan(begin, end - begin))});
  }
  return table;
}

// Worker 0's push (incarnation 1) of `table` with sequence `seq`, for `shard`'s layout.
inline PushView FirstWorkerPush(const Shard& shard, const PushTable* table, uint64_t seq = 1) {
  PushView push;
  push.info.layout_fingerprint = shard.partitioner().layout_fingerprint();
  push.info.worker_id = 0;
  push.info.worker_incarnation = 1;
  push.info.sequence = seq;
  push.tables = absl::MakeConstSpan(table, 1);
  return push;
}

// The non-finite values counted in Stats (nonfinite_values).
inline uint64_t NonFiniteValues(Shard& shard) {
  StatsResponse stats;
  shard.FillStats(&stats);
  auto it = stats.rejected().find("nonfinite_values");
  return it == stats.rejected().end() ? 0 : it->second;
}

// The refusals counted in Stats, by reason, sorted ("reason=n " each; the count of non-finite
// values left out).
inline std::string Rejections(Shard& shard) {
  StatsResponse stats;
  shard.FillStats(&stats);
  std::map<std::string, uint64_t> sorted(stats.rejected().begin(), stats.rejected().end());
  std::string out;
  for (const auto& [reason, n] : sorted) {
    if (reason != "nonfinite_values") absl::StrAppend(&out, reason, "=", n, " ");
  }
  return out;
}

inline std::vector<uint32_t> AllBlocks(const Shard& shard) {
  std::vector<uint32_t> blocks(shard.partitioner().FindTable("w")->num_blocks);
  for (uint32_t b = 0; b < blocks.size(); ++b) blocks[b] = b;
  return blocks;
}

// How InPieces cuts: as receive slices do, in 3-byte pieces, or not (one piece at an odd address).
enum class Cut { kSlices, kTiny, kWholeAtAnOddAddress };

// `table`'s blocks again, each copied to `storage` at an odd address and cut into pieces of
// varying size (1 to 70,000 bytes: cuts inside values, pieces shorter than a value), as
// gRPC's receive slices cut a payload.
inline PushTable InPieces(const PushTable& table, std::string* storage,
                          std::vector<std::vector<absl::string_view>>* pieces,
                          Cut cut = Cut::kSlices) {
  size_t total = 0;
  for (const auto& b : table.blocks) total += b.bytes.size();
  storage->assign(total + 1, '\0');
  pieces->assign(table.blocks.size(), {});
  PushTable out = table;
  size_t at = 1;  // odd: no value is float-aligned
  uint64_t draw = 12345;
  for (size_t i = 0; i < table.blocks.size(); ++i) {
    const absl::string_view bytes = table.blocks[i].bytes;
    std::memcpy(storage->data() + at, bytes.data(), bytes.size());
    for (size_t done = 0; done < bytes.size();) {
      draw = draw * 6364136223846793005ull + 1442695040888963407ull;
      const size_t sizes[] = {1, 2, 3, 5, 4093, 65536, 70000};
      const size_t want = cut == Cut::kTiny ? 3 : sizes[(draw >> 33) % 7];
      const size_t n = std::min(want, bytes.size() - done);
      (*pieces)[i].emplace_back(storage->data() + at + done, n);
      done += n;
    }
    out.blocks[i].bytes = absl::string_view();
    out.blocks[i].pieces = (*pieces)[i];
    if (cut == Cut::kWholeAtAnOddAddress) {
      out.blocks[i].bytes = absl::string_view(storage->data() + at, bytes.size());
      out.blocks[i].pieces = {};
    }
    at += bytes.size();
  }
  return out;
}

}  // namespace ps::server::shard_testing

#endif  // PS_SERVER_SHARD_TESTING_H_
