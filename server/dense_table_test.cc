// DenseTablePart's block layout: a block of kDensePadSlotsFromFloats values or more keeps
// kDenseSlotPadFloats unused floats between its parameters and each optimizer slot. Its updates
// must be those of the kernels over contiguous arrays, bit for bit, and its snapshot records those
// of an unpadded block ([step][params][slot0][slot1]), restored bit for bit.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/partitioner.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/optimizer.h"
#include "kernels/optimizer_config.h"
#include "server/memory_budget.h"
#include "server/table.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;

constexpr size_t kPadded = kDensePadSlotsFromFloats;

// A partitioner holding one dense Adam table "w" of one block of `n` values, initialized
// NORMAL (it owns the TableConfig the table part points into).
common::Partitioner OneBlockAdam(size_t n) {
  auto config = common::ParseJobConfigText(
      absl::StrCat("cluster { num_servers: 1 num_workers: 1 dense_block_floats: ", n,
                   " }\ntables { name: \"w\" kind: TABLE_KIND_DENSE shape: ", n,
                   " initializer { kind: NORMAL stddev: 0.5 seed: 7 } optimizer { kind: ADAM "
                   "learning_rate: 0.01 } }\n"),
      "test");
  EXPECT_THAT(config.status(), IsOk());
  auto p = common::Partitioner::Create(*config);
  EXPECT_THAT(p.status(), IsOk());
  return *std::move(p);
}

struct OneBlock {
  explicit OneBlock(size_t n)
      : partitioner(OneBlockAdam(n)),
        optimizer(kernels::ToOptimizerParams(partitioner.tables()[0].config->optimizer())),
        part(partitioner.tables()[0], optimizer, partitioner, 0) {}
  std::vector<float> Params() const {
    std::vector<float> out(part.BlockSize(0));
    part.Read(0, absl::MakeSpan(out));
    return out;
  }
  // The block's one snapshot record.
  std::string Record() {
    std::map<std::string, std::string> records;
    const SnapshotSink sink = [&records](absl::string_view k, absl::string_view v) {
      records[std::string(k)] = std::string(v);
      return absl::OkStatus();
    };
    part.BeginSnapshot(++epoch, &sink);
    EXPECT_THAT(part.WriteSnapshot(1 << 20), IsOk());
    part.EndSnapshot();
    EXPECT_EQ(records.size(), 1u);
    if (records.empty()) return "";
    key = records.begin()->first;
    return records.begin()->second;
  }
  common::Partitioner partitioner;
  kernels::OptimizerParams optimizer;
  DenseTablePart part;
  uint64_t epoch = 0;
  std::string key;  // of the last record
};

// Where two records first differ ("" when they do not): a short message, not two 48 MB strings.
std::string FirstDifference(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return absl::StrCat("sizes ", a.size(), " and ", b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return absl::StrCat("byte ", i, " of ", a.size());
  }
  return "";
}

// A gradient that differs from element to element and from step to step.
std::vector<float> Gradient(size_t n, int step) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i)
    g[i] = 0.001f * static_cast<float>((i * 7 + step * 13) % 101) - 0.05f;
  return g;
}

TEST(DenseTablePart, LargeBlocksPadTheirSlotsAndSmallerOnesDoNot) {
  OneBlock large(kPadded);
  EXPECT_EQ(large.part.BlockSlotStride(0), kPadded + kDenseSlotPadFloats);
  // Parameters, two slots and the padding before each slot: what the part says it holds.
  EXPECT_EQ(large.part.NumBytes(), (kPadded + 2 * (kPadded + kDenseSlotPadFloats)) * sizeof(float));
  OneBlock small(kPadded - 1);
  EXPECT_EQ(small.part.BlockSlotStride(0), kPadded - 1);
  EXPECT_EQ(small.part.NumBytes(), 3 * (kPadded - 1) * sizeof(float));
  // What the server's memory check counts before it allocates is what the blocks take.
  for (OneBlock* t : {&large, &small}) {
    EXPECT_EQ(DenseBytesOnServer(t->partitioner, t->partitioner.tables()[0], 0, 2),
              t->part.NumBytes());
  }
}

TEST(DenseTablePart, APaddedBlockUpdatesAsTheKernelDoesOverContiguousArrays) {
  OneBlock t(kPadded);
  // The reference: the same start, Adam over separate contiguous arrays.
  std::vector<float> w = t.Params(), m(kPadded, 0.f), v(kPadded, 0.f);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> g = Gradient(kPadded, step);
    if (step == 2) {
      // In two pieces (the path of payloads left in gRPC's receive slices).
      const size_t half = kPadded / 2;
      const BlockPiece pieces[2] = {
          {0, kernels::FloatBytes{g.data(), static_cast<int64_t>(half)}},
          {half, kernels::FloatBytes{g.data() + half, static_cast<int64_t>(kPadded - half)}}};
      t.part.Apply(0, absl::MakeConstSpan(pieces), UpdateOptions{});
    } else {
      t.part.Apply(0, g, UpdateOptions{});
    }
    float* slots[2] = {m.data(), v.data()};
    kernels::ApplyOptimizer(t.optimizer, step, absl::MakeSpan(w), g, slots);
    const std::vector<float> got = t.Params();
    ASSERT_EQ(std::memcmp(got.data(), w.data(), w.size() * sizeof(float)), 0) << "step " << step;
  }
  // The slots too, as the block's snapshot record holds them.
  const std::string record = t.Record();
  ASSERT_EQ(record.size(), sizeof(int64_t) + 3 * kPadded * sizeof(float));
  int64_t step = 0;
  std::memcpy(&step, record.data(), sizeof(step));
  EXPECT_EQ(step, 3);
  const char* at = record.data() + sizeof(int64_t);
  EXPECT_EQ(std::memcmp(at, w.data(), kPadded * sizeof(float)), 0) << "parameters";
  EXPECT_EQ(std::memcmp(at + kPadded * sizeof(float), m.data(), kPadded * sizeof(float)), 0)
      << "first moment";
  EXPECT_EQ(std::memcmp(at + 2 * kPadded * sizeof(float), v.data(), kPadded * sizeof(float)), 0)
      << "second moment";
}

TEST(DenseTablePart, APaddedBlockRestoresBitwiseAndUpdatesOnAsBefore) {
  OneBlock t(kPadded);
  t.part.Apply(0, Gradient(kPadded, 1), UpdateOptions{});
  t.part.Apply(0, Gradient(kPadded, 2), UpdateOptions{});
  const std::string record = t.Record();

  OneBlock restored(kPadded);
  ASSERT_THAT(restored.part.RestoreRecord(t.key, record), IsOk());
  EXPECT_EQ(FirstDifference(restored.Record(), record), "");
  // Same parameters, slots and step: one more identical update gives identical blocks.
  t.part.Apply(0, Gradient(kPadded, 3), UpdateOptions{});
  restored.part.Apply(0, Gradient(kPadded, 3), UpdateOptions{});
  EXPECT_EQ(FirstDifference(restored.Record(), t.Record()), "");
}

}  // namespace
}  // namespace ps::server
