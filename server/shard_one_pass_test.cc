// The one pass: SGD pushes of up to kOnePassMaxValues dense values are checked for
// non-finite values by their update itself (Shard::ApplyOnePass): bitwise equal to the
// optimizer, undone on a non-finite value or a refused admission, never seen half done, no
// buffers allocated in steady state, and only for the pushes it is meant for.
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/optimizer.h"
#include "server/shard.h"
#include "server/shard_testing.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using shard_testing::AllBlocks;
using shard_testing::Bytes;
using shard_testing::FirstWorkerPush;
using shard_testing::InPieces;
using shard_testing::MakeConfig;
using shard_testing::MakeShard;
using shard_testing::NonFiniteValues;
using shard_testing::ReadBlocks;
using shard_testing::Rejections;
using shard_testing::WholeTable;
using ::testing::HasSubstr;

// SGD with weight decay and value clipping (every step of the rule runs) on a dense table "w"
// of `numel` values in blocks of 4.
std::unique_ptr<Shard> MakeSgdShard(int numel) {
  return MakeShard(
      MakeConfig("kind: SGD learning_rate: 0.5 weight_decay: 0.01 clip_value: 0.7", 1, numel));
}

// What `pushes` SGD updates make of "w" (CONSTANT 1), by the optimizer itself.
std::vector<float> SgdReference(const Shard& shard, const std::vector<std::vector<float>>& pushes) {
  const common::TableInfo& info = *shard.partitioner().FindTable("w");
  kernels::OptimizerParams p;
  p.kind = kernels::OptimizerKind::kSgd;
  p.learning_rate = 0.5f;
  p.weight_decay = 0.01f;
  p.clip_value = 0.7f;
  std::vector<float> w(info.numel, 1.f);
  for (const std::vector<float>& g : pushes) {
    for (uint32_t blk = 0; blk < info.num_blocks; ++blk) {
      auto [begin, end] = shard.partitioner().BlockRange(info, blk);
      kernels::ApplyOptimizer(p, 1, absl::MakeSpan(w).subspan(begin, end - begin),
                              absl::MakeConstSpan(g).subspan(begin, end - begin), {});
    }
  }
  return w;
}

std::vector<float> Gradient(int numel, float scale) {
  std::vector<float> g(numel);
  for (int i = 0; i < numel; ++i) g[i] = scale * std::sin(0.37f * i) * (1 + i % 5);
  return g;
}

TEST(Shard, OnePassUpdatesEqualTheOptimizerBitwise) {
  // Whole payloads and payloads in pieces at odd addresses, over 250 blocks.
  auto shard = MakeSgdShard(1000);
  const std::vector<float> g1 = Gradient(1000, 1.5f), g2 = Gradient(1000, -0.25f);
  const PushTable whole = WholeTable(*shard, g1);
  ASSERT_THAT(shard->Push(FirstWorkerPush(*shard, &whole, 1)).status(), IsOk());
  std::string storage;
  std::vector<std::vector<absl::string_view>> pieces;
  const PushTable second = WholeTable(*shard, g2);
  const PushTable cut = InPieces(second, &storage, &pieces);
  ASSERT_THAT(shard->Push(FirstWorkerPush(*shard, &cut, 2)).status(), IsOk());
  EXPECT_EQ(shard->one_pass_pushes(), 2u);
  EXPECT_EQ(shard->updates_applied(), 2u);
  const std::vector<float> got = ReadBlocks(*shard, "w", AllBlocks(*shard));
  const std::vector<float> want = SgdReference(*shard, {g1, g2});
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

TEST(Shard, AOnePassPushWithANonFiniteValueChangesNothingAndCanBeSentAgain) {
  auto shard = MakeSgdShard(1000);
  auto snapshot = [&] {
    std::map<std::string, std::string> records;
    EXPECT_THAT(shard
                    ->Snapshot(
                        [&](absl::string_view k, absl::string_view v) {
                          records[std::string(k)] = std::string(v);
                          return absl::OkStatus();
                        },
                        1 << 12)
                    .status(),
                IsOk());
    return records;  // the parameters and each block's step
  };
  const std::vector<float> good = Gradient(1000, 1.f);
  const PushTable first = WholeTable(*shard, good);
  ASSERT_THAT(shard->Push(FirstWorkerPush(*shard, &first, 1)).status(), IsOk());
  const auto before = snapshot();
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    std::vector<float> g = Gradient(1000, 2.f);
    g[998] = bad;  // in the last block: every block before it was updated, then undone
    const PushTable table = WholeTable(*shard, g);
    EXPECT_THAT(shard->Push(FirstWorkerPush(*shard, &table, 2)).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("block 249: 1 non-finite values (first at index 2")));
    EXPECT_EQ(snapshot(), before);
  }
  EXPECT_EQ(shard->one_pass_pushes(), 3u);
  EXPECT_EQ(shard->updates_applied(), 1u);
  EXPECT_EQ(NonFiniteValues(*shard), 2u);
  EXPECT_EQ(Rejections(*shard), "nonfinite=2 ");
  // Nothing was admitted: the same sequence with finite values is applied, once.
  const std::vector<float> again = Gradient(1000, 2.f);
  const PushTable fixed = WholeTable(*shard, again);
  auto result = shard->Push(FirstWorkerPush(*shard, &fixed, 2));
  ASSERT_THAT(result.status(), IsOk());
  EXPECT_FALSE(result->duplicate);
  result = shard->Push(FirstWorkerPush(*shard, &fixed, 2));
  ASSERT_THAT(result.status(), IsOk());
  EXPECT_TRUE(result->duplicate);
  const std::vector<float> got = ReadBlocks(*shard, "w", AllBlocks(*shard));
  const std::vector<float> want = SgdReference(*shard, {good, again});
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

TEST(Shard, OnePassPushesAllocateNoBuffersInSteadyState) {
  // 250 blocks of 4 values, pushed from a new thread (it has no undo buffer yet): the first
  // push allocates the thread's buffer, every later one (kept, refused for a NaN, or a
  // duplicate) reuses it.
  auto shard = MakeSgdShard(1000);
  const std::vector<float> g = Gradient(1000, 1.f);
  const PushTable table = WholeTable(*shard, g);
  std::vector<float> bad = g;
  bad[500] = std::numeric_limits<float>::quiet_NaN();
  const PushTable refused = WholeTable(*shard, bad);
  std::thread pusher([&] {
    ASSERT_THAT(shard->Push(FirstWorkerPush(*shard, &table, 1)).status(), IsOk());
    EXPECT_EQ(shard->one_pass_buffers_allocated(), 1u);
    for (uint64_t seq = 2; seq <= 10; ++seq) {
      ASSERT_THAT(shard->Push(FirstWorkerPush(*shard, &table, seq)).status(), IsOk());
    }
    ASSERT_THAT(shard->Push(FirstWorkerPush(*shard, &table, 10)).status(), IsOk());  // again
    EXPECT_THAT(shard->Push(FirstWorkerPush(*shard, &refused, 11)).status(),
                StatusIs(absl::StatusCode::kInvalidArgument));
    ASSERT_THAT(shard->Push(FirstWorkerPush(*shard, &table, 11)).status(), IsOk());
  });
  pusher.join();
  EXPECT_EQ(shard->one_pass_pushes(), 13u);
  EXPECT_EQ(shard->updates_applied(), 11u);
  EXPECT_EQ(shard->one_pass_buffers_allocated(), 1u) << "a push allocated a new buffer";
}

TEST(Shard, AOnePassPushNamingABlockTwiceUpdatesItTwiceInOrder) {
  // Weight decay makes the second update depend on the first's result. Block 7 is named a
  // second time with another gradient: it must end as two updates, the named order.
  auto shard = MakeSgdShard(100);
  const std::vector<float> g = Gradient(100, 1.f), again = Gradient(100, -3.f);
  PushTable table = WholeTable(*shard, g);
  auto [begin, end] = shard->partitioner().BlockRange(*shard->partitioner().FindTable("w"), 7);
  table.blocks.push_back({7, Bytes(absl::MakeConstSpan(again).subspan(begin, end - begin))});
  ASSERT_THAT(shard->Push(FirstWorkerPush(*shard, &table, 1)).status(), IsOk());
  EXPECT_EQ(shard->one_pass_pushes(), 1u);
  std::vector<float> second(100, 0.f);  // a second update of block 7 only
  std::copy(again.begin() + begin, again.begin() + end, second.begin() + begin);
  std::vector<float> want = SgdReference(*shard, {g, second});
  // SgdReference updated every block twice; blocks other than 7 were updated once.
  const std::vector<float> once = SgdReference(*shard, {g});
  for (size_t i = 0; i < want.size(); ++i) {
    if (i < begin || i >= end) want[i] = once[i];
  }
  const std::vector<float> got = ReadBlocks(*shard, "w", AllBlocks(*shard));
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);

  // The same with a NaN in the second naming: refused, and nothing changes.
  std::vector<float> bad = again;
  bad[begin] = std::numeric_limits<float>::quiet_NaN();
  PushTable refused = WholeTable(*shard, g);
  refused.blocks.push_back({7, Bytes(absl::MakeConstSpan(bad).subspan(begin, end - begin))});
  EXPECT_THAT(shard->Push(FirstWorkerPush(*shard, &refused, 2)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  const std::vector<float> after = ReadBlocks(*shard, "w", AllBlocks(*shard));
  EXPECT_EQ(std::memcmp(after.data(), got.data(), got.size() * sizeof(float)), 0);
  EXPECT_EQ(shard->updates_applied(), 1u);
}

TEST(Shard, AOnePassPushRefusedAtAdmissionChangesNothing) {
  auto shard = MakeSgdShard(100);
  const std::vector<float> g = Gradient(100, 1.f);  // the table's payloads point into it
  const PushTable table = WholeTable(*shard, g);
  PushView newer = FirstWorkerPush(*shard, &table, 1);
  newer.info.worker_incarnation = 2;
  ASSERT_THAT(shard->Push(newer).status(), IsOk());
  const std::vector<float> before = ReadBlocks(*shard, "w", AllBlocks(*shard));
  // Incarnation 1 is older than the worker's current one: refused after its update ran.
  EXPECT_THAT(shard->Push(FirstWorkerPush(*shard, &table, 2)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  const std::vector<float> after = ReadBlocks(*shard, "w", AllBlocks(*shard));
  EXPECT_EQ(std::memcmp(after.data(), before.data(), after.size() * sizeof(float)), 0);
  EXPECT_EQ(shard->one_pass_pushes(), 2u);
  EXPECT_EQ(shard->updates_applied(), 1u);
}

TEST(Shard, NoReaderSeesAOnePassUpdateThatIsUndone) {
  // Every push holds a NaN in its last block and is refused. While they run, a reader takes
  // whole copies of the table through the shard's pull entry: each must be the table as it
  // was, never one with the earlier blocks updated.
  auto shard = MakeSgdShard(4096);
  std::vector<float> g = Gradient(4096, 1.f);
  g.back() = std::numeric_limits<float>::quiet_NaN();
  const PushTable table = WholeTable(*shard, g);
  const std::vector<float> initial = ReadBlocks(*shard, "w", AllBlocks(*shard));
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!done.load()) {
      const std::vector<float> seen = ReadBlocks(*shard, "w", AllBlocks(*shard));
      if (std::memcmp(seen.data(), initial.data(), seen.size() * sizeof(float)) != 0) ++torn;
    }
  });
  for (int i = 0; i < 300; ++i) {
    EXPECT_THAT(shard->Push(FirstWorkerPush(*shard, &table, 1)).status(),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
  done.store(true);
  reader.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_EQ(shard->one_pass_pushes(), 300u);
}

// Beyond kOnePassMaxValues, or with another rule, the values are checked before the update.
TEST(Shard, OnlySmallSgdPushesTakeTheOnePass) {
  auto adam = MakeShard(MakeConfig("kind: ADAM learning_rate: 0.01", 1, 100));
  const std::vector<float> g = Gradient(100, 1.f);
  const PushTable small = WholeTable(*adam, g);
  ASSERT_THAT(adam->Push(FirstWorkerPush(*adam, &small, 1)).status(), IsOk());
  EXPECT_EQ(adam->one_pass_pushes(), 0u);
  const int big = static_cast<int>(kOnePassMaxValues) + 4;
  auto sgd = MakeSgdShard(big);
  const std::vector<float> g_big = Gradient(big, 1.f);
  const PushTable large = WholeTable(*sgd, g_big);
  ASSERT_THAT(sgd->Push(FirstWorkerPush(*sgd, &large, 1)).status(), IsOk());
  EXPECT_EQ(sgd->one_pass_pushes(), 0u);
}

TEST(Shard, AnSgdPushOfKOnePassMaxValuesTakesTheOnePassAndOneMoreDoesNot) {
  for (size_t values : {kOnePassMaxValues, kOnePassMaxValues + 1}) {
    SCOPED_TRACE(absl::StrCat(values, " values"));
    auto sgd = MakeSgdShard(static_cast<int>(values));
    const std::vector<float> g = Gradient(static_cast<int>(values), 1.f);
    const PushTable table = WholeTable(*sgd, g);
    ASSERT_THAT(sgd->Push(FirstWorkerPush(*sgd, &table, 1)).status(), IsOk());
    EXPECT_EQ(sgd->one_pass_pushes(), values <= kOnePassMaxValues ? 1u : 0u);
  }
}

}  // namespace
}  // namespace ps::server
