// A shard whose sparse table has a memory budget, with the real spill store (RocksDB) and the
// Checkpointer: checkpoints with most rows spilled equal the all-in-memory result, a restart
// restores the checkpoint and not the newer rows a crash left on disk, checkpoints taken while
// pulls and pushes move rows are exact cuts, and a spill error refuses a push before it is
// recorded as seen.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/checkpointer.h"
#include "server/in_process_store.h"
#include "server/shard.h"
#include "server/storage/spill_store.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kDim = 4;
constexpr uint64_t kKeys = 2000;

// A dense table "w" and a sparse table "emb" (dim 4) with `optimizer`; "emb" keeps at most
// `budget` rows in memory (0 = all).
JobConfig MakeConfig(uint64_t budget, const std::string& optimizer = "kind: ADAGRAD") {
  auto config = common::ParseJobConfigText(
      absl::StrCat(R"pb(
                     cluster { num_servers: 1 num_workers: 2 dense_block_floats: 16 }
                     tables { name: "w" kind: TABLE_KIND_DENSE shape: 40
                              initializer { kind: UNIFORM low: -1 high: 1 }
                              optimizer {)pb",
                   optimizer, R"pb(}
                                   }
        tables {
          name: "emb" kind: TABLE_KIND_SPARSE dim: 4 memory_budget_rows: )pb",
                   budget, R"pb(
                     initializer { kind: NORMAL stddev: 0.5 }
                     optimizer {)pb",
                   optimizer, R"pb(}
                                   })pb"),
      "test");
  EXPECT_THAT(config.status(), IsOk());
  return *config;
}

class ShardSpillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  std::string Dir(const std::string& name) const { return absl::StrCat(base_, "/", name); }

  // A shard laid out as ps_server lays it out: checkpoints in `dir`, spilled rows in dir/spill.
  static std::unique_ptr<Shard> NewShard(const JobConfig& config, const std::string& dir) {
    ShardOptions options;
    options.spill_dir = dir + "/spill";
    auto shard = Shard::Create(config, options);
    EXPECT_THAT(shard.status(), IsOk());
    return shard.ok() ? *std::move(shard) : nullptr;
  }
  static std::unique_ptr<Checkpointer> NewCheckpointer(Shard* shard, const std::string& dir) {
    CheckpointerOptions options;
    options.data_dir = dir;
    options.interval = absl::ZeroDuration();
    options.keep = 1000;
    options.record_bytes = 4096;  // many records
    auto c = Checkpointer::Create(shard, options);
    EXPECT_THAT(c.status(), IsOk());
    return c.ok() ? *std::move(c) : nullptr;
  }
  // A reader (a tool: worker id -1).
  static std::unique_ptr<InProcessParameterStore> Store(Shard* shard) {
    return *InProcessParameterStore::Create({shard}, {-1, 1});
  }
  // A pusher: worker `worker`, as a new process each time (its sequences start over).
  static std::unique_ptr<InProcessParameterStore> Pusher(Shard* shard, int32_t worker = 0) {
    static std::atomic<uint64_t> incarnation{0};
    return *InProcessParameterStore::Create({shard}, {worker, ++incarnation});
  }
  static std::vector<uint64_t> AllKeys() {
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < kKeys; ++k) keys.push_back(k * 7919);
    return keys;
  }
  static std::vector<float> Rows(Shard* shard, const std::vector<uint64_t>& keys) {
    std::vector<float> out(keys.size() * kDim);
    common::PullBatch batch;
    batch.sparse.push_back({"emb", keys, absl::MakeSpan(out)});
    EXPECT_THAT(Store(shard)->Pull(batch, {}), IsOk());
    return out;
  }
  // Makes rows `keys` (reads make none): a push of zero gradients by worker 1, one update.
  static void MakeRows(Shard* shard, const std::vector<uint64_t>& keys) {
    const std::vector<float> zeros(keys.size() * kDim, 0.f);
    common::PushBatch batch;
    batch.sparse.push_back({"emb", keys, zeros});
    EXPECT_THAT(Pusher(shard, 1)->Push(batch, {1, false}), IsOk());
  }
  static std::vector<float> Dense(Shard* shard) {
    std::vector<float> out(40);
    common::PullBatch batch;
    batch.dense.push_back({"w", absl::MakeSpan(out)});
    EXPECT_THAT(Store(shard)->Pull(batch, {}), IsOk());
    return out;
  }
  // The same `steps` pushes (random keys, random gradients, seeded) to every shard.
  static void Train(const std::vector<Shard*>& shards, int steps, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> grad(-1, 1);
    const std::vector<uint64_t> all = AllKeys();
    for (int s = 0; s < steps; ++s) {
      std::vector<uint64_t> keys;
      for (int i = 0; i < 150; ++i) keys.push_back(all[rng() % all.size()]);
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      std::vector<float> rows(keys.size() * kDim), dense(40);
      for (float& g : rows) g = grad(rng);
      for (float& g : dense) g = grad(rng);
      for (Shard* shard : shards) {
        common::PushBatch batch;
        batch.dense.push_back({"w", dense});
        batch.sparse.push_back({"emb", keys, rows});
        ASSERT_THAT(Pusher(shard)->Push(batch, {1, false}), IsOk());
      }
    }
  }
  static SpillStats Spill(Shard* shard) { return shard->SparseStats("emb")->spill; }
  static bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }

  std::string base_;
};

TEST_F(ShardSpillTest, DenseBudgetIsRefusedAndNoSpillDirKeepsEverythingInMemory) {
  JobConfig config = MakeConfig(0);
  config.mutable_tables(0)->set_memory_budget_rows(5);
  EXPECT_THAT(Shard::Create(config, ShardOptions{}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sparse tables only")));
  auto shard = Shard::Create(MakeConfig(10), ShardOptions{});
  ASSERT_THAT(shard.status(), IsOk());
  EXPECT_FALSE((*shard)->SparseStats("emb")->spills);
  EXPECT_EQ((*shard)->SpillStoreForTest(), nullptr);
}

TEST_F(ShardSpillTest, StatsReportRowsInMemoryAndSpilled) {
  auto shard = NewShard(MakeConfig(100), Dir("a"));
  MakeRows(shard.get(), AllKeys());
  StatsResponse stats;
  shard->FillStats(&stats);
  ASSERT_EQ(stats.tables_size(), 2);
  const TableStats& emb = stats.tables(1);
  EXPECT_EQ(emb.rows(), kKeys);
  EXPECT_LE(emb.rows_in_memory(), 100u);
  EXPECT_EQ(emb.rows_evicted(), kKeys - emb.rows_in_memory());
  // The rows in memory with their index and bookkeeping: at least their floats.
  EXPECT_GE(emb.bytes(), emb.rows_in_memory() * kDim * 2 * sizeof(float));
  Rows(shard.get(), AllKeys());
  stats.Clear();
  shard->FillStats(&stats);
  EXPECT_GT(stats.tables(1).rows_faulted_in(), 0u);
}

TEST_F(ShardSpillTest, CheckpointWithMostRowsSpilledEqualsAllInMemory) {
  const JobConfig in_memory = MakeConfig(0), spilling = MakeConfig(kKeys / 20);
  {
    auto m = NewShard(in_memory, Dir("m"));
    auto s = NewShard(spilling, Dir("s"));
    Train({m.get(), s.get()}, 60, 1);
    EXPECT_TRUE(BitwiseEqual(Rows(m.get(), AllKeys()), Rows(s.get(), AllKeys())));
    const SpillStats st = Spill(s.get());
    EXPECT_LE(st.resident_rows, kKeys / 20);
    EXPECT_GT(st.spilled_rows, kKeys * 9 / 10);
    ASSERT_THAT(NewCheckpointer(m.get(), Dir("m"))->CheckpointNow().status(), IsOk());
    ASSERT_THAT(NewCheckpointer(s.get(), Dir("s"))->CheckpointNow().status(), IsOk());
  }
  auto m = NewShard(in_memory, Dir("m"));
  auto s = NewShard(spilling, Dir("s"));
  ASSERT_THAT(NewCheckpointer(m.get(), Dir("m"))->Restore().status(), IsOk());
  ASSERT_THAT(NewCheckpointer(s.get(), Dir("s"))->Restore().status(), IsOk());
  EXPECT_LE(Spill(s.get()).resident_rows, kKeys / 20);
  EXPECT_EQ(s->SparseStats("emb")->rows, m->SparseStats("emb")->rows);
  EXPECT_TRUE(BitwiseEqual(Rows(m.get(), AllKeys()), Rows(s.get(), AllKeys())));
  EXPECT_TRUE(BitwiseEqual(Dense(m.get()), Dense(s.get())));
  // Training on from the restored state stays identical: steps and Adagrad slots came back.
  Train({m.get(), s.get()}, 20, 2);
  EXPECT_TRUE(BitwiseEqual(Rows(m.get(), AllKeys()), Rows(s.get(), AllKeys())));
}

TEST_F(ShardSpillTest, RestartRestoresTheCheckpointNotRowsSpilledAfterIt) {
  const JobConfig config = MakeConfig(kKeys / 20);
  const std::string dir = Dir("s");
  std::vector<float> at_checkpoint;
  uint64_t rows_at_checkpoint = 0;
  {
    auto s = NewShard(config, dir);
    auto c = NewCheckpointer(s.get(), dir);
    Train({s.get()}, 30, 1);
    ASSERT_THAT(c->CheckpointNow().status(), IsOk());
    rows_at_checkpoint = s->SparseStats("emb")->rows;
    at_checkpoint = Rows(s.get(), AllKeys());
    Train({s.get()}, 30, 2);  // newer rows, mostly spilled, never checkpointed
    ASSERT_GT(s->SparseStats("emb")->rows, rows_at_checkpoint);
    ASSERT_FALSE(BitwiseEqual(Rows(s.get(), AllKeys()), at_checkpoint));
    ASSERT_THAT(s->SpillStoreForTest()->FlushForTest(), IsOk());
    // What a SIGKILL leaves behind: the spill store's files (a clean stop deletes them).
    ASSERT_EQ(std::system(absl::StrCat("cp -r ", dir, "/spill/db ", dir, "/crashed").c_str()), 0);
  }
  ASSERT_EQ(std::system(absl::StrCat("mv ", dir, "/crashed ", dir, "/spill/db").c_str()), 0);
  auto s = NewShard(config, dir);
  ASSERT_THAT(NewCheckpointer(s.get(), dir)->Restore().status(), IsOk());
  EXPECT_TRUE(BitwiseEqual(Rows(s.get(), AllKeys()), at_checkpoint));
  EXPECT_EQ(s->SparseStats("emb")->rows, rows_at_checkpoint);
}

TEST_F(ShardSpillTest, CheckpointsTakenWhileRowsMoveAreExactCuts) {
  // SGD with learning rate 1 and gradient -1: every push adds 1 to each of the first 300 keys,
  // so a consistent checkpoint has all of them at initial + (pushes applied) and never half a
  // push. Pullers read all 2000 keys at random meanwhile, so rows keep moving in and out.
  const JobConfig config = MakeConfig(64, "kind: SGD learning_rate: 1");
  const std::string dir = Dir("s");
  const std::vector<uint64_t> all = AllKeys();
  const std::vector<uint64_t> pushed(all.begin(), all.begin() + 300);
  std::vector<float> initial;
  {
    auto reference = Shard::Create(MakeConfig(0, "kind: SGD learning_rate: 1"), ShardOptions{});
    initial = Rows(reference->get(), all);
  }
  std::vector<uint64_t> ids;
  {
    auto s = NewShard(config, dir);
    auto c = NewCheckpointer(s.get(), dir);
    MakeRows(s.get(), all);  // every row exists (most of them spilled) before the first cut
    std::atomic<int> pushers_left{2};
    std::vector<std::thread> threads;
    for (int p = 0; p < 2; ++p) {
      threads.emplace_back([&, p] {
        auto store = Pusher(s.get(), p);
        const std::vector<float> minus_one(pushed.size() * kDim, -1.0f);
        for (int i = 0; i < 25; ++i) {
          common::PushBatch batch;
          batch.sparse.push_back({"emb", pushed, minus_one});
          ASSERT_THAT(store->Push(batch, {1, false}), IsOk());
        }
        pushers_left.fetch_sub(1);
      });
    }
    for (int p = 0; p < 2; ++p) {
      threads.emplace_back([&, p] {
        std::mt19937_64 rng(p);
        while (pushers_left.load() > 0) {
          std::vector<uint64_t> keys;
          for (int i = 0; i < 200; ++i) keys.push_back(all[rng() % all.size()]);
          Rows(s.get(), keys);
        }
      });
    }
    do {
      auto r = c->CheckpointNow();
      ASSERT_THAT(r.status(), IsOk());
      ids.push_back(r->checkpoint_id());
    } while (pushers_left.load() > 0);
    for (auto& t : threads) t.join();
    auto last = c->CheckpointNow();
    ASSERT_THAT(last.status(), IsOk());
    ids.push_back(last->checkpoint_id());
    EXPECT_GT(Spill(s.get()).faults, 0u);
  }
  ASSERT_GE(ids.size(), 2u);
  std::cout << ids.size() << " checkpoints, " << ids.size() - 1 << " of them during the pushes\n";
  for (uint64_t id : ids) {
    // Restored into a shard that keeps every row in memory: the checkpoint's own content.
    auto r = Shard::Create(MakeConfig(0, "kind: SGD learning_rate: 1"), ShardOptions{});
    ASSERT_THAT(r.status(), IsOk());
    auto report = NewCheckpointer(r->get(), dir)->Restore(id);
    ASSERT_THAT(report.status(), IsOk());
    EXPECT_EQ((*r)->SparseStats("emb")->rows, kKeys) << "checkpoint " << id;
    const std::vector<float> rows = Rows(r->get(), all);
    const uint64_t applied = report->updates_applied - 1;  // less MakeRows' push
    for (size_t k = 0; k < all.size(); ++k) {
      for (int d = 0; d < kDim; ++d) {
        float want = initial[k * kDim + d];
        if (k < pushed.size()) {
          for (uint64_t i = 0; i < applied; ++i) want += 1.0f;
        }
        ASSERT_EQ(rows[k * kDim + d], want)
            << "checkpoint " << id << " (" << applied << " pushes) key " << all[k];
      }
    }
  }
}

TEST_F(ShardSpillTest, SpillErrorRefusesThePushBeforeItIsSeen) {
  auto shard = NewShard(MakeConfig(100, "kind: SGD learning_rate: 1"), Dir("s"));
  const std::vector<uint64_t> all = AllKeys();
  MakeRows(shard.get(), all);
  const std::vector<float> before = Rows(shard.get(), all);
  // Damage one spilled row on disk.
  storage::SpillStore* spill = shard->SpillStoreForTest();
  ASSERT_NE(spill, nullptr);
  uint64_t bad = 0, good = 0;
  std::string unused;
  for (uint64_t k : all) {
    if (*spill->table(0)->Get(k, &unused)) {
      if (bad == 0) {
        bad = k;
      } else if (good == 0) {
        good = k;
      }
    }
  }
  ASSERT_NE(bad, 0u);
  ASSERT_NE(good, 0u);
  ASSERT_THAT(spill->PutRawForTest(0, bad, "rotten bytes"), IsOk());

  RequestInfo info;
  info.worker_id = 0;
  info.worker_incarnation = 1;
  info.sequence = 1;
  info.clock = 1;
  info.layout_fingerprint = shard->partitioner().layout_fingerprint();
  const std::vector<uint64_t> keys = {good, bad};
  const std::vector<float> g(2 * kDim, -1.0f);
  auto push_rows = [&](absl::Span<const uint64_t> k, absl::Span<const float> v) {
    PushTable table;
    table.table = "emb";
    table.keys = k;
    table.rows = absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    return shard->Push(PushView{info, false, absl::MakeConstSpan(&table, 1)});
  };
  EXPECT_THAT(push_rows(keys, g).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(absl::StrCat("key ", bad))));
  EXPECT_EQ(shard->updates_applied(), 1u);  // MakeRows' push only
  // Nothing was applied, and the push was not recorded: the same sequence without the bad row
  // is applied (not answered as a duplicate).
  const std::vector<uint64_t> good_only = {good};
  auto retry = push_rows(good_only, absl::MakeConstSpan(g).first(kDim));
  ASSERT_THAT(retry.status(), IsOk());
  EXPECT_FALSE(retry->duplicate);
  std::vector<float> row(kDim);
  const PullTable pull{"emb", ENCODING_FLOAT32, {}, good_only};
  ASSERT_THAT(shard->ReadPull({pull}, [&](size_t, size_t, size_t,
                                          absl::FunctionRef<absl::Status(absl::Span<float>)> fill) {
    return fill(absl::MakeSpan(row));
  }),
              IsOk());
  const size_t at = std::find(all.begin(), all.end(), good) - all.begin();
  for (int d = 0; d < kDim; ++d) EXPECT_EQ(row[d], before[at * kDim + d] + 1.0f);
  EXPECT_LE(Spill(shard.get()).resident_rows, 100u);
}

// Found in review, 2026-12-06: the room check for a push's new rows skipped tables that spill
// (they evict to make room), but a push pins all its keys in memory until it is applied: one
// push of many new keys took the server far past server.max_memory_bytes. The rows it would
// pin beyond the row budget are checked with the other tables' new rows, before admission.
TEST_F(ShardSpillTest, APushPinningBeyondTheMemoryLimitIsRefusedBeforeAnyRowIsMade) {
  ShardOptions options;
  options.spill_dir = Dir("s") + "/spill";
  options.max_memory_bytes = 4 << 20;
  auto created = Shard::Create(MakeConfig(100, "kind: SGD learning_rate: 1"), options);
  ASSERT_THAT(created.status(), IsOk());
  Shard* shard = created->get();
  const int64_t used = shard->memory().used();
  // 200,000 rows of 16 bytes and their bookkeeping: about 17 MB.
  std::vector<uint64_t> keys(200000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i + 1;
  const std::vector<float> zeros(keys.size() * kDim, 0.f);
  common::PushBatch big;
  big.sparse.push_back({"emb", keys, zeros});
  EXPECT_THAT(Pusher(shard)->Push(big, {1, false}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("table 'emb'"),
                             HasSubstr("rows pinned beyond memory_budget_rows 100"))));
  EXPECT_EQ(shard->SparseStats("emb")->rows, 0u);
  EXPECT_EQ(shard->memory().used(), used);
  EXPECT_EQ(shard->updates_applied(), 0u);
  // A push that fits is applied.
  keys.resize(2000);
  common::PushBatch fits;
  fits.sparse.push_back({"emb", keys, absl::MakeConstSpan(zeros).first(keys.size() * kDim)});
  EXPECT_THAT(Pusher(shard)->Push(fits, {1, false}), IsOk());
  EXPECT_EQ(shard->SparseStats("emb")->rows, keys.size());
  EXPECT_LE(shard->memory().used(), static_cast<int64_t>(options.max_memory_bytes));
}

// Found in review, 2026-12-06: a push to a table that spills made its new rows (evicting
// others to the spill store) before its header was admitted, so a push refused only there
// left every new key as a row: counted, checkpointed and spilled.
TEST_F(ShardSpillTest, PushRefusedForItsHeaderMakesNoRows) {
  auto shard = NewShard(MakeConfig(100, "kind: SGD learning_rate: 1"), Dir("s"));
  std::vector<uint64_t> fresh(1000);
  for (size_t i = 0; i < fresh.size(); ++i) fresh[i] = 1000003 * (i + 1);
  const std::vector<uint64_t> first = {11, 22, 33};
  const std::vector<float> grad(fresh.size() * kDim, -1.0f);
  auto push = [&](uint64_t incarnation, uint64_t sequence, absl::Span<const uint64_t> keys) {
    RequestInfo info;
    info.worker_id = 0;
    info.worker_incarnation = incarnation;
    info.sequence = sequence;
    info.clock = 1;
    info.layout_fingerprint = shard->partitioner().layout_fingerprint();
    PushTable table;
    table.table = "emb";
    table.keys = keys;
    table.rows = absl::string_view(reinterpret_cast<const char*>(grad.data()),
                                   keys.size() * kDim * sizeof(float));
    return shard->Push(PushView{info, false, absl::MakeConstSpan(&table, 1)}).status();
  };
  // Rows, and the rows in memory, moved and written as `before`.
  auto expect_unchanged = [&](uint64_t rows, const SpillStats& before) {
    EXPECT_EQ(shard->SparseStats("emb")->rows, rows);
    const SpillStats spill = Spill(shard.get());
    EXPECT_EQ(spill.resident_rows, before.resident_rows);
    EXPECT_EQ(spill.writes, before.writes);
    EXPECT_EQ(spill.evictions, before.evictions);
  };
  // Sequence 0, from a worker this server has not heard from.
  absl::Status s = push(2, 0, fresh);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(RejectionReason(s), "bad_sequence");
  expect_unchanged(0, SpillStats{});
  // Incarnation 2's first push is applied: 3 rows (spilled: the budget's share of a stripe
  // is 0 rows).
  ASSERT_THAT(push(2, 1, first), IsOk());
  const SpillStats applied = Spill(shard.get());
  struct Refused {
    const char* what;
    uint64_t incarnation, sequence;
    absl::StatusCode code;
    const char* reason;
  };
  const Refused refused[] = {
      {"sequence 0", 2, 0, absl::StatusCode::kInvalidArgument, "bad_sequence"},
      {"sequence past 2^62", 2, WorkerTracker::kMaxSequence + 1, absl::StatusCode::kInvalidArgument,
       "bad_sequence"},
      {"sequence past the window", 2, 2 + WorkerTracker::kSequenceWindow,
       absl::StatusCode::kInvalidArgument, "bad_sequence"},
      {"incarnation too far ahead", UINT64_MAX, 1, absl::StatusCode::kInvalidArgument,
       "bad_sequence"},
      {"stale incarnation", 1, 2, absl::StatusCode::kFailedPrecondition, "stale_incarnation"},
  };
  for (const Refused& r : refused) {
    SCOPED_TRACE(r.what);
    s = push(r.incarnation, r.sequence, fresh);
    EXPECT_THAT(s, StatusIs(r.code));
    EXPECT_EQ(RejectionReason(s), r.reason);
    expect_unchanged(first.size(), applied);
  }
  // The same rows with a header the server takes are made (most of them spilled).
  ASSERT_THAT(push(2, 2, fresh), IsOk());
  EXPECT_EQ(shard->SparseStats("emb")->rows, first.size() + fresh.size());
  EXPECT_GT(Spill(shard.get()).writes, applied.writes);
}

}  // namespace
}  // namespace ps::server
