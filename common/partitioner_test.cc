#include "common/partitioner.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace ps::common {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ps::JobConfig ParseConfig(const std::string& text) {
  ps::JobConfig config;
  CHECK(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

// Two servers; a 784x10 dense table and an 8-wide sparse table.
ps::JobConfig SmallConfig() {
  return ParseConfig(R"pb(
    cluster { num_servers: 2 }
    tables {
      name: "w"
      kind: TABLE_KIND_DENSE
      shape: [ 784, 10 ]
    }
    tables { name: "emb" kind: TABLE_KIND_SPARSE dim: 8 }
  )pb");
}

Partitioner MustCreate(const ps::JobConfig& config) {
  absl::StatusOr<Partitioner> p = Partitioner::Create(config);
  CHECK(p.ok()) << p.status();
  return *std::move(p);
}

TEST(NumServers, FromCountOrList) {
  ps::ClusterConfig cluster;
  EXPECT_THAT(NumServers(cluster),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no servers")));
  cluster.set_num_servers(3);
  EXPECT_EQ(*NumServers(cluster), 3u);
  cluster.add_servers("a:1");
  cluster.add_servers("b:1");
  EXPECT_THAT(NumServers(cluster),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cluster.num_servers")));
  cluster.set_num_servers(0);
  EXPECT_EQ(*NumServers(cluster), 2u);
}

TEST(Partitioner, CreateRejectsBadLayouts) {
  ps::JobConfig config = SmallConfig();
  config.mutable_cluster()->set_num_virtual_shards(0);
  EXPECT_THAT(Partitioner::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_virtual_shards")));
  config = SmallConfig();
  config.mutable_cluster()->set_dense_block_floats(0);
  EXPECT_THAT(Partitioner::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dense_block_floats")));
  config = SmallConfig();
  config.mutable_tables(0)->set_shape(1, 0);
  EXPECT_THAT(Partitioner::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tables[0]")));
  config = SmallConfig();
  config.mutable_tables(1)->set_name("w");
  EXPECT_THAT(Partitioner::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duplicate")));
  config = SmallConfig();
  config.mutable_tables(1)->set_dim(0);
  EXPECT_THAT(Partitioner::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dim 0")));
  config = SmallConfig();
  config.mutable_tables(0)->set_kind(ps::TABLE_KIND_UNSPECIFIED);
  EXPECT_THAT(Partitioner::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kind")));
  config = SmallConfig();
  config.mutable_cluster()->set_dense_block_floats(1);
  config.mutable_tables(0)->set_shape(0, int64_t{1} << 32);
  EXPECT_THAT(Partitioner::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("blocks")));
}

TEST(Partitioner, DescribesTables) {
  Partitioner p = MustCreate(SmallConfig());
  EXPECT_EQ(p.num_servers(), 2u);
  ASSERT_EQ(p.tables().size(), 2u);
  const TableInfo* w = p.FindTable("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->index, 0);
  EXPECT_EQ(w->kind, ps::TABLE_KIND_DENSE);
  EXPECT_EQ(w->numel, 7840u);
  EXPECT_EQ(w->num_blocks, 1u);  // Default 65536 floats per block.
  EXPECT_EQ(w->config->name(), "w");
  const TableInfo* emb = p.FindTable("emb");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->index, 1);
  EXPECT_EQ(emb->dim, 8u);
  EXPECT_EQ(emb->num_blocks, 0u);
  EXPECT_EQ(p.FindTable("nope"), nullptr);
}

TEST(Partitioner, CopiesKeepValidConfigPointers) {
  Partitioner copy = [] {
    Partitioner original = MustCreate(SmallConfig());
    return original;  // `original` dies here.
  }();
  EXPECT_EQ(copy.FindTable("emb")->config->dim(), 8u);
  EXPECT_EQ(copy.tables()[0].config->shape(1), 10);
}

TEST(Partitioner, BlockRangesCoverTheTableExactly) {
  ps::JobConfig config = SmallConfig();
  config.mutable_cluster()->set_dense_block_floats(1000);
  Partitioner p = MustCreate(config);
  const TableInfo& w = *p.FindTable("w");
  ASSERT_EQ(w.num_blocks, 8u);  // 7840 = 7 * 1000 + 840.
  uint64_t expected_begin = 0;
  for (uint32_t b = 0; b < w.num_blocks; ++b) {
    auto [begin, end] = p.BlockRange(w, b);
    EXPECT_EQ(begin, expected_begin);
    EXPECT_GT(end, begin);
    expected_begin = end;
  }
  EXPECT_EQ(expected_begin, w.numel);
  EXPECT_EQ(p.BlockRange(w, 7), std::make_pair(uint64_t{7000}, uint64_t{7840}));
}

TEST(Partitioner, ExactMultipleHasNoEmptyLastBlock) {
  ps::JobConfig config = SmallConfig();
  config.mutable_cluster()->set_dense_block_floats(784);
  Partitioner p = MustCreate(config);
  const TableInfo& w = *p.FindTable("w");
  EXPECT_EQ(w.num_blocks, 10u);
  EXPECT_EQ(p.BlockRange(w, 9), std::make_pair(uint64_t{7056}, uint64_t{7840}));
}

// Many tables of a few blocks each; every server's total differs by at most one.
TEST(Partitioner, DenseBlocksAreRoundRobinOverAllTables) {
  ps::JobConfig config;
  config.mutable_cluster()->set_num_servers(3);
  config.mutable_cluster()->set_dense_block_floats(100);
  const std::vector<int64_t> sizes = {50, 100, 101, 250, 7, 1000, 99, 301};
  for (size_t i = 0; i < sizes.size(); ++i) {
    ps::TableConfig* t = config.add_tables();
    t->set_name("t" + std::to_string(i));
    t->add_shape(sizes[i]);
  }
  config.add_tables()->set_name("sparse_in_between");  // Takes no global blocks.
  config.mutable_tables(8)->set_kind(ps::TABLE_KIND_SPARSE);
  config.mutable_tables(8)->set_dim(4);
  config.add_tables()->set_name("bias");
  config.mutable_tables(9)->add_shape(10);
  Partitioner p = MustCreate(config);

  std::vector<int> per_server(3, 0);
  uint64_t global = 0;
  for (const TableInfo& table : p.tables()) {
    std::vector<std::vector<uint32_t>> listed(3);
    for (uint32_t s = 0; s < 3; ++s) listed[s] = p.BlocksOnServer(table, s);
    for (uint32_t b = 0; b < table.num_blocks; ++b, ++global) {
      uint32_t server = p.ServerForBlock(table, b);
      EXPECT_EQ(server, global % 3) << table.name << " block " << b;
      EXPECT_THAT(listed[server], testing::Contains(b));
      ++per_server[server];
    }
    size_t listed_total = 0;
    for (const auto& blocks : listed) {
      EXPECT_TRUE(std::is_sorted(blocks.begin(), blocks.end()));
      listed_total += blocks.size();
    }
    EXPECT_EQ(listed_total, table.num_blocks) << table.name;
  }
  EXPECT_EQ(global, 1u + 1 + 2 + 3 + 1 + 10 + 1 + 4 + 1);
  auto [lo, hi] = std::minmax_element(per_server.begin(), per_server.end());
  EXPECT_LE(*hi - *lo, 1);
  // The last table ("bias", global block 23) continues the rotation.
  EXPECT_EQ(p.ServerForBlock(*p.FindTable("bias"), 0), 23u % 3);
  EXPECT_THAT(p.BlocksOnServer(*p.FindTable("t5"), 0), ElementsAre(1, 4, 7));
}

// Frozen expectations: an accidental change of the key hash must break this test.
TEST(Partitioner, KeyMappingMatchesFrozenValues) {
  ps::JobConfig config = SmallConfig();
  config.mutable_cluster()->set_num_servers(3);
  Partitioner p = MustCreate(config);
  EXPECT_EQ(p.VirtualShard(0), 0u);
  EXPECT_EQ(p.VirtualShard(1), 1509u);
  EXPECT_EQ(p.VirtualShard(2), 1162u);
  EXPECT_EQ(p.VirtualShard(12345), 3409u);
  EXPECT_EQ(p.VirtualShard(0xdeadbeefcafebabeULL), 1324u);
  EXPECT_EQ(p.ServerForKey(1), 0u);
  EXPECT_EQ(p.ServerForKey(2), 1u);
  EXPECT_EQ(p.ServerForKey(12345), 1u);
}

TEST(Partitioner, FingerprintMatchesFrozenValue) {
  EXPECT_EQ(MustCreate(SmallConfig()).layout_fingerprint(), 0x582a5a7a086492a3ULL);
}

TEST(Partitioner, SameConfigGivesSameMappingAndFingerprint) {
  Partitioner a = MustCreate(SmallConfig());
  Partitioner b = MustCreate(SmallConfig());
  EXPECT_EQ(a.layout_fingerprint(), b.layout_fingerprint());
  for (uint64_t key = 0; key < 1000; ++key) ASSERT_EQ(a.ServerForKey(key), b.ServerForKey(key));
}

TEST(Partitioner, FingerprintTracksLayoutFieldsOnly) {
  const uint64_t base = MustCreate(SmallConfig()).layout_fingerprint();
  auto fingerprint_with = [](auto mutate) {
    ps::JobConfig config = SmallConfig();
    mutate(&config);
    return MustCreate(config).layout_fingerprint();
  };
  // Layout changes.
  EXPECT_NE(base,
            fingerprint_with([](ps::JobConfig* c) { c->mutable_tables(0)->set_shape(1, 11); }));
  EXPECT_NE(base, fingerprint_with([](ps::JobConfig* c) {
              c->mutable_tables(0)->set_shape(0, 10);
              c->mutable_tables(0)->set_shape(1, 784);
            }));
  EXPECT_NE(base, fingerprint_with([](ps::JobConfig* c) { c->mutable_tables(1)->set_dim(9); }));
  EXPECT_NE(base, fingerprint_with([](ps::JobConfig* c) { c->mutable_tables(1)->set_name("e"); }));
  EXPECT_NE(base,
            fingerprint_with([](ps::JobConfig* c) { c->mutable_cluster()->set_num_servers(3); }));
  EXPECT_NE(base, fingerprint_with([](ps::JobConfig* c) {
              c->mutable_cluster()->set_dense_block_floats(1024);
            }));
  EXPECT_NE(base, fingerprint_with([](ps::JobConfig* c) {
              c->mutable_cluster()->set_num_virtual_shards(1024);
            }));
  EXPECT_NE(base, fingerprint_with([](ps::JobConfig* c) {
              c->add_tables()->CopyFrom(c->tables(0));
              c->mutable_tables(2)->set_name("w2");
            }));
  EXPECT_NE(base,
            fingerprint_with([](ps::JobConfig* c) { c->mutable_tables()->SwapElements(0, 1); }));
  // Not layout: optimizer, initializer, encoding, memory budget, server addresses.
  EXPECT_EQ(base, fingerprint_with([](ps::JobConfig* c) {
              c->mutable_tables(0)->mutable_optimizer()->set_learning_rate(0.5);
              c->mutable_tables(1)->mutable_optimizer()->set_kind(ps::OptimizerConfig::ADAM);
              c->mutable_tables(0)->mutable_initializer()->set_seed(99);
              c->mutable_tables(1)->set_wire_encoding(ps::ENCODING_BF16);
              c->mutable_tables(1)->set_memory_budget_rows(10);
              c->mutable_default_optimizer()->set_learning_rate(3);
            }));
  EXPECT_EQ(base, fingerprint_with([](ps::JobConfig* c) {
              c->mutable_cluster()->set_num_servers(0);
              c->mutable_cluster()->add_servers("h1:5000");
              c->mutable_cluster()->add_servers("h2:5000");
            }));
}

void ExpectBalanced(const Partitioner& p, const std::vector<uint64_t>& keys) {
  std::vector<std::vector<uint32_t>> split;
  p.SplitKeysByServer(keys, &split);
  ASSERT_EQ(split.size(), p.num_servers());
  const double even = static_cast<double>(keys.size()) / p.num_servers();
  for (uint32_t s = 0; s < p.num_servers(); ++s) {
    EXPECT_NEAR(split[s].size(), even, 0.02 * even) << "server " << s << " of " << p.num_servers();
  }
}

TEST(Partitioner, KeysSpreadEvenlyOverServers) {
  std::vector<uint64_t> sequential(1000000), random(1000000);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i < sequential.size(); ++i) {
    sequential[i] = i;
    random[i] = rng();
  }
  for (uint32_t n : {2u, 3u, 4u, 8u}) {
    ps::JobConfig config = SmallConfig();
    config.mutable_cluster()->set_num_servers(n);
    Partitioner p = MustCreate(config);
    ExpectBalanced(p, sequential);
    ExpectBalanced(p, random);
  }
}

TEST(Partitioner, SplitKeysByServerKeepsOrderAndDuplicates) {
  ps::JobConfig config = SmallConfig();
  config.mutable_cluster()->set_num_servers(4);
  Partitioner p = MustCreate(config);
  std::vector<uint64_t> keys = {5, 17, 5, 99, 1, 12345, 17, 0};
  std::vector<std::vector<uint32_t>> split(7, std::vector<uint32_t>{42});  // Stale content.
  p.SplitKeysByServer(keys, &split);
  ASSERT_EQ(split.size(), 4u);
  std::vector<int> seen(keys.size(), 0);
  for (uint32_t s = 0; s < 4; ++s) {
    EXPECT_TRUE(std::is_sorted(split[s].begin(), split[s].end()));
    for (uint32_t pos : split[s]) {
      ASSERT_LT(pos, keys.size());
      EXPECT_EQ(p.ServerForKey(keys[pos]), s);
      ++seen[pos];
    }
  }
  EXPECT_THAT(seen, testing::Each(1));
}

}  // namespace
}  // namespace ps::common
