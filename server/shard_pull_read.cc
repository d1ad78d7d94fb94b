// Shard::ReadPull: a pull's parts read out of the tables into the caller's sink, a large
// pull's dense blocks in ranges on the apply threads.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/shard.h"

namespace ps::server {

absl::Status Shard::ReadPull(absl::Span<const PullTable> tables, PullSink sink, bool stream_asked,
                             bool in_place) {
  Timed timed(&pull_read_ns_);
  uint64_t bytes_out = 0;
  // The answer's dense values: a large pull is read out with non-temporal stores
  // (ShardOptions::stream_pull_bytes) and, where the caller allows, by several threads.
  const bool may_stream = !stream_asked && options_.stream_pull_bytes != UINT64_MAX;
  const bool may_split = in_place && apply_pool_ != nullptr;
  size_t dense_values = 0;
  if (may_stream || may_split) {
    for (const PullTable& t : tables) {
      auto it = by_name_.find(t.table);
      if (it == by_name_.end() || it->second->info().kind != TABLE_KIND_DENSE) continue;
      const auto* dense = static_cast<const DenseTablePart*>(it->second);
      for (uint32_t b : t.blocks) dense_values += dense->BlockSize(b);
    }
  }
  const bool stream =
      stream_asked || (may_stream && dense_values * sizeof(float) > options_.stream_pull_bytes);
  const bool split = may_split && dense_values >= options_.parallel_apply_values;
  std::vector<PullPlace> places;
  for (size_t i = 0; i < tables.size(); ++i) {
    const PullTable& t = tables[i];
    auto it = by_name_.find(t.table);
    if (it == by_name_.end()) {
      return absl::InternalError(absl::StrCat("pull of unchecked table '", t.table, "'"));
    }
    const uint64_t bpv = common::BytesPerValue(t.encoding);
    if (it->second->info().kind == TABLE_KIND_DENSE) {
      auto* dense = static_cast<DenseTablePart*>(it->second);
      for (size_t j = 0; j < t.blocks.size(); ++j) {
        const uint32_t b = t.blocks[j];
        RETURN_IF_ERROR(sink(i, j, dense->BlockSize(b), [&](absl::Span<float> out) {
          if (split) {
            // As Read checks it: the ranges are cut from this span.
            CHECK_EQ(out.size(), dense->BlockSize(b)) << "block " << b << " of '" << t.table << "'";
            places.push_back(PullPlace{dense, b, out});
          } else {
            dense->Read(b, out, stream);
          }
          return absl::OkStatus();
        }));
        bytes_out += dense->BlockSize(b) * bpv;
      }
    } else {
      auto* sparse = static_cast<SparseTablePart*>(it->second);
      const size_t n = t.keys.size() * sparse->info().dim;
      RETURN_IF_ERROR(
          sink(i, kRowsPart, n, [&](absl::Span<float> out) { return sparse->Read(t.keys, out); }));
      bytes_out += n * bpv;
    }
  }
  if (!places.empty()) ReadInRanges(places, dense_values, stream);
  absl::MutexLock lock(&stats_mu_);
  ++pulls_;
  if (!places.empty()) ++parallel_pulls_;
  bytes_out_ += bytes_out;
  return absl::OkStatus();
}

void Shard::ReadInRanges(absl::Span<const PullPlace> places, size_t values, bool stream) {
  std::vector<std::pair<DenseTablePart*, uint32_t>> blocks;
  blocks.reserve(places.size());
  for (const PullPlace& p : places) blocks.emplace_back(p.table, p.block);
  SortForLocking(&blocks);
  struct Unit {
    size_t place, begin, end;
  };
  std::vector<Unit> units;
  const size_t range = RangeValues(values);
  for (size_t i = 0; i < places.size(); ++i) {
    const size_t n = places[i].out.size();
    for (size_t begin = 0; begin < n; begin += range) {
      units.push_back(Unit{i, begin, std::min(n, begin + range)});
    }
  }
  for (const auto& [table, block] : blocks) table->ReaderLockBlock(block);
  apply_pool_->ParallelFor(units.size(), apply_pool_->num_threads(), [&](size_t k) {
    const Unit& u = units[k];
    const PullPlace& p = places[u.place];
    p.table->ReadLocked(p.block, u.begin, p.out.subspan(u.begin, u.end - u.begin), stream);
  });
  for (const auto& [table, block] : blocks) table->ReaderUnlockBlock(block);
}

}  // namespace ps::server
