// Partitioner: which server owns which part of every table. Servers and workers build the
// same Partitioner from the same (expanded) JobConfig and so agree without talking.
//
// Dense tables: a table of numel floats (row-major) is cut into blocks of
// cluster.dense_block_floats floats; the last block may be partial. Blocks are numbered per
// table from 0, and also globally: the blocks of all dense tables, in config order, get
// consecutive global numbers g, and block g lives on server g % num_servers. Round-robin over
// the global counter spreads many small tables (e.g. biases of one block each) evenly instead
// of piling every table's block 0 onto server 0.
//
// Sparse tables: key -> virtual shard Mix64(key) % num_virtual_shards -> server
// virtual_shard % num_servers. Virtual shards are the unit a server stores and checkpoints by,
// so a later re-balancing can move whole shards.
//
// The layout fingerprint hashes everything that decides where a value lives (num_servers,
// num_virtual_shards, dense_block_floats, and each table's name, kind, shape and dim, in
// order). Optimizer, initializer, wire encoding and memory budget are excluded: they may
// change between runs of the same cluster. The fingerprint is part of the wire contract
// (RequestHeader.layout_fingerprint) and is stable across processes and builds
// (common/hash.h).
#ifndef PS_COMMON_PARTITIONER_H_
#define PS_COMMON_PARTITIONER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"
#include "proto/types.pb.h"

namespace ps::common {

// One table as the Partitioner sees it.
struct TableInfo {
  // Position in JobConfig.tables.
  int index = 0;
  std::string name;
  ps::TableKind kind = ps::TABLE_KIND_UNSPECIFIED;
  // Dense: the element count (product of the shape). 0 for sparse tables.
  uint64_t numel = 0;
  // Sparse: the row width. 0 for dense tables.
  uint32_t dim = 0;
  // Dense: the number of blocks, ceil(numel / dense_block_floats). 0 for sparse tables.
  uint32_t num_blocks = 0;
  // The table's config, owned by the Partitioner (valid while any copy of it lives).
  const ps::TableConfig* config = nullptr;
};

// Immutable after Create, so thread-safe. Cheap to copy: copies share the config.
class Partitioner {
 public:
  // Builds the partitioning of all tables of `config` (after ExpandModelTables, so that the
  // model's tables are in config.tables). The number of servers is cluster.num_servers, or
  // the size of cluster.servers when num_servers is 0.
  // Errors: INVALID_ARGUMENT when there are no servers, num_servers and servers disagree,
  // num_virtual_shards or dense_block_floats is 0, a table name repeats, a kind is
  // unspecified, a dense shape is empty or has a non-positive dimension, numel overflows or
  // needs more than 2^32 - 1 blocks, or a sparse table has dim 0.
  [[nodiscard]] static absl::StatusOr<Partitioner> Create(const ps::JobConfig& config);

  uint32_t num_servers() const { return num_servers_; }
  uint32_t num_virtual_shards() const { return num_virtual_shards_; }
  uint64_t dense_block_floats() const { return dense_block_floats_; }
  // See the file comment. Equal configs (up to the excluded fields) give equal fingerprints.
  uint64_t layout_fingerprint() const { return layout_fingerprint_; }

  // All tables, in config order (tables()[i].index == i).
  const std::vector<TableInfo>& tables() const { return tables_; }
  // The table called `name`, or nullptr.
  const TableInfo* FindTable(absl::string_view name) const;

  // Dense blocks. REQUIRES: `table` is one of tables() (of this Partitioner or a copy), is
  // dense, and block < table.num_blocks.
  // Elements [begin, end) of the flattened table held by `block`.
  std::pair<uint64_t, uint64_t> BlockRange(const TableInfo& table, uint32_t block) const;
  uint32_t ServerForBlock(const TableInfo& table, uint32_t block) const;
  // The blocks of `table` on `server`, ascending. REQUIRES: server < num_servers().
  std::vector<uint32_t> BlocksOnServer(const TableInfo& table, uint32_t server) const;

  // Sparse keys (the same for every sparse table).
  uint32_t VirtualShard(uint64_t key) const;
  uint32_t ServerForKey(uint64_t key) const;
  // Resizes `*positions_per_server` to num_servers() and fills entry s with the positions i
  // (into `keys`, ascending) of the keys that live on server s. Duplicated keys keep all
  // their positions. REQUIRES: keys.size() < 2^32.
  void SplitKeysByServer(absl::Span<const uint64_t> keys,
                         std::vector<std::vector<uint32_t>>* positions_per_server) const;

 private:
  Partitioner() = default;

  // The global number of block 0 of `table` (0 for sparse tables).
  uint64_t FirstGlobalBlock(const TableInfo& table) const;

  // All constant after Create.
  std::shared_ptr<const ps::JobConfig> config_;  // Shared by copies; TableInfo points in.
  uint32_t num_servers_ = 0;
  uint32_t num_virtual_shards_ = 0;
  uint64_t dense_block_floats_ = 0;
  uint64_t layout_fingerprint_ = 0;
  std::vector<TableInfo> tables_;
  std::vector<uint64_t> first_global_block_;  // Indexed like tables_.
  absl::flat_hash_map<std::string, int> index_by_name_;
};

// The number of servers `cluster` describes: num_servers, or servers_size() when that is 0.
// Errors: INVALID_ARGUMENT when both are 0 or both are set and differ.
[[nodiscard]] absl::StatusOr<uint32_t> NumServers(const ps::ClusterConfig& cluster);

}  // namespace ps::common

#endif  // PS_COMMON_PARTITIONER_H_
