#include "server/shard.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/codec.h"
#include "common/config/config.h"
#include "common/parameter_store.h"
#include "common/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/in_process_store.h"
#include "server/shard_testing.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using shard_testing::Bytes;
using shard_testing::MakeConfig;
using shard_testing::MakeShard;
using shard_testing::ReadBlocks;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// The blocks (dense) or rows (sparse) `shard` holds of `table`, from its Stats.
uint64_t RowsOf(Shard& shard, const std::string& table) {
  StatsResponse stats;
  shard.FillStats(&stats);
  for (const auto& t : stats.tables()) {
    if (t.name() == table) return t.rows();
  }
  return 0;
}

// The whole dense table "w" through an in-process store.
std::vector<float> PullDense(common::ParameterStore& store, const std::string& table, size_t n) {
  std::vector<float> out(n);
  common::PullBatch batch;
  batch.dense.push_back({table, absl::MakeSpan(out)});
  CHECK_OK(store.Pull(batch, {}));
  return out;
}

std::vector<float> PullRows(common::ParameterStore& store, std::vector<uint64_t> keys) {
  std::vector<float> out(keys.size() * 3);
  common::PullBatch batch;
  batch.sparse.push_back({"emb", keys, absl::MakeSpan(out)});
  CHECK_OK(store.Pull(batch, {}));
  return out;
}

// Makes rows `keys` of "emb" (reads make none): a push of zero gradients.
void MakeRows(common::ParameterStore& store, const std::vector<uint64_t>& keys, int64_t clock) {
  std::vector<float> rows(keys.size() * 3, 0.f);
  common::PushBatch batch;
  batch.sparse.push_back({"emb", keys, rows});
  CHECK_OK(store.Push(batch, {clock, false}));
}

// Pushes the same gradient `g` to every element of "w" and to rows `keys` of "emb".
void PushAll(common::ParameterStore& store, float g, size_t numel,
             const std::vector<uint64_t>& keys, int64_t clock = 1) {
  std::vector<float> dense(numel, g), rows(keys.size() * 3, g);
  common::PushBatch batch;
  batch.dense.push_back({"w", dense});
  batch.sparse.push_back({"emb", keys, rows});
  CHECK_OK(store.Push(batch, {clock, false}));
}

// ---- Optimizers through the server path, against independent per-element references -----

struct OptimizerCase {
  std::string name;
  std::string config;
  // Reference: parameter after the gradients `gs`, starting at w0.
  std::function<float(float w0, const std::vector<float>& gs)> reference;
};

std::vector<OptimizerCase> OptimizerCases() {
  return {
      {"sgd", "kind: SGD learning_rate: 0.1",
       [](float w, const std::vector<float>& gs) {
         for (float g : gs) w -= 0.1f * g;
         return w;
       }},
      {"momentum", "kind: MOMENTUM learning_rate: 0.1 momentum: 0.9",
       [](float w, const std::vector<float>& gs) {
         float v = 0;
         for (float g : gs) {
           v = 0.9f * v + g;
           w -= 0.1f * v;
         }
         return w;
       }},
      {"nesterov", "kind: MOMENTUM learning_rate: 0.1 momentum: 0.9 nesterov: true",
       [](float w, const std::vector<float>& gs) {
         float v = 0;
         for (float g : gs) {
           v = 0.9f * v + g;
           w -= 0.1f * (g + 0.9f * v);
         }
         return w;
       }},
      {"adagrad", "kind: ADAGRAD learning_rate: 0.5 initial_accumulator: 0.1 epsilon: 1e-7",
       [](float w, const std::vector<float>& gs) {
         double a = 0.1;
         for (float g : gs) {
           a += double{g} * g;
           w -= static_cast<float>(0.5 * g / (std::sqrt(a) + 1e-7));
         }
         return w;
       }},
      {"adam", "kind: ADAM learning_rate: 0.01 beta1: 0.9 beta2: 0.999 epsilon: 1e-8",
       [](float w, const std::vector<float>& gs) {
         double m = 0, v = 0;
         int t = 0;
         for (float g : gs) {
           ++t;
           m = 0.9 * m + 0.1 * g;
           v = 0.999 * v + 0.001 * g * g;
           const double mh = m / (1 - std::pow(0.9, t)), vh = v / (1 - std::pow(0.999, t));
           w -= static_cast<float>(0.01 * mh / (std::sqrt(vh) + 1e-8));
         }
         return w;
       }},
      {"ftrl", "kind: FTRL learning_rate: 0.1 l1: 0.01 l2: 0.001 ftrl_beta: 1",
       [](float w, const std::vector<float>& gs) {
         double z = 0, n = 0, wd = w;
         for (float g : gs) {
           const double n2 = n + double{g} * g;
           const double sigma = (std::sqrt(n2) - std::sqrt(n)) / 0.1;
           z += g - sigma * wd;
           n = n2;
           wd = std::abs(z) <= 0.01
                    ? 0.0
                    : -(z - (z > 0 ? 1 : -1) * 0.01) / ((1 + std::sqrt(n)) / 0.1 + 0.001);
         }
         return static_cast<float>(wd);
       }},
  };
}

class ShardOptimizerTest : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(ShardOptimizerTest, DenseAndSparseUpdatesMatchReference) {
  const OptimizerCase& c = GetParam();
  JobConfig config = MakeConfig(c.config);
  auto shard = MakeShard(config);
  InProcessStoreOptions options;
  auto store = *InProcessParameterStore::Create({shard.get()}, options);
  const std::vector<float> gs = {0.5f, -1.25f, 2.0f};
  for (size_t i = 0; i < gs.size(); ++i) PushAll(*store, gs[i], 10, {7, 99}, i + 1);
  const float want_dense = c.reference(1.0f, gs);
  const float want_sparse = c.reference(0.5f, gs);
  for (float v : PullDense(*store, "w", 10)) EXPECT_NEAR(v, want_dense, 1e-5) << c.name;
  for (float v : PullRows(*store, {7, 99})) EXPECT_NEAR(v, want_sparse, 1e-5) << c.name;
  // Untouched rows keep their initial value.
  for (float v : PullRows(*store, {12345})) EXPECT_EQ(v, 0.5f);
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, ShardOptimizerTest,
                         ::testing::ValuesIn(OptimizerCases()),
                         [](const auto& info) { return info.param.name; });

TEST(Shard, WeightDecayAndClippingApplyOnTheServer) {
  // g' = clip(g + 0.5 * w, 1) = clip(3 + 0.5, 1) = 1 -> w = 1 - 0.1.
  auto shard = MakeShard(MakeConfig("kind: SGD learning_rate: 0.1 weight_decay: 0.5 clip_value: 1"));
  auto store = *InProcessParameterStore::Create({shard.get()}, {});
  PushAll(*store, 3.0f, 10, {});
  for (float v : PullDense(*store, "w", 10)) EXPECT_NEAR(v, 0.9f, 1e-6);
}

// ---- Layout ------------------------------------------------------------------------------

TEST(Shard, TwoShardsSplitTheTableAndTheStoreReassemblesIt) {
  JobConfig config = MakeConfig("kind: SGD learning_rate: 1", /*num_servers=*/2, /*numel=*/10);
  auto s0 = MakeShard(config, 0), s1 = MakeShard(config, 1);
  // 10 values in blocks of 4: blocks 0,1,2; each block on exactly one server (the other
  // refuses it).
  EXPECT_EQ(RowsOf(*s0, "w") + RowsOf(*s1, "w"), 3u);
  RequestInfo reader;
  reader.worker_id = -1;
  reader.layout_fingerprint = s0->partitioner().layout_fingerprint();
  for (uint32_t b = 0; b < 3; ++b) {
    const std::vector<uint32_t> block = {b};
    const PullTable pull{"w", ENCODING_FLOAT32, block, {}};
    EXPECT_NE(s0->CheckPull(reader, {pull}).ok(), s1->CheckPull(reader, {pull}).ok()) << b;
  }
  auto store = *InProcessParameterStore::Create({s0.get(), s1.get()}, {});
  std::vector<float> g(10);
  for (int i = 0; i < 10; ++i) g[i] = static_cast<float>(i);
  common::PushBatch batch;
  batch.dense.push_back({"w", g});
  ASSERT_THAT(store->Push(batch, {1, false}), IsOk());
  std::vector<float> want(10);
  for (int i = 0; i < 10; ++i) want[i] = 1.0f - i;
  EXPECT_THAT(PullDense(*store, "w", 10), ElementsAreArray(want));
  // Sparse keys land on their owner only.
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 200; ++k) keys.push_back(k);
  PushAll(*store, 1.0f, 10, keys, 2);
  EXPECT_EQ(RowsOf(*s0, "emb") + RowsOf(*s1, "emb"), 200u);
  EXPECT_GT(RowsOf(*s0, "emb"), 50u);
  EXPECT_GT(RowsOf(*s1, "emb"), 50u);
  for (float v : PullRows(*store, keys)) EXPECT_FLOAT_EQ(v, -0.5f);
}

// A pull read out of the tables with non-temporal stores (ShardOptions::stream_pull_bytes, or
// asked for by the caller) gives the values a plain read gives, every block, the short last
// one too.
TEST(Shard, APullStreamedOutOfTheTablesReadsWhatAPlainOneReads) {
  JobConfig config = MakeConfig("kind: SGD learning_rate: 1", /*num_servers=*/1, /*numel=*/1003);
  auto plain = MakeShard(config);
  ShardOptions options;
  options.stream_pull_bytes = 0;
  auto streamed = *Shard::Create(config, options);
  std::vector<float> g(1003);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * static_cast<float>(i % 37) - 3.0f;
  common::PushBatch batch;
  batch.dense.push_back({"w", g});
  for (Shard* shard : {plain.get(), streamed.get()}) {
    auto store = *InProcessParameterStore::Create({shard}, {});
    ASSERT_THAT(store->Push(batch, {1, false}), IsOk());
  }
  std::vector<uint32_t> blocks;
  for (uint32_t b = 0; b < 251; ++b) blocks.push_back(b);
  const std::vector<float> want = ReadBlocks(*plain, "w", blocks);
  ASSERT_EQ(want.size(), 1003u);
  EXPECT_FLOAT_EQ(want[5], 1.0f - g[5]);
  EXPECT_EQ(ReadBlocks(*streamed, "w", blocks), want);
  EXPECT_EQ(ReadBlocks(*plain, "w", blocks, /*stream=*/true), want);
}

TEST(Shard, CreateStopsAllocatingOnceCancelledFromAnotherThread) {
  // 16M floats in 256 blocks. The stop is set by another thread while the table is half
  // initialized: at the 128th question Create waits until it is set.
  auto config = common::ParseJobConfigText(R"pb(
    cluster { num_servers: 1 num_workers: 1 dense_block_floats: 65536 }
    tables { name: "w" kind: TABLE_KIND_DENSE shape: 16777216
             initializer { kind: NORMAL stddev: 0.1 } optimizer { kind: SGD } }
  )pb", "test");
  ASSERT_THAT(config.status(), IsOk());
  std::atomic<bool> stop{false};
  absl::Notification asked, set;
  std::thread signal_thread([&] {
    asked.WaitForNotification();
    stop = true;
    set.Notify();
  });
  int questions = 0;
  ShardOptions options;
  options.cancelled = [&] {
    if (++questions == 128) {
      asked.Notify();
      set.WaitForNotification();
    }
    return stop.load();
  };
  auto shard = Shard::Create(*config, options);
  signal_thread.join();
  EXPECT_THAT(shard.status(), StatusIs(absl::StatusCode::kCancelled,
                                       HasSubstr("cancelled while allocating the tables")));
  // No block was allocated after the stop: asked once more by Create itself, that is all.
  EXPECT_EQ(questions, 129);
}

TEST(Shard, CreateRejectsServerIndexOutOfRange) {
  ShardOptions options;
  options.server_index = 2;
  EXPECT_THAT(Shard::Create(MakeConfig("kind: SGD", 2), options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("server index 2")));
}

// ---- Exactly-once -----------------------------------------------------------------------

// A push of gradient 1 for every value of block 0 of "w", as worker 0 (incarnation 3),
// sequence 1, clock 1.
struct PushOfOnes {
  explicit PushOfOnes(const Shard& shard) {
    table.table = "w";
    table.blocks = {{0, Bytes(g)}};
    push.info.worker_id = 0;
    push.info.worker_incarnation = 3;
    push.info.sequence = 1;
    push.info.clock = 1;
    push.info.layout_fingerprint = shard.partitioner().layout_fingerprint();
    push.tables = absl::MakeConstSpan(&table, 1);
  }
  PushOfOnes(const PushOfOnes&) = delete;  // `push` points into `table`, `table` into `g`
  PushOfOnes& operator=(const PushOfOnes&) = delete;

  std::vector<float> g = std::vector<float>(4, 1.0f);
  PushTable table;
  PushView push;
};

TEST(Shard, DuplicatePushIsAppliedOnce) {
  auto shard = MakeShard(MakeConfig("kind: SGD learning_rate: 1"));
  PushOfOnes ones(*shard);
  PushView& push = ones.push;
  auto first = shard->Push(push);
  auto again = shard->Push(push);
  ASSERT_THAT(first.status(), IsOk());
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_FALSE(first->duplicate);
  EXPECT_TRUE(again->duplicate);
  EXPECT_THAT(ReadBlocks(*shard, "w", {0}), ElementsAreArray({0.f, 0.f, 0.f, 0.f}));
  StatsResponse stats;
  shard->FillStats(&stats);
  EXPECT_EQ(stats.updates_applied(), 1u);
  EXPECT_EQ(stats.duplicate_pushes(), 1u);
}

// A retry of a push the tracker gave up on (WorkerTracker::kMaxAbove later pushes were
// applied while it was missing) is refused `sequence_given_up` and applies nothing; it used
// to be acknowledged as a duplicate although it was never applied.
TEST(Shard, APushGivenUpIsRefusedAndAppliesNothing) {
  auto shard = MakeShard(MakeConfig("kind: SGD learning_rate: 1"));
  PushOfOnes ones(*shard);
  PushView& push = ones.push;
  for (uint64_t s = 2; s <= WorkerTracker::kMaxAbove + 2; ++s) {
    push.info.sequence = s;
    ASSERT_THAT(shard->Push(push).status(), IsOk());
  }
  const std::vector<float> before = ReadBlocks(*shard, "w", {0});
  push.info.sequence = 1;
  const absl::StatusOr<PushResult> late = shard->Push(push);
  EXPECT_THAT(late.status(), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(RejectionReason(late.status()), "sequence_given_up");
  EXPECT_EQ(ReadBlocks(*shard, "w", {0}), before);
  StatsResponse stats;
  shard->FillStats(&stats);
  EXPECT_EQ(stats.updates_applied(), WorkerTracker::kMaxAbove + 1);
  EXPECT_EQ(stats.duplicate_pushes(), 0u);
}

// A retry of a push whose first attempt is still being applied is not acknowledged before
// that attempt is: at its deadline it is DEADLINE_EXCEEDED, not an OK for an update under way.
TEST(Shard, ADuplicateIsNotAcknowledgedBeforeTheAttemptItRepeatsIsApplied) {
  auto shard = MakeShard(MakeConfig("kind: SGD learning_rate: 1"));
  PushOfOnes ones(*shard);
  PushView& push = ones.push;
  // The first attempt: admitted, its apply under way.
  auto first = shard->workers().Admit(0, 3, 1);
  ASSERT_THAT(first.status(), IsOk());
  ASSERT_EQ(*first, WorkerTracker::Admission::kApply);
  push.info.deadline = absl::Now() + absl::Milliseconds(20);
  EXPECT_THAT(shard->Push(push).status(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  StatsResponse stats;
  shard->FillStats(&stats);
  EXPECT_EQ(stats.duplicate_pushes(), 0u);
  EXPECT_EQ(
      stats.rejected().count("duplicate_pending") ? stats.rejected().at("duplicate_pending") : 0u,
      1u);
  // Once it is applied, the retry is answered as a duplicate (and applies nothing).
  shard->workers().AdvanceClock(0, 3, 1, /*sequence=*/1);
  push.info.deadline = absl::Now() + absl::Seconds(60);
  auto again = shard->Push(push);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_TRUE(again->duplicate);
  EXPECT_THAT(ReadBlocks(*shard, "w", {0}), ElementsAreArray({1.f, 1.f, 1.f, 1.f}));
}

TEST(Shard, StatsSayHowLongPushesAndPullsSpentInTheTables) {
  auto shard = MakeShard(MakeConfig("kind: ADAM", 1, 4000));
  StatsResponse stats;
  shard->FillStats(&stats);
  EXPECT_EQ(stats.push_check_s(), 0);
  EXPECT_EQ(stats.push_apply_s(), 0);
  EXPECT_EQ(stats.pull_read_s(), 0);
  std::vector<float> g(4, 1.0f);
  PushTable table;
  table.table = "w";
  table.blocks = {{0, Bytes(g)}};
  ASSERT_THAT(shard->Push(shard_testing::FirstWorkerPush(*shard, &table)).status(), IsOk());
  shard->FillStats(&stats);
  EXPECT_GT(stats.push_check_s(), 0);
  EXPECT_GT(stats.push_apply_s(), 0);
  EXPECT_EQ(stats.pull_read_s(), 0);
  const double check = stats.push_check_s(), apply = stats.push_apply_s();
  ReadBlocks(*shard, "w", {0, 1, 2});
  shard->FillStats(&stats);
  EXPECT_GT(stats.pull_read_s(), 0);
  EXPECT_EQ(stats.push_check_s(), check);
  EXPECT_EQ(stats.push_apply_s(), apply);
}

// ---- Snapshots ---------------------------------------------------------------------------

using Records = std::map<std::string, std::string>;

absl::StatusOr<CheckpointMeta> SnapshotTo(Shard& shard, Records* records) {
  return shard.Snapshot(
      [records](absl::string_view k, absl::string_view v) {
        (*records)[std::string(k)] = std::string(v);
        return absl::OkStatus();
      },
      1 << 12);
}

std::unique_ptr<Shard> RestoreFrom(const JobConfig& config, const CheckpointMeta& meta,
                                   const Records& records) {
  auto shard = MakeShard(config);
  CHECK_OK(shard->BeginRestore(meta));
  for (const auto& [k, v] : records) CHECK_OK(shard->RestoreRecord(k, v));
  shard->EndRestore(meta);
  return shard;
}

TEST(Shard, SnapshotRoundTripIsBitwiseWithAdamSlots) {
  JobConfig config = MakeConfig("kind: ADAM learning_rate: 0.01");
  auto shard = MakeShard(config);
  auto store = *InProcessParameterStore::Create({shard.get()}, {});
  PushAll(*store, 0.3f, 10, {1, 2, 3}, 1);
  PushAll(*store, -0.7f, 10, {2, 3, 4}, 2);
  Records records;
  auto meta = SnapshotTo(*shard, &records);
  ASSERT_THAT(meta.status(), IsOk());
  auto restored = RestoreFrom(config, *meta, records);
  // Each table's count of updates comes back too (it restarted at 0 before 2026-12-05).
  StatsResponse before, after;
  shard->FillStats(&before);
  restored->FillStats(&after);
  ASSERT_EQ(after.tables_size(), before.tables_size());
  for (int i = 0; i < before.tables_size(); ++i) {
    EXPECT_GT(before.tables(i).updates_applied(), 0u);
    EXPECT_EQ(after.tables(i).updates_applied(), before.tables(i).updates_applied());
  }
  auto store2 = *InProcessParameterStore::Create({restored.get()}, {});
  EXPECT_THAT(PullDense(*store2, "w", 10), ElementsAreArray(PullDense(*store, "w", 10)));
  EXPECT_THAT(PullRows(*store2, {1, 2, 3, 4}), ElementsAreArray(PullRows(*store, {1, 2, 3, 4})));
  // Same slots and step counts: one more identical push gives identical results.
  auto store3 = *InProcessParameterStore::Create({restored.get()}, {0, 2});
  PushAll(*store, 0.9f, 10, {1, 4}, 3);
  PushAll(*store3, 0.9f, 10, {1, 4}, 3);
  EXPECT_THAT(PullDense(*store3, "w", 10), ElementsAreArray(PullDense(*store, "w", 10)));
  EXPECT_THAT(PullRows(*store3, {1, 2, 3, 4}), ElementsAreArray(PullRows(*store, {1, 2, 3, 4})));
}

// Five snapshots of `shard` while SGD pushes (lr 1, gradient 1) run, each restored into a new
// shard: after k pushes every dense value must be 1 - k, and every row of `keys` (touched by
// all pushes) 0.5 - k. A torn snapshot mixes values of different k.
void ExpectSnapshotsAreCuts(const JobConfig& config, Shard& shard,
                            const InProcessStoreOptions& options, int numel,
                            const std::vector<uint64_t>& keys) {
  for (int round = 0; round < 5; ++round) {
    Records records;
    auto meta = SnapshotTo(shard, &records);
    ASSERT_THAT(meta.status(), IsOk());
    auto restored = RestoreFrom(config, *meta, records);
    auto store = *InProcessParameterStore::Create({restored.get()}, options);
    const float k = static_cast<float>(meta->updates_applied());
    for (float v : PullDense(*store, "w", numel)) ASSERT_EQ(v, 1.0f - k);
    if (meta->updates_applied() > 0 && !keys.empty()) {
      for (float v : PullRows(*store, keys)) ASSERT_EQ(v, 0.5f - k);
    }
  }
}

TEST(Shard, SnapshotUnderConcurrentPushesIsAConsistentCut) {
  // SGD with lr 1 and gradient 1 everywhere: after k pushes every value is 1 - k (dense) and
  // 0.5 - k (sparse rows touched by all pushes). A torn snapshot would mix values of
  // different k across blocks and rows.
  const int numel = 4000;
  JobConfig config = MakeConfig("kind: SGD learning_rate: 1", 1, numel);
  auto shard = MakeShard(config);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 500; ++k) keys.push_back(k);
  InProcessStoreOptions options;
  options.worker_id = 0;  // pushes need a worker slot
  options.worker_incarnation = 1;
  auto store = *InProcessParameterStore::Create({shard.get()}, options);
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    while (!stop) PushAll(*store, 1.0f, numel, keys);
  });
  ExpectSnapshotsAreCuts(config, *shard, options, numel, keys);
  stop = true;
  pusher.join();
}

TEST(Shard, SnapshotUnderConcurrentOnePassPushesIsAConsistentCut) {
  // Dense-only SGD pushes of 4000 values take the one pass (every block updated under its
  // lock, the old values kept until the push is admitted): a snapshot must still hold each
  // block as of one cut, 1 - k everywhere.
  const int numel = 4000;
  JobConfig config = MakeConfig("kind: SGD learning_rate: 1", 1, numel);
  auto shard = MakeShard(config);
  InProcessStoreOptions options;
  options.worker_id = 0;
  options.worker_incarnation = 1;
  auto store = *InProcessParameterStore::Create({shard.get()}, options);
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    const std::vector<float> ones(numel, 1.f);
    common::PushBatch batch;
    batch.dense.push_back({"w", ones});
    while (!stop) CHECK_OK(store->Push(batch, {1, false}));
  });
  {
    auto join = absl::MakeCleanup([&] {  // also when an assertion below ends the test
      stop = true;
      pusher.join();
    });
    // Snapshots until at least 20 pushes ran among them (a bounded number of rounds).
    const absl::Time give_up = absl::Now() + absl::Seconds(60);  // a pusher that never pushes
    while (shard->updates_applied() == 0 && absl::Now() < give_up) std::this_thread::yield();
    ASSERT_GT(shard->updates_applied(), 0u) << "no push ran";
    const uint64_t first = shard->updates_applied();
    for (int rounds = 0; rounds < 200 && shard->updates_applied() < first + 20; ++rounds) {
      ExpectSnapshotsAreCuts(config, *shard, options, numel, {});
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GE(shard->updates_applied(), 21u);
  EXPECT_EQ(shard->one_pass_pushes(), shard->updates_applied());
}

// A checkpoint's row count is the rows its records hold: a row a push creates while the
// snapshot is written is in neither (it was counted, found in review 2026-12-05).
TEST(Shard, ACheckpointCountsTheRowsItsRecordsHold) {
  JobConfig config = MakeConfig("kind: SGD");
  auto shard = MakeShard(config);
  auto store = *InProcessParameterStore::Create({shard.get()}, {0, 1});
  MakeRows(*store, {1, 2, 3}, 1);
  Records records;
  bool pulled = false;
  auto meta = shard->Snapshot(
      [&](absl::string_view k, absl::string_view v) {
        if (!pulled) {
          pulled = true;
          MakeRows(*store, {100, 101, 102, 103}, 2);  // new rows, after the cut
        }
        records[std::string(k)] = std::string(v);
        return absl::OkStatus();
      },
      1 << 12);
  ASSERT_THAT(meta.status(), IsOk());
  ASSERT_TRUE(pulled);
  auto restored = RestoreFrom(config, *meta, records);
  StatsResponse stats;
  restored->FillStats(&stats);
  for (int i = 0; i < meta->tables_size(); ++i) {
    SCOPED_TRACE(meta->tables(i).name());
    ASSERT_EQ(stats.tables(i).name(), meta->tables(i).name());
    EXPECT_EQ(meta->tables(i).rows(), stats.tables(i).rows());
  }
  EXPECT_EQ(meta->tables(1).name(), "emb");
  EXPECT_EQ(meta->tables(1).rows(), 3u);
}

TEST(Shard, RestoreRefusesCheckpointOfAnotherLayoutOrOptimizer) {
  JobConfig config = MakeConfig("kind: ADAM");
  auto shard = MakeShard(config);
  Records records;
  auto meta = *SnapshotTo(*shard, &records);
  auto other_layout = MakeShard(MakeConfig("kind: ADAM", 1, /*numel=*/12));
  EXPECT_THAT(other_layout->BeginRestore(meta),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("layout")));
  auto other_optimizer = MakeShard(MakeConfig("kind: SGD"));
  EXPECT_THAT(other_optimizer->BeginRestore(meta),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("slots")));
}

// A checkpoint taken while the clock read 3 h later than this server's now (a clock set back
// since, or another host's): its worker keeps its incarnation and exactly-once state, judged
// by the checkpoint's clock (before 2026-12-05, by this server's, which dropped them).
TEST(Shard, RestoreJudgesIncarnationsByTheCheckpointsClock) {
  JobConfig config = MakeConfig("kind: SGD");
  auto shard = MakeShard(config);
  Records records;
  CheckpointMeta meta = *SnapshotTo(*shard, &records);
  const absl::Time then = absl::Now() + absl::Hours(3);
  const uint64_t incarnation = static_cast<uint64_t>(absl::ToUnixNanos(then));
  meta.set_unix_micros(absl::ToUnixMicros(then));
  WorkerCheckpoint* w = meta.add_workers();
  w->set_worker_id(0);
  w->set_incarnation(incarnation);
  w->set_applied_floor(4);
  w->set_data_offset(32);
  auto restored = RestoreFrom(config, meta, records);
  auto position = restored->workers().PositionOf(0);
  ASSERT_TRUE(position.has_value());
  EXPECT_EQ(position->incarnation, incarnation);
  EXPECT_EQ(*restored->workers().Admit(0, incarnation, 4), WorkerTracker::Admission::kDuplicate);
}

// Found by fuzz/pull_push_fuzzer: under SSP the bound computed clock - staleness on the
// request's clock, a signed overflow for INT64_MIN.
TEST(Shard, NegativeWorkerClockIsInvalidArgument) {
  JobConfig config = MakeConfig("kind: SGD");
  config.mutable_training()->set_staleness(1);
  auto shard = MakeShard(config);
  RequestInfo info;
  info.worker_id = 0;
  info.worker_incarnation = 1;
  info.sequence = 1;
  info.clock = std::numeric_limits<int64_t>::min();
  EXPECT_THAT(shard->BeginPull(info, absl::Now()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("clock")));
  info.layout_fingerprint = shard->partitioner().layout_fingerprint();
  EXPECT_THAT(shard->Push(PushView{info, false, {}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("clock")));
  EXPECT_EQ(shard->updates_applied(), 0u);
  info.worker_id = -1;  // a tool: no consistency bound, no clock
  EXPECT_THAT(shard->BeginPull(info, absl::Now()), IsOk());
}

// The same overflow through a checkpoint: a restored negative clock would overflow
// clock - slowest clock in the bound.
TEST(Shard, RestoreRefusesANegativeWorkerClock) {
  JobConfig config = MakeConfig("kind: SGD");
  auto shard = MakeShard(config);
  Records records;
  auto meta = *SnapshotTo(*shard, &records);
  WorkerCheckpoint* w = meta.add_workers();
  w->set_worker_id(0);
  w->set_clock(std::numeric_limits<int64_t>::min());
  EXPECT_THAT(MakeShard(config)->BeginRestore(meta),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("clock")));
  // Past 2^62: the worker refuses to resume from it, so every restart of it would fail.
  w->set_clock(common::kMaxClock + 1);
  EXPECT_THAT(MakeShard(config)->BeginRestore(meta),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("clock")));
}

// Found by fuzz/checkpoint_fuzzer: a restored step of -1 became 0 at the next push and failed
// ApplyOptimizer's DCHECK(step >= 1) (and INT64_MAX would overflow ++step). A sparse record
// with one bad row changes none of its rows.
TEST(Shard, RestoreRecordRejectsStepsUpdatesCannotContinueFrom) {
  JobConfig config = MakeConfig("kind: ADAM");
  auto shard = MakeShard(config);
  auto store = *InProcessParameterStore::Create({shard.get()}, {});
  PushAll(*store, 0.3f, 10, {1, 2}, 1);
  Records records;
  auto meta = SnapshotTo(*shard, &records);
  ASSERT_THAT(meta.status(), IsOk());
  // One dense block record, and one sparse record holding both rows (Adam: 3 * dim floats).
  std::string block_key, block, rows_key, rows;
  for (const auto& [key, value] : records) {
    if (key[0] == 'w' && block.empty()) std::tie(block_key, block) = std::tie(key, value);
    if (key[0] == 'e') std::tie(rows_key, rows) = std::make_tuple(key, rows + value);
  }
  constexpr size_t kRowEntry = 2 * sizeof(int64_t) + 3 * 3 * sizeof(float);
  ASSERT_EQ(rows.size(), 2 * kRowEntry);
  auto fresh = MakeShard(config);
  ASSERT_THAT(fresh->BeginRestore(*meta), IsOk());
  auto fresh_store = *InProcessParameterStore::Create({fresh.get()}, {});
  const std::vector<float> dense_before = PullDense(*fresh_store, "w", 10);
  const std::vector<float> rows_before = PullRows(*fresh_store, {1, 2});
  for (int64_t bad : {int64_t{-1}, std::numeric_limits<int64_t>::max()}) {
    std::string damaged_block = block, damaged_rows = rows;
    std::memcpy(&damaged_block[0], &bad, sizeof(bad));
    std::memcpy(&damaged_rows[kRowEntry + sizeof(uint64_t)], &bad, sizeof(bad));  // 2nd row
    EXPECT_THAT(fresh->RestoreRecord(block_key, damaged_block),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("step")));
    EXPECT_THAT(fresh->RestoreRecord(rows_key, damaged_rows),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("step")));
  }
  EXPECT_THAT(PullDense(*fresh_store, "w", 10), ElementsAreArray(dense_before));
  EXPECT_THAT(PullRows(*fresh_store, {1, 2}), ElementsAreArray(rows_before));
}

// A sparse record holding keys another server owns (another server's checkpoint, or a
// damaged key) is refused: the shard would otherwise serve rows no pull can reach.
TEST(Shard, RestoreRecordRejectsSparseKeysOfAnotherServer) {
  JobConfig config = MakeConfig("kind: SGD learning_rate: 0.1", /*num_servers=*/2);
  auto server0 = MakeShard(config, 0);
  const common::Partitioner& p = server0->partitioner();
  std::vector<uint64_t> own, other;
  for (uint64_t k = 1; own.empty() || other.empty(); ++k) {
    (p.ServerForKey(k) == 0 ? own : other).push_back(k);
  }
  // Rows of server 0 only: its own keys.
  auto peer = MakeShard(config, 1);
  auto store = *InProcessParameterStore::Create({server0.get(), peer.get()}, {});
  std::vector<float> rows(own.size() * 3, 0.25f);
  common::PushBatch push;
  push.sparse.push_back({"emb", own, rows});
  ASSERT_THAT(store->Push(push, {1, false}), IsOk());
  Records records;
  auto meta = SnapshotTo(*server0, &records);
  ASSERT_THAT(meta.status(), IsOk());
  // Server 1 restoring server 0's checkpoint.
  CheckpointMeta as_server1 = *meta;
  as_server1.set_server_index(1);
  auto server1 = MakeShard(config, 1);
  ASSERT_THAT(server1->BeginRestore(as_server1), IsOk());
  bool refused = false;
  for (const auto& [k, v] : records) {
    if (!absl::StartsWith(k, std::string("emb\0", 4))) continue;
    EXPECT_THAT(server1->RestoreRecord(k, v),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("key of another server")));
    refused = true;
  }
  EXPECT_TRUE(refused);
  // Server 0 itself restores them.
  auto restored = MakeShard(config, 0);
  ASSERT_THAT(restored->BeginRestore(*meta), IsOk());
  for (const auto& [k, v] : records) EXPECT_THAT(restored->RestoreRecord(k, v), IsOk());
}

TEST(Shard, RestoreRecordRejectsRecordsThatDoNotFit) {
  auto shard = MakeShard(MakeConfig("kind: SGD"));
  EXPECT_THAT(shard->RestoreRecord(std::string("w\0\0\0\0\0", 6), "short"),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(shard->RestoreRecord(std::string("nope\0abcd", 9), "x"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("nope")));
  EXPECT_THAT(shard->RestoreRecord(std::string("emb\0abcdefgh", 12), "123"),
              StatusIs(absl::StatusCode::kDataLoss));
}

}  // namespace
}  // namespace ps::server
