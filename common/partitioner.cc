#include "common/partitioner.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ps::common {
namespace {

absl::Status TableError(int index, const ps::TableConfig& table, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("tables[", index, "] ('", table.name(), "'): ", what));
}

// Fills the per-kind fields of `info` from its config.
absl::Status DescribeTable(const ps::TableConfig& table, uint64_t block_floats, TableInfo* info) {
  switch (table.kind()) {
    case ps::TABLE_KIND_DENSE: {
      if (table.shape_size() == 0) return TableError(info->index, table, "dense with no shape");
      uint64_t numel = 1;
      for (int d = 0; d < table.shape_size(); ++d) {
        int64_t dim = table.shape(d);
        if (dim <= 0) {
          return TableError(info->index, table, absl::StrCat("shape dimension ", d, " is ", dim));
        }
        if (numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
          return TableError(info->index, table, "element count overflows 64 bits");
        }
        numel *= static_cast<uint64_t>(dim);
      }
      uint64_t blocks = numel / block_floats + (numel % block_floats != 0);
      if (blocks > std::numeric_limits<uint32_t>::max()) {
        return TableError(info->index, table,
                          absl::StrCat(blocks, " blocks; raise cluster.dense_block_floats"));
      }
      info->numel = numel;
      info->num_blocks = static_cast<uint32_t>(blocks);
      return absl::OkStatus();
    }
    case ps::TABLE_KIND_SPARSE:
      if (table.dim() == 0) return TableError(info->index, table, "sparse with dim 0");
      info->dim = table.dim();
      return absl::OkStatus();
    default:
      return TableError(info->index, table, "kind unspecified");
  }
}

// See the file comment of partitioner.h for what is (and is not) hashed. The leading tag
// lets a future layout scheme change every fingerprint on purpose.
uint64_t ComputeFingerprint(uint32_t num_servers, uint32_t num_virtual_shards,
                            uint64_t block_floats, const std::vector<TableInfo>& tables) {
  uint64_t h = Fingerprint64("ps.layout.v1");
  h = HashCombine(h, num_servers);
  h = HashCombine(h, num_virtual_shards);
  h = HashCombine(h, block_floats);
  h = HashCombine(h, tables.size());
  for (const TableInfo& table : tables) {
    h = HashCombine(h, Fingerprint64(table.name));
    h = HashCombine(h, static_cast<uint64_t>(table.kind));
    if (table.kind == ps::TABLE_KIND_DENSE) {
      h = HashCombine(h, static_cast<uint64_t>(table.config->shape_size()));
      for (int64_t dim : table.config->shape()) h = HashCombine(h, static_cast<uint64_t>(dim));
    } else {
      h = HashCombine(h, table.dim);
    }
  }
  return h;
}

}  // namespace

absl::StatusOr<uint32_t> NumServers(const ps::ClusterConfig& cluster) {
  const uint32_t listed = static_cast<uint32_t>(cluster.servers_size());
  if (cluster.num_servers() == 0 && listed == 0) {
    return absl::InvalidArgumentError(
        "cluster: no servers (set cluster.num_servers or list cluster.servers)");
  }
  if (cluster.num_servers() != 0 && listed != 0 && cluster.num_servers() != listed) {
    return absl::InvalidArgumentError(absl::StrCat("cluster.num_servers: ", cluster.num_servers(),
                                                   " but cluster.servers lists ", listed));
  }
  return cluster.num_servers() != 0 ? cluster.num_servers() : listed;
}

absl::StatusOr<Partitioner> Partitioner::Create(const ps::JobConfig& config) {
  Partitioner p;
  p.config_ = std::make_shared<const ps::JobConfig>(config);
  const ps::ClusterConfig& cluster = p.config_->cluster();
  ASSIGN_OR_RETURN(p.num_servers_, NumServers(cluster));
  p.num_virtual_shards_ = cluster.num_virtual_shards();
  p.dense_block_floats_ = cluster.dense_block_floats();
  if (p.num_virtual_shards_ == 0) {
    return absl::InvalidArgumentError("cluster.num_virtual_shards: must be > 0");
  }
  if (p.dense_block_floats_ == 0) {
    return absl::InvalidArgumentError("cluster.dense_block_floats: must be > 0");
  }

  uint64_t next_global_block = 0;
  for (int i = 0; i < p.config_->tables_size(); ++i) {
    const ps::TableConfig& table = p.config_->tables(i);
    TableInfo info;
    info.index = i;
    info.name = table.name();
    info.kind = table.kind();
    info.config = &table;
    RETURN_IF_ERROR(DescribeTable(table, p.dense_block_floats_, &info));
    if (!p.index_by_name_.emplace(info.name, i).second) {
      return TableError(i, table, "duplicate table name");
    }
    p.first_global_block_.push_back(next_global_block);
    next_global_block += info.num_blocks;
    p.tables_.push_back(std::move(info));
  }
  p.layout_fingerprint_ =
      ComputeFingerprint(p.num_servers_, p.num_virtual_shards_, p.dense_block_floats_, p.tables_);
  return p;
}

const TableInfo* Partitioner::FindTable(absl::string_view name) const {
  auto it = index_by_name_.find(name);
  return it == index_by_name_.end() ? nullptr : &tables_[it->second];
}

uint64_t Partitioner::FirstGlobalBlock(const TableInfo& table) const {
  DCHECK(table.index >= 0 && static_cast<size_t>(table.index) < tables_.size());
  return first_global_block_[table.index];
}

std::pair<uint64_t, uint64_t> Partitioner::BlockRange(const TableInfo& table,
                                                      uint32_t block) const {
  DCHECK_LT(block, table.num_blocks) << table.name;
  uint64_t begin = static_cast<uint64_t>(block) * dense_block_floats_;
  return {begin, std::min(begin + dense_block_floats_, table.numel)};
}

uint32_t Partitioner::ServerForBlock(const TableInfo& table, uint32_t block) const {
  DCHECK_LT(block, table.num_blocks) << table.name;
  return static_cast<uint32_t>((FirstGlobalBlock(table) + block) % num_servers_);
}

std::vector<uint32_t> Partitioner::BlocksOnServer(const TableInfo& table, uint32_t server) const {
  DCHECK_LT(server, num_servers_);
  // Block b is on server (first + b) % n, so the first block on `server` is
  // (server - first) mod n, and then every n-th.
  const uint64_t first = FirstGlobalBlock(table) % num_servers_;
  std::vector<uint32_t> blocks;
  uint64_t b = (server + num_servers_ - first) % num_servers_;
  blocks.reserve(table.num_blocks / num_servers_ + 1);
  for (; b < table.num_blocks; b += num_servers_) blocks.push_back(static_cast<uint32_t>(b));
  return blocks;
}

uint32_t Partitioner::VirtualShard(uint64_t key) const {
  return static_cast<uint32_t>(Mix64(key) % num_virtual_shards_);
}

uint32_t Partitioner::ServerForKey(uint64_t key) const { return VirtualShard(key) % num_servers_; }

void Partitioner::SplitKeysByServer(
    absl::Span<const uint64_t> keys,
    std::vector<std::vector<uint32_t>>* positions_per_server) const {
  DCHECK_LT(keys.size(), uint64_t{1} << 32);
  positions_per_server->resize(num_servers_);
  for (std::vector<uint32_t>& positions : *positions_per_server) {
    positions.clear();
    positions.reserve(keys.size() / num_servers_ + 16);
  }
  if (num_servers_ == 1) {  // every key: no need to hash them
    (*positions_per_server)[0].resize(keys.size());
    std::iota((*positions_per_server)[0].begin(), (*positions_per_server)[0].end(), 0u);
    return;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    (*positions_per_server)[ServerForKey(keys[i])].push_back(static_cast<uint32_t>(i));
  }
}

}  // namespace ps::common
