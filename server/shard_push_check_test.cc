// The shard's checks of a push: large pushes applied in parallel, payloads in pieces at any
// alignment, payloads that may change after the check, and non-finite values (refused or
// counted, reported in push order). The one pass of small SGD pushes: shard_one_pass_test.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/codec.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "server/shard_testing.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using shard_testing::AllBlocks;
using shard_testing::Bytes;
using shard_testing::Cut;
using shard_testing::FirstWorkerPush;
using shard_testing::InPieces;
using shard_testing::MakeConfig;
using shard_testing::MakeShard;
using shard_testing::NonFiniteValues;
using shard_testing::ReadBlocks;
using shard_testing::Rejections;
using shard_testing::TwoTableConfig;
using shard_testing::WholeTable;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// A push of `grad` to every block of table `info`, in block order (their ids in *blocks).
PushTable WholeTablePush(const Shard& shard, const common::TableInfo& info,
                         absl::Span<const float> grad, std::vector<uint32_t>* blocks) {
  PushTable table;
  table.table = info.name;
  for (uint32_t blk = 0; blk < info.num_blocks; ++blk) {
    auto [begin, end] = shard.partitioner().BlockRange(info, blk);
    table.blocks.push_back({blk, Bytes(grad.subspan(begin, end - begin))});
    blocks->push_back(blk);
  }
  return table;
}

TEST(Shard, ParallelApplyOfALargePushEqualsTheSerialOneBitwise) {
  // 2M floats in 64k-float blocks: over kParallelApplyValues, so helpers take part. Adam (not
  // commutative) and a block pushed twice in one push: its order must hold.
  auto config = common::ParseJobConfigText(R"pb(
    cluster { num_servers: 1 num_workers: 1 dense_block_floats: 65536 }
    tables { name: "w" kind: TABLE_KIND_DENSE shape: 2097152
             initializer { kind: UNIFORM low: -1 high: 1 } optimizer { kind: ADAM } }
  )pb", "test");
  ASSERT_THAT(config.status(), IsOk());
  std::vector<float> a, b;
  for (int threads : {0, 3}) {
    ShardOptions options;
    options.apply_threads = threads;
    auto shard = Shard::Create(*config, options);
    ASSERT_THAT(shard.status(), IsOk());
    const common::TableInfo& info = *(*shard)->partitioner().FindTable("w");
    std::vector<float> grad(2097152);
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = std::sin(0.001f * static_cast<float>(i));
    std::vector<uint32_t> blocks;
    PushTable table = WholeTablePush(**shard, info, grad, &blocks);
    table.blocks.push_back(table.blocks[5]);  // block 5 twice
    PushView push;
    push.info.layout_fingerprint = (*shard)->partitioner().layout_fingerprint();
    push.info.worker_id = 0;  // pushes need a worker slot
    push.info.worker_incarnation = 1;
    push.tables = absl::MakeConstSpan(&table, 1);
    for (int step = 0; step < 2; ++step) {
      push.info.sequence = static_cast<uint64_t>(step) + 1;
      ASSERT_THAT((*shard)->Push(push).status(), IsOk());
    }
    std::vector<float>& out = threads == 0 ? a : b;
    out = ReadBlocks(**shard, "w", blocks);
  }
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(Shard, ParallelApplyStartsAtParallelApplyValues) {
  // 4 blocks of 64k floats (256k values, under kParallelApplyValues): applied in parallel
  // only once parallel_apply_values is lowered to them, and then bit for bit as serially.
  auto config = common::ParseJobConfigText(
      R"pb(
        cluster { num_servers: 1 num_workers: 1 dense_block_floats: 65536 }
        tables {
          name: "w"
          kind: TABLE_KIND_DENSE
          shape: 262144
          initializer { kind: UNIFORM low: -1 high: 1 }
          optimizer { kind: ADAM }
        }
      )pb",
      "test");
  ASSERT_THAT(config.status(), IsOk());
  std::vector<std::vector<float>> results;
  for (size_t values : {kParallelApplyValues, size_t{262145}, size_t{262144}}) {
    SCOPED_TRACE(absl::StrCat("parallel_apply_values ", values));
    ShardOptions options;
    options.apply_threads = 2;
    options.parallel_apply_values = values;
    auto shard = Shard::Create(*config, options);
    ASSERT_THAT(shard.status(), IsOk());
    const common::TableInfo& info = *(*shard)->partitioner().FindTable("w");
    ASSERT_EQ(info.num_blocks, 4u);
    std::vector<float> grad(262144);
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = std::cos(0.002f * static_cast<float>(i));
    std::vector<uint32_t> blocks;
    PushTable table = WholeTablePush(**shard, info, grad, &blocks);
    PushView push;
    push.info.layout_fingerprint = (*shard)->partitioner().layout_fingerprint();
    push.info.worker_id = 0;
    push.info.worker_incarnation = 1;
    push.tables = absl::MakeConstSpan(&table, 1);
    for (int step = 0; step < 3; ++step) {
      push.info.sequence = static_cast<uint64_t>(step) + 1;
      ASSERT_THAT((*shard)->Push(push).status(), IsOk());
    }
    EXPECT_EQ((*shard)->parallel_pushes(), values <= 262144 ? 3u : 0u);
    results.push_back(ReadBlocks(**shard, "w", blocks));
  }
  for (size_t i = 1; i < results.size(); ++i) {
    ASSERT_EQ(results[i].size(), results[0].size());
    EXPECT_EQ(std::memcmp(results[i].data(), results[0].data(), results[0].size() * sizeof(float)),
              0);
  }
}

// One dense table of 16 floats, one server.
absl::StatusOr<JobConfig> OneSmallTableConfig() {
  return common::ParseJobConfigText(R"pb(
                                      cluster { num_servers: 1 num_workers: 1 }
                                      tables { name: "w" kind: TABLE_KIND_DENSE shape: 16 }
                                    )pb",
                                    "test");
}

TEST(Shard, ParallelApplyValuesFollowTheConfigElseTheCores) {
  auto config = OneSmallTableConfig();
  ASSERT_THAT(config.status(), IsOk());
  EXPECT_EQ(ParallelApplyValues(*config, 2), kParallelApplyValues);
  EXPECT_EQ(ParallelApplyValues(*config, 7), kParallelApplyValues);
  EXPECT_EQ(ParallelApplyValues(*config, 8), kManyCoresParallelApplyValues);
  EXPECT_EQ(ParallelApplyValues(*config, 64), kManyCoresParallelApplyValues);
  config->mutable_server()->set_parallel_apply_min_values(1000);
  EXPECT_EQ(ParallelApplyValues(*config, 2), 1000u);
  EXPECT_EQ(ParallelApplyValues(*config, 64), 1000u);
}

TEST(Shard, ApplyHelpersFollowTheConfigElseTheCores) {
  auto config = OneSmallTableConfig();
  ASSERT_THAT(config.status(), IsOk());
  EXPECT_EQ(ApplyHelpers(*config, 16), 15);
  EXPECT_EQ(ApplyHelpers(*config, 2), 1);
  EXPECT_EQ(ApplyHelpers(*config, 1), 0);
  EXPECT_EQ(ApplyHelpers(*config, 0), 0);  // cores unknown: the receiving thread alone
  config->mutable_server()->set_apply_threads(8);
  EXPECT_EQ(ApplyHelpers(*config, 16), 7);
  EXPECT_EQ(ApplyHelpers(*config, 2), 7);  // as told, whatever the cores
  config->mutable_server()->set_apply_threads(1);
  EXPECT_EQ(ApplyHelpers(*config, 16), 0);
  ShardOptions options;
  options.apply_threads = ApplyHelpers(*config, 16);
  auto shard = Shard::Create(*config, options);
  ASSERT_THAT(shard.status(), IsOk());
  EXPECT_EQ((*shard)->apply_threads(), 1);
}

// A shard with one Adam table "w" of 2M floats in 64k-float blocks: over kParallelApplyValues,
// so with apply_threads > 0 the finite check and the apply of a whole-table push are parallel.
std::unique_ptr<Shard> MakeLargeAdamShard(int apply_threads, bool reject_nonfinite = true) {
  auto config = common::ParseJobConfigText(R"pb(
    cluster { num_servers: 1 num_workers: 1 dense_block_floats: 65536 }
    tables { name: "w" kind: TABLE_KIND_DENSE shape: 2097152
             initializer { kind: UNIFORM low: -1 high: 1 } optimizer { kind: ADAM } }
  )pb", "test");
  CHECK_OK(config.status());
  ShardOptions options;
  options.apply_threads = apply_threads;
  options.reject_nonfinite = reject_nonfinite;
  auto shard = Shard::Create(*config, options);
  CHECK_OK(shard.status());
  return *std::move(shard);
}

TEST(Shard, NonFiniteValueAtTheEndOfALargePushChangesNothing) {
  // The values are checked before anything is applied, by several threads for this push:
  // a NaN in its very last value must leave every block as it was and the sequence unseen.
  for (int threads : {0, 3}) {
    SCOPED_TRACE(absl::StrCat("apply_threads ", threads));
    auto shard = MakeLargeAdamShard(threads);
    const std::vector<float> before = ReadBlocks(*shard, "w", AllBlocks(*shard));
    std::vector<float> grad(before.size(), 0.25f);
    grad.back() = std::numeric_limits<float>::quiet_NaN();
    PushTable table = WholeTable(*shard, grad);
    PushView push = FirstWorkerPush(*shard, &table);
    absl::Status status = shard->Push(push).status();
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("block 31: 1 non-finite values (first at index 65535")));
    EXPECT_EQ(RejectionReason(status), "nonfinite");
    EXPECT_EQ(NonFiniteValues(*shard), 1u);
    const std::vector<float> after = ReadBlocks(*shard, "w", AllBlocks(*shard));
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);
    // The same sequence, now finite, is a first delivery: applied, not a duplicate.
    grad.back() = 0.25f;
    auto applied = shard->Push(push);
    ASSERT_THAT(applied.status(), IsOk());
    EXPECT_FALSE(applied->duplicate);
  }
}

// A shard of one dense table "w" just large enough for the parallel apply (1M values, 16 blocks
// of 64k) with `optimizer`.
std::unique_ptr<Shard> MakeLargeShard(const std::string& optimizer, int apply_threads) {
  auto config = common::ParseJobConfigText(
      absl::StrCat(R"pb(
                     cluster { num_servers: 1 num_workers: 1 dense_block_floats: 65536 }
                     tables { name: "w" kind: TABLE_KIND_DENSE shape: 1048576
                              initializer { kind: UNIFORM low: -1 high: 1 }
                              optimizer {)pb",
                   optimizer, R"pb(}
                                   }
      )pb"),
      "test");
  CHECK_OK(config.status());
  ShardOptions options;
  options.apply_threads = apply_threads;
  auto shard = Shard::Create(*config, options);
  CHECK_OK(shard.status());
  return *std::move(shard);
}

// WholeTable in `encoding` (16-bit values are encoded into `encoded`).
PushTable WholeTableIn(const Shard& shard, const std::vector<float>& grad, Encoding encoding,
                       std::string* encoded) {
  PushTable table = WholeTable(shard, grad);
  if (encoding == ENCODING_FLOAT32) return table;
  common::EncodeFloats(grad, encoding, encoded);
  table.encoding = encoding;
  const size_t bytes = encoded->size() / table.blocks.size();
  for (size_t b = 0; b < table.blocks.size(); ++b) {
    table.blocks[b].bytes = absl::string_view(*encoded).substr(b * bytes, bytes);
  }
  return table;
}

TEST(Shard, PushInPiecesAtAnyAlignmentEqualsTheWholePushBitwise) {
  // Dense payloads are applied where the receive slices hold them. Whatever the cuts, the
  // result is the contiguous push's bit for bit: every rule, one thread or several, 16-bit
  // values (decoded from the pieces), clip_norm (which sums whole blocks: gathered first),
  // and local-SGD deltas.
  struct Case {
    std::string optimizer;
    int threads;
    Encoding encoding;
    bool delta;
  };
  const std::string adam = "kind: ADAM weight_decay: 0.01 clip_value: 0.2";
  const std::vector<Case> cases = {
      {"kind: SGD learning_rate: 0.1", 0, ENCODING_FLOAT32, false},
      {"kind: SGD learning_rate: 0.1", 3, ENCODING_FLOAT32, false},
      {adam, 0, ENCODING_FLOAT32, false},
      {adam, 3, ENCODING_FLOAT32, false},
      {"kind: MOMENTUM nesterov: true", 3, ENCODING_FLOAT32, false},
      {"kind: ADAM clip_norm: 5", 3, ENCODING_FLOAT32, false},
      {adam, 3, ENCODING_FP16, false},
      {adam, 3, ENCODING_FLOAT32, true},
  };
  for (const auto& [optimizer, threads, encoding, delta] : cases) {
    SCOPED_TRACE(absl::StrCat(optimizer, ", apply_threads ", threads, ", encoding ", encoding,
                              delta ? ", delta" : ""));
    auto whole = MakeLargeShard(optimizer, threads);
    auto cut = MakeLargeShard(optimizer, threads);
    std::vector<float> grad(1048576);
    for (size_t i = 0; i < grad.size(); ++i) {
      grad[i] = std::sin(0.001f * static_cast<float>(i)) * 0.3f;
    }
    std::string encoded;
    const PushTable table = WholeTableIn(*whole, grad, encoding, &encoded);
    std::string storage;
    std::vector<std::vector<absl::string_view>> pieces;
    const PushTable pieced = InPieces(table, &storage, &pieces);
    for (uint64_t seq = 1; seq <= 2; ++seq) {
      PushView push = FirstWorkerPush(*whole, &table, seq);
      push.is_delta = delta;
      ASSERT_THAT(whole->Push(push).status(), IsOk());
      push.tables = absl::MakeConstSpan(&pieced, 1);
      ASSERT_THAT(cut->Push(push).status(), IsOk());
    }
    const std::vector<float> want = ReadBlocks(*whole, "w", AllBlocks(*whole));
    const std::vector<float> got = ReadBlocks(*cut, "w", AllBlocks(*cut));
    ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  }
}

TEST(Shard, TinyPiecesAndUnalignedWholePayloadsEqualTheAlignedPushBitwise) {
  // Pieces of 3 bytes (a peer's tiny HTTP/2 frames: gathered first, so bookkeeping stays
  // proportional to the bytes) and a whole payload at an odd address (used in place).
  for (Cut cut : {Cut::kTiny, Cut::kWholeAtAnOddAddress}) {
    for (Encoding encoding : {ENCODING_FLOAT32, ENCODING_FP16}) {
      SCOPED_TRACE(absl::StrCat("cut ", static_cast<int>(cut), ", encoding ", encoding));
      auto whole = MakeLargeShard("kind: ADAM", 0);
      auto cut_shard = MakeLargeShard("kind: ADAM", 0);
      std::vector<float> grad(1048576);
      for (size_t i = 0; i < grad.size(); ++i) grad[i] = std::cos(0.003f * static_cast<float>(i));
      std::string encoded;
      const PushTable table = WholeTableIn(*whole, grad, encoding, &encoded);
      std::string storage;
      std::vector<std::vector<absl::string_view>> pieces;
      const PushTable pieced = InPieces(table, &storage, &pieces, cut);
      ASSERT_THAT(whole->Push(FirstWorkerPush(*whole, &table)).status(), IsOk());
      ASSERT_THAT(cut_shard->Push(FirstWorkerPush(*cut_shard, &pieced)).status(), IsOk());
      const std::vector<float> want = ReadBlocks(*whole, "w", AllBlocks(*whole));
      const std::vector<float> got = ReadBlocks(*cut_shard, "w", AllBlocks(*cut_shard));
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
    }
  }
}

TEST(Shard, NonFiniteValueInTheLastPieceChangesNothing) {
  for (int threads : {0, 3}) {
    SCOPED_TRACE(absl::StrCat("apply_threads ", threads));
    auto shard = MakeLargeAdamShard(threads);
    const std::vector<float> before = ReadBlocks(*shard, "w", AllBlocks(*shard));
    std::vector<float> grad(before.size(), 0.25f);
    grad[31 * 65536 + 65530] = std::numeric_limits<float>::infinity();
    std::string storage;
    std::vector<std::vector<absl::string_view>> pieces;
    const PushTable table = InPieces(WholeTable(*shard, grad), &storage, &pieces);
    PushView push = FirstWorkerPush(*shard, &table);
    absl::Status status = shard->Push(push).status();
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("block 31: 1 non-finite values (first at index 65530, "
                                           "value inf)")));
    const std::vector<float> after = ReadBlocks(*shard, "w", AllBlocks(*shard));
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);
  }
}

// A payload in memory the worker can still write (shared memory): a value changed to NaN or
// infinity after the check reaches the update as 0, never as itself. Dense float32 blocks
// are read once more by the update (as a whole aligned payload or in pieces); the contrast
// run without the flag shows the change would otherwise land in the table.
TEST(Shard, APayloadThatMayChangeAfterTheCheckNeverAppliesANonFiniteValue) {
  for (int threads : {0, 3}) {
    for (bool pieces : {false, true}) {
      SCOPED_TRACE(absl::StrCat("apply_threads ", threads, pieces ? ", in pieces" : ""));
      std::vector<float> grad(2097152), zeroed(2097152);
      for (size_t i = 0; i < grad.size(); ++i) grad[i] = 1e-3f * static_cast<float>(i % 89);
      std::vector<size_t> changed = {5, 65536 * 7 + 3, grad.size() - 1};
      if (pieces) {
        // Values whose 4 bytes lie in one piece (a value cut between two is copied at the
        // check): InPieces cuts every table of this shape the same way, values from byte 1 on.
        std::string storage;
        std::vector<std::vector<absl::string_view>> views;
        InPieces(WholeTable(*MakeLargeAdamShard(0), grad), &storage, &views);
        auto whole = [&](size_t i) {
          const char* at = storage.data() + 1 + i * sizeof(float);
          for (const auto& block : views) {
            for (absl::string_view v : block) {
              if (at >= v.data() && at + sizeof(float) <= v.data() + v.size()) return true;
            }
          }
          return false;
        };
        for (size_t& i : changed) {
          while (!whole(i)) --i;
        }
      }
      zeroed = grad;
      for (size_t i : changed) zeroed[i] = 0.0f;
      auto run = [&](bool may_change, const std::vector<float>* reference) {
        auto shard = MakeLargeAdamShard(threads);
        std::vector<float> payload = grad;
        std::string storage;
        std::vector<std::vector<absl::string_view>> views;
        PushTable table = WholeTable(*shard, reference != nullptr ? *reference : payload);
        if (pieces) table = InPieces(table, &storage, &views);
        table.payload_may_change = may_change;
        const PushView push = FirstWorkerPush(*shard, &table);
        absl::StatusOr<CheckedPush> checked = shard->CheckPush(push);
        EXPECT_THAT(checked.status(), IsOk());
        if (reference == nullptr) {
          // The worker writes after the check: in its payload, or in the pieces' storage.
          const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity()};
          for (size_t k = 0; k < changed.size(); ++k) {
            if (pieces) {
              std::memcpy(storage.data() + 1 + changed[k] * sizeof(float), &bad[k], sizeof(float));
            } else {
              payload[changed[k]] = bad[k];
            }
          }
        }
        EXPECT_THAT(shard->ApplyPush(*std::move(checked)).status(), IsOk());
        return ReadBlocks(*shard, "w", AllBlocks(*shard));
      };
      const std::vector<float> want = run(false, &zeroed);
      const std::vector<float> got = run(true, nullptr);
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
      const std::vector<float> unguarded = run(false, nullptr);
      EXPECT_FALSE(std::isfinite(unguarded[changed[0]]));
    }
  }
}

// Sparse rows that may change are copied before the check: a change after it has no effect.
TEST(Shard, SparseRowsThatMayChangeAreCopiedBeforeTheCheck) {
  const std::vector<uint64_t> keys = {3, 7, 11};
  auto rows_after = [&](bool may_change) {
    auto shard = MakeShard(MakeConfig("kind: SGD learning_rate: 0.5"));
    std::vector<float> rows(keys.size() * 3, 1.0f);
    PushTable table;
    table.table = "emb";
    table.keys = keys;
    table.rows = Bytes(rows);
    table.payload_may_change = may_change;
    const PushView push = FirstWorkerPush(*shard, &table);
    absl::StatusOr<CheckedPush> checked = shard->CheckPush(push);
    EXPECT_THAT(checked.status(), IsOk());
    rows[4] = std::numeric_limits<float>::quiet_NaN();
    rows[0] = 100.0f;
    EXPECT_THAT(shard->ApplyPush(*std::move(checked)).status(), IsOk());
    std::vector<float> out;
    const PullTable pull{"emb", ENCODING_FLOAT32, {}, keys};
    CHECK_OK(shard->ReadPull({pull}, [&](size_t, size_t, size_t n,
                                         absl::FunctionRef<absl::Status(absl::Span<float>)> fill) {
      out.resize(out.size() + n);
      return fill(absl::MakeSpan(out).last(n));
    }));
    return out;
  };
  EXPECT_THAT(rows_after(true), ElementsAreArray(std::vector<float>(9, 0.0f)));  // 0.5 - 0.5 * 1
  EXPECT_FALSE(std::isfinite(rows_after(false)[4]));
}

// A worker that keeps rewriting a shared payload's last value between NaN and a finite one:
// the check's count can see the NaN and its search for it, reading again, not (Adam: the
// check before the update; SGD: the one pass, whose count is the update's, then the check
// after the undo). Every push ends in OK or INVALID_ARGUMENT (before, the search's "none" was
// read as an index: the server aborted). Plain writes racing the server's reads, as another
// process's are: not under TSan.
TEST(Shard, APayloadRewrittenDuringTheCheckIsRefusedOrTakenNeverACrash) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the race is the test's point";
#endif
  for (const char* optimizer : {"kind: ADAM learning_rate: 0.1", "kind: SGD learning_rate: 0.1"}) {
    SCOPED_TRACE(optimizer);
    // "w": 2 blocks of kOnePassMaxValues values; the push is block 0, in one piece (SGD: at
    // the one pass's limit).
    const int block = static_cast<int>(kOnePassMaxValues);
    auto shard =
        MakeShard(TwoTableConfig(optimizer, optimizer, "kind: CONSTANT value: 1", 1, block));
    const bool sgd = absl::StartsWith(optimizer, "kind: SGD");
    std::vector<float> grad(block, 0.5f);
    const absl::string_view piece = Bytes(grad);
    PushTable table;
    table.table = "w";
    table.blocks.push_back({0, absl::string_view(), absl::MakeConstSpan(&piece, 1)});
    table.payload_may_change = true;
    std::atomic<bool> stop{false};
    std::thread writer([&] {
      volatile float* last = grad.data() + grad.size() - 1;
      while (!stop.load(std::memory_order_relaxed)) {
        *last = std::numeric_limits<float>::quiet_NaN();
        *last = 1.0f;
      }
    });
    int refused = 0, changed_while_checked = 0;
    // 3,000 pushes, and on until one is refused (the writer may wait for a core a while).
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    uint64_t seq = 1;
    for (; seq <= 3000 || (refused == 0 && absl::Now() < give_up); ++seq) {
      absl::StatusOr<CheckedPush> checked = shard->CheckPush(FirstWorkerPush(*shard, &table, seq));
      absl::Status status = checked.status();
      if (checked.ok()) status = shard->ApplyPush(*std::move(checked)).status();
      if (status.ok()) continue;
      ASSERT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument));
      ++refused;
      if (absl::StrContains(status.message(), "changed while checked")) ++changed_while_checked;
    }
    stop = true;
    writer.join();
    EXPECT_GT(refused, 0);
    // Every SGD push took the one pass (kept or undone); no Adam push did.
    EXPECT_EQ(shard->one_pass_pushes(), sgd ? seq - 1 : 0u);
    // How often the search found none: for the log (it depends on the threads' timing).
    std::printf("%s: %d of %d refused, %d with none left when looked for\n", optimizer, refused,
                static_cast<int>(seq - 1), changed_while_checked);
  }
}

TEST(Shard, FirstBadPartOfALargePushIsReportedInPushOrder) {
  // The values of a large push are checked after the structure of all its parts, but the
  // refusal is the one a part-by-part check would give: the first bad part, of either kind.
  for (int threads : {0, 3}) {
    SCOPED_TRACE(absl::StrCat("apply_threads ", threads));
    auto shard = MakeLargeAdamShard(threads);
    std::vector<float> grad(2097152, 0.25f);
    grad[3 * 65536 + 7] = std::numeric_limits<float>::infinity();  // block 3
    PushTable table = WholeTable(*shard, grad);
    PushView push = FirstWorkerPush(*shard, &table);
    // Block 3's Inf comes before block 40 (out of range) at the end.
    table.blocks.push_back({40, table.blocks[0].bytes});
    absl::Status status = shard->Push(push).status();
    EXPECT_EQ(RejectionReason(status), "nonfinite") << status;
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block 3:")));
    EXPECT_EQ(Rejections(*shard), "nonfinite=1 ");  // one refusal, counted once
    // Block 40 first: its refusal wins, and block 3's values were never looked at.
    table.blocks.insert(table.blocks.begin(), table.blocks.back());
    table.blocks.pop_back();
    status = shard->Push(push).status();
    EXPECT_EQ(RejectionReason(status), "bad_block") << status;
    EXPECT_EQ(NonFiniteValues(*shard), 1u);
    EXPECT_EQ(Rejections(*shard), "bad_block=1 nonfinite=1 ");
  }
}

TEST(Shard, NonFiniteValuesAreCountedInEveryPartWhenAccepted) {
  for (int threads : {0, 3}) {
    SCOPED_TRACE(absl::StrCat("apply_threads ", threads));
    auto shard = MakeLargeAdamShard(threads, /*reject_nonfinite=*/false);
    std::vector<float> grad(2097152, 0.25f);
    grad[5] = std::numeric_limits<float>::quiet_NaN();
    grad[20 * 65536] = std::numeric_limits<float>::infinity();
    grad.back() = -std::numeric_limits<float>::infinity();
    PushTable table = WholeTable(*shard, grad);
    PushView push = FirstWorkerPush(*shard, &table);
    EXPECT_THAT(shard->Push(push).status(), IsOk());
    EXPECT_EQ(NonFiniteValues(*shard), 3u);
  }
}

}  // namespace
}  // namespace ps::server
