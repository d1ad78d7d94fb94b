#include "worker/models/dense_stack.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/parameter_store.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/optimizer.h"
#include "kernels/separate_memory_backend.h"
#include "worker/models/dense_stack_testing.h"
#include "worker/models/model.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::HasSubstr;
using ::testing::Pointwise;

using dense_stack_testing::CpuBackend;
using dense_stack_testing::ExpectHandComputedGradientsIn;
using dense_stack_testing::FillParams;
using dense_stack_testing::HandComputedStep;
using dense_stack_testing::LendingStore;
using dense_stack_testing::TwoLayers;

// x = [1, 2]; W0 = [[1, -1], [2, 0.5]], b0 = [0.5, -1] -> z0 = [5.5, -1] -> relu [5.5, 0];
// W1 = [[2], [3]], b1 = [1] -> y = 12. With dy = 1: dW1 = [5.5, 0], db1 = [1],
// da = [2, 3] * relu' = [2, 0], dW0 = x^T da = [[2, 0], [4, 0]], db0 = [2, 0],
// dx = da W0^T = [2, 4].
TEST(DenseStack, ForwardAndBackwardMatchHandComputedValues) {
  std::unique_ptr<kernels::Backend> backend = CpuBackend();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), backend.get()));
  FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  const std::vector<float> x = {1, 2};
  ASSERT_OK_AND_ASSIGN(float* y, stack->Forward(1, x.data()));
  EXPECT_FLOAT_EQ(y[0], 12.f);

  y[0] = 1.f;  // dLoss/dy
  std::vector<float> dx(2);
  ASSERT_OK(stack->Backward(1, x.data(), y, dx.data()));
  EXPECT_THAT(dx, ElementsAre(2.f, 4.f));
  common::PushBatch push;
  stack->AddPushes(&push);
  ASSERT_EQ(push.dense.size(), 4u);
  EXPECT_EQ(push.dense[0].table, "w0");
  EXPECT_THAT(push.dense[0].values, Pointwise(FloatEq(), {2.f, 0.f, 4.f, 0.f}));
  EXPECT_THAT(push.dense[1].values, Pointwise(FloatEq(), {2.f, 0.f}));
  EXPECT_THAT(push.dense[2].values, Pointwise(FloatEq(), {5.5f, 0.f}));
  EXPECT_THAT(push.dense[3].values, Pointwise(FloatEq(), {1.f}));
}

TEST(DenseStack, GradientsSumOverRows) {
  std::unique_ptr<kernels::Backend> backend = CpuBackend();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), backend.get()));
  FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  const std::vector<float> x = {1, 2, 1, 2};  // the same row twice
  ASSERT_OK_AND_ASSIGN(float* y, stack->Forward(2, x.data()));
  y[0] = y[1] = 1.f;
  ASSERT_OK(stack->Backward(2, x.data(), y, nullptr));
  common::PushBatch push;
  stack->AddPushes(&push);
  EXPECT_THAT(push.dense[0].values, Pointwise(FloatEq(), {4.f, 0.f, 8.f, 0.f}));
  EXPECT_THAT(push.dense[3].values, Pointwise(FloatEq(), {2.f}));
}

// Two buffer sets: a store may fill one set while the stack computes on the other; each
// Forward uses the current set, and spans into the other set stay where they were.
TEST(DenseStack, BufferSetsAreIndependentAndSpansSurviveSwaps) {
  std::unique_ptr<kernels::Backend> backend = CpuBackend();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), backend.get()));
  ASSERT_OK(stack->AddSecondBufferSet());
  FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});  // set A: y = 12
  common::PullBatch a;
  stack->AddPulls(&a);
  stack->SwapBufferSets();
  FillParams(*stack, {{0, 0, 0, 0}, {0, 0}, {0, 0}, {7}});  // set B: y = 7
  common::PullBatch b;
  stack->AddPulls(&b);
  EXPECT_NE(a.dense[0].out.data(), b.dense[0].out.data());
  const std::vector<float> x = {1, 2};
  ASSERT_OK_AND_ASSIGN(float* y, stack->Forward(1, x.data()));
  EXPECT_FLOAT_EQ(y[0], 7.f);
  stack->SwapBufferSets();
  ASSERT_OK_AND_ASSIGN(y, stack->Forward(1, x.data()));
  EXPECT_FLOAT_EQ(y[0], 12.f);
  // A span handed out before the swaps still names set A: changing it changes what A computes.
  a.dense[3].out[0] = 2;
  stack->SwapBufferSets();
  stack->SwapBufferSets();  // back on A; the next Forward reads it afresh
  ASSERT_OK_AND_ASSIGN(y, stack->Forward(1, x.data()));
  EXPECT_FLOAT_EQ(y[0], 13.f);
  common::PullBatch again;
  stack->AddPulls(&again);
  EXPECT_EQ(again.dense[0].out.data(), a.dense[0].out.data());
}

// Lent gradients: Backward writes them into the lent memory (every set's), AddPushes hands
// out spans there, and the values are those of the stack's own buffers.
TEST(DenseStack, LentGradientsAreWrittenWhereTheStoreLends) {
  std::unique_ptr<kernels::Backend> backend = CpuBackend();
  LendingStore store({{"w0", 4}, {"b0", 2}, {"w1", 2}, {"b1", 1}});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), backend.get()));
  ASSERT_OK(stack->AddSecondBufferSet());
  common::PushBatch own;
  stack->AddPushes(&own);
  store.lends = false;
  EXPECT_FALSE(stack->LendGradients(&store));
  common::PushBatch unchanged;
  stack->AddPushes(&unchanged);
  EXPECT_EQ(unchanged.dense[0].values.data(), own.dense[0].values.data());
  store.lends = true;
  ASSERT_TRUE(stack->LendGradients(&store));
  ASSERT_EQ(store.lent.size(), 2u);  // one per buffer set
  EXPECT_THAT(store.asked[0], ElementsAre("w0", "b0", "w1", "b1"));
  for (int set = 0; set < 2; ++set) {
    SCOPED_TRACE(absl::StrCat("set ", set));
    HandComputedStep(*stack);
    ExpectHandComputedGradientsIn(*stack, store.lent[set]);
    stack->SwapBufferSets();
  }
  // Spans handed out before still name the stack's own buffers.
  EXPECT_EQ(own.dense[0].values.data(), unchanged.dense[0].values.data());
  EXPECT_TRUE(stack->LendGradients(&store));  // once lent, lent
  EXPECT_EQ(store.lent.size(), 2u);
  // One set lent: no second set, and no tables on the device, from then on.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> one_set,
                       DenseStack::Create(TwoLayers(), backend.get()));
  ASSERT_TRUE(one_set->LendGradients(&store));
  EXPECT_EQ(store.lent.size(), 3u);
  EXPECT_THAT(one_set->AddSecondBufferSet(), StatusIs(absl::StatusCode::kFailedPrecondition));
  DeviceTableOptions device;
  device.block_floats = 1024;
  EXPECT_THAT(one_set->KeepOnDevice(device, &store),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("lent")));
}

// Lent memory the store revokes (it gave up a call whose server may still read it) is not
// written again: from the next Backward on, both sets' gradients go to the stack's own
// buffers, which AddPushes hands out, with the hand-computed values; the lent memory keeps
// what it last held, on the CPU backend (GEMMs write it) and on a device with its own memory
// (its copy lands there). Lending can be asked again, there with the revoked memory
// unregistered: the new buffers, carved right after it, share its page.
TEST(DenseStack, RevokedLentMemoryIsNotWrittenAgain) {
  for (bool separate : {false, true}) {
    SCOPED_TRACE(separate ? "separate device memory" : "cpu");
    std::unique_ptr<kernels::Backend> cpu = CpuBackend();
    kernels::SeparateMemoryBackend device;
    kernels::Backend* backend = separate ? static_cast<kernels::Backend*>(&device) : cpu.get();
    LendingStore store({{"w0", 4}, {"b0", 2}, {"w1", 2}, {"b1", 1}});
    std::vector<float> arena(1 << 10);
    store.carve_from = absl::MakeSpan(arena);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                         DenseStack::Create(TwoLayers(), backend));
    ASSERT_OK(stack->AddSecondBufferSet());
    common::PushBatch own[2];
    for (int set = 0; set < 2; ++set) {
      stack->AddPushes(&own[set]);
      stack->SwapBufferSets();
    }
    ASSERT_TRUE(stack->LendGradients(&store));
    for (int set = 0; set < 2; ++set) {
      HandComputedStep(*stack);
      ExpectHandComputedGradientsIn(*stack, store.lent[set]);
      stack->SwapBufferSets();
    }
    store.revoked->store(true);
    const std::vector<std::vector<float>> before = {{store.lent[0].begin(), store.lent[0].end()},
                                                    {store.lent[1].begin(), store.lent[1].end()}};
    for (int step = 0; step < 4; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
      const std::vector<float> x = {1, 2};
      ASSERT_OK_AND_ASSIGN(float* y, stack->Forward(1, x.data()));
      y[0] = 2.f;  // twice the hand-computed case's gradients: not what the lent memory holds
      ASSERT_OK(stack->Backward(1, x.data(), y, nullptr));
      common::PushBatch push;
      stack->AddPushes(&push);
      ASSERT_EQ(push.dense.size(), 4u);
      for (size_t i = 0; i < push.dense.size(); ++i) {
        EXPECT_EQ(push.dense[i].values.data(), own[step % 2].dense[i].values.data());
      }
      EXPECT_THAT(push.dense[0].values, Pointwise(FloatEq(), {4.f, 0.f, 8.f, 0.f}));
      EXPECT_THAT(push.dense[3].values, Pointwise(FloatEq(), {2.f}));
      stack->SwapBufferSets();
    }
    for (int set = 0; set < 2; ++set) {
      EXPECT_EQ(std::vector<float>(store.lent[set].begin(), store.lent[set].end()), before[set]);
    }
    store.revoked = std::make_shared<std::atomic<bool>>(false);
    EXPECT_TRUE(stack->LendGradients(&store));
    EXPECT_EQ(store.lent.size(), 4u);
    if (separate) {
      EXPECT_EQ(device.registered().size(), 1u);  // the new buffers' range only
    }
  }
}

// A store that lends buffers not sized as the tables (here the second set's): nothing is
// lent, and Backward writes the stack's own buffers as before.
TEST(DenseStack, BuffersNotSizedAsTheTablesAreNotUsed) {
  std::unique_ptr<kernels::Backend> backend = CpuBackend();
  LendingStore store({{"w0", 4}, {"b0", 2}, {"w1", 2}, {"b1", 1}});
  store.lie_on_lend = 1;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), backend.get()));
  ASSERT_OK(stack->AddSecondBufferSet());
  common::PushBatch own;
  stack->AddPushes(&own);
  EXPECT_FALSE(stack->LendGradients(&store));
  EXPECT_EQ(store.lent.size(), 2u);
  FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  const std::vector<float> x = {1, 2};
  ASSERT_OK_AND_ASSIGN(float* y, stack->Forward(1, x.data()));
  y[0] = 1.f;
  ASSERT_OK(stack->Backward(1, x.data(), y, nullptr));
  common::PushBatch push;
  stack->AddPushes(&push);
  for (size_t i = 0; i < push.dense.size(); ++i) {
    EXPECT_EQ(push.dense[i].values.data(), own.dense[i].values.data()) << push.dense[i].table;
  }
  EXPECT_THAT(push.dense[1].values, Pointwise(FloatEq(), {2.f, 0.f}));
  EXPECT_THAT(push.dense[3].values, Pointwise(FloatEq(), {1.f}));
}

TEST(DenseStack, RejectsRowsOutsideOneToMaxBatch) {
  std::unique_ptr<kernels::Backend> backend = CpuBackend();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), backend.get()));
  const std::vector<float> x(6);
  EXPECT_THAT(stack->Forward(3, x.data()), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(stack->Forward(0, x.data()), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DenseStack, RejectsBadOptions) {
  std::unique_ptr<kernels::Backend> backend = CpuBackend();
  std::vector<DenseStackOptions> bad(5, TwoLayers());
  bad[0].widths = {3};
  bad[1].widths[1] = 0;
  bad[2].bias_tables.pop_back();
  bad[3].weight_tables[1] = "";
  bad[4].max_batch = 0;
  for (const DenseStackOptions& options : bad) {
    EXPECT_THAT(DenseStack::Create(options, backend.get()),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_THAT(DenseStack::Create(TwoLayers(), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---- Tables on the device -------------------------------------------------------------------

// A store that holds whole dense tables and only serves pulls (what KeepOnDevice reads).
class TableStore final : public common::ParameterStore {
 public:
  explicit TableStore(std::map<std::string, std::vector<float>> tables)
      : tables_(std::move(tables)) {}
  absl::Status Pull(const common::PullBatch& batch, const common::PullOptions&) override {
    ++pulls_;
    for (const common::DensePull& d : batch.dense) {
      const std::vector<float>& values = tables_.at(d.table);
      if (values.size() != d.out.size()) return absl::InvalidArgumentError(d.table);
      std::copy(values.begin(), values.end(), d.out.begin());
    }
    return absl::OkStatus();
  }
  absl::Status Push(const common::PushBatch&, const common::PushOptions&) override {
    return absl::UnimplementedError("TableStore takes no pushes");
  }
  absl::Status Finish() override { return absl::OkStatus(); }
  int pulls() const { return pulls_; }

 private:
  std::map<std::string, std::vector<float>> tables_;
  int pulls_ = 0;
};

const std::vector<std::string> kTables = {"w0", "b0", "w1", "b1"};  // the order of AddPulls

std::map<std::string, std::vector<float>> InitialTables() {
  return {{"w0", {1, -1, 2, 0.5}}, {"b0", {0.5, -1}}, {"w1", {2, 3}}, {"b1", {1}}};
}

// A different optimizer per table; w0's clip_norm makes its 3-float blocks count.
DeviceTableOptions MixedOptimizers() {
  DeviceTableOptions options;
  kernels::OptimizerParams adam;
  adam.kind = kernels::OptimizerKind::kAdam;
  adam.learning_rate = 0.1f;
  adam.clip_norm = 0.5f;
  options.optimizers["w0"] = adam;
  kernels::OptimizerParams momentum;
  momentum.kind = kernels::OptimizerKind::kMomentum;
  momentum.nesterov = true;
  momentum.weight_decay = 0.01f;
  options.optimizers["b0"] = momentum;
  kernels::OptimizerParams sgd;
  sgd.learning_rate = 0.05f;
  sgd.clip_value = 0.3f;
  options.optimizers["w1"] = sgd;
  kernels::OptimizerParams adagrad;
  adagrad.kind = kernels::OptimizerKind::kAdagrad;
  options.optimizers["b1"] = adagrad;
  options.block_floats = 3;
  return options;
}

// What a server holds of one table: values, slots and a step per block of `block` floats;
// Apply is a server's update of a push (kernels::ApplyOptimizer block by block).
struct ServerTable {
  ServerTable(std::vector<float> initial, const kernels::OptimizerParams& p, int64_t block)
      : values(std::move(initial)), optimizer(p), block_floats(block) {
    for (int s = 0; s < kernels::NumSlots(p.kind); ++s) {
      slots.emplace_back(values.size(), kernels::SlotInitialValue(p, s));
    }
    steps.assign((values.size() + block - 1) / block, 0);
  }
  void Apply(absl::Span<const float> grads) {
    for (size_t b = 0; b < steps.size(); ++b) {
      const size_t begin = b * block_floats;
      const size_t n = std::min<size_t>(block_floats, values.size() - begin);
      std::vector<float*> s;
      for (std::vector<float>& slot : slots) s.push_back(slot.data() + begin);
      kernels::ApplyOptimizer(optimizer, ++steps[b], absl::MakeSpan(values.data() + begin, n),
                              grads.subspan(begin, n), s);
    }
  }
  std::vector<float> values;
  kernels::OptimizerParams optimizer;
  int64_t block_floats;
  std::vector<std::vector<float>> slots;
  std::vector<int64_t> steps;
};

// The stack's tables in the order of kTables, read back from the device.
std::vector<std::vector<float>> TablesOf(DenseStack& stack) {
  EXPECT_OK(stack.CopyParametersToHost());
  std::vector<std::vector<float>> out;
  for (int i = 0; i < stack.num_layers(); ++i) {
    out.emplace_back(stack.weight(i).begin(), stack.weight(i).end());
    out.emplace_back(stack.bias(i).begin(), stack.bias(i).end());
  }
  return out;
}

// Three steps on the device give the tables, bit for bit, that a server applying the same
// gradients block by block holds: every rule, clip_norm per block, weight decay, clipping and
// each block's step (Adam's bias correction).
TEST(DenseStack, TablesOnTheDeviceTakeTheStepsAServerWouldApply) {
  std::unique_ptr<kernels::Backend> backend = CpuBackend();
  const DeviceTableOptions options = MixedOptimizers();
  // Reference: a stack whose tables live in the "server" below.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> reference,
                       DenseStack::Create(TwoLayers(), backend.get()));
  std::vector<ServerTable> server;
  for (const std::string& name : kTables) {
    server.emplace_back(InitialTables().at(name), options.optimizers.at(name),
                        options.block_floats);
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> on_device,
                       DenseStack::Create(TwoLayers(), backend.get()));
  TableStore store(InitialTables());
  ASSERT_OK(on_device->KeepOnDevice(options, &store));
  EXPECT_EQ(store.pulls(), 1);
  EXPECT_TRUE(on_device->tables_on_device());

  const std::vector<std::vector<float>> inputs = {{1, 2, -1, 0.5}, {0.3, -2, 2, 1}, {-1, 1, 4, 2}};
  for (const std::vector<float>& x : inputs) {
    std::vector<std::vector<float>> values;
    for (const ServerTable& t : server) values.push_back(t.values);
    FillParams(*reference, values);
    ASSERT_OK_AND_ASSIGN(float* y, reference->Forward(2, x.data()));
    y[0] = 1.f;
    y[1] = -0.5f;
    ASSERT_OK(reference->Backward(2, x.data(), y, nullptr));
    common::PushBatch push;
    reference->AddPushes(&push);
    ASSERT_EQ(push.dense.size(), server.size());
    for (size_t i = 0; i < server.size(); ++i) server[i].Apply(push.dense[i].values);

    ASSERT_OK_AND_ASSIGN(y, on_device->Forward(2, x.data()));
    y[0] = 1.f;
    y[1] = -0.5f;
    ASSERT_OK(on_device->Backward(2, x.data(), y, nullptr));
  }
  const std::vector<std::vector<float>> got = TablesOf(*on_device);
  for (size_t i = 0; i < server.size(); ++i) {
    EXPECT_NE(server[i].values, InitialTables().at(kTables[i])) << kTables[i];
    EXPECT_EQ(got[i], server[i].values) << kTables[i];  // bitwise
  }
  // The store calls carry nothing now.
  common::PullBatch pull;
  on_device->AddPulls(&pull);
  common::PushBatch push;
  on_device->AddPushes(&push);
  EXPECT_TRUE(pull.dense.empty());
  EXPECT_TRUE(push.dense.empty());
}

// A step whose gradients hold NaN fails and changes no table; the steps after it count on
// from where they were. Without reject_nonfinite the NaN goes in, as on a server.
TEST(DenseStack, ANonFiniteGradientChangesNoTableOnTheDevice) {
  std::unique_ptr<kernels::Backend> backend = CpuBackend();
  DeviceTableOptions options = MixedOptimizers();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), backend.get()));
  TableStore store(InitialTables());
  ASSERT_OK(stack->KeepOnDevice(options, &store));
  const std::vector<float> x = {1, 2};
  ASSERT_OK_AND_ASSIGN(float* y, stack->Forward(1, x.data()));
  y[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(stack->Backward(1, x.data(), y, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'w1'")));
  std::vector<std::vector<float>> initial;
  for (const std::string& name : kTables) initial.push_back(InitialTables().at(name));
  EXPECT_EQ(TablesOf(*stack), initial);

  // One good step now is the first step of every table (as a fresh stack's first step).
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> fresh,
                       DenseStack::Create(TwoLayers(), backend.get()));
  ASSERT_OK(fresh->KeepOnDevice(options, &store));
  for (DenseStack* s : {stack.get(), fresh.get()}) {
    ASSERT_OK_AND_ASSIGN(y, s->Forward(1, x.data()));
    y[0] = 1.f;
    ASSERT_OK(s->Backward(1, x.data(), y, nullptr));
  }
  EXPECT_EQ(TablesOf(*stack), TablesOf(*fresh));
  EXPECT_NE(TablesOf(*stack), initial);

  options.reject_nonfinite = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> lenient,
                       DenseStack::Create(TwoLayers(), backend.get()));
  ASSERT_OK(lenient->KeepOnDevice(options, &store));
  ASSERT_OK_AND_ASSIGN(y, lenient->Forward(1, x.data()));
  y[0] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_OK(lenient->Backward(1, x.data(), y, nullptr));
  EXPECT_TRUE(std::isnan(TablesOf(*lenient)[2][0]));  // w1 took the NaN
}

TEST(DenseStack, KeepOnDeviceRefusesWhatItCannotKeep) {
  std::unique_ptr<kernels::Backend> backend = CpuBackend();
  TableStore store(InitialTables());
  auto make = [&] { return *DenseStack::Create(TwoLayers(), backend.get()); };
  DeviceTableOptions missing = MixedOptimizers();
  missing.optimizers.erase("b1");
  EXPECT_THAT(make()->KeepOnDevice(missing, &store),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'b1'")));
  DeviceTableOptions no_blocks = MixedOptimizers();
  no_blocks.block_floats = 0;
  EXPECT_THAT(make()->KeepOnDevice(no_blocks, &store),
              StatusIs(absl::StatusCode::kInvalidArgument));
  DeviceTableOptions bad_rate = MixedOptimizers();
  bad_rate.optimizers["w1"].learning_rate = 0;
  EXPECT_THAT(make()->KeepOnDevice(bad_rate, &store),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'w1'")));
  EXPECT_EQ(store.pulls(), 0);  // nothing was read for a refusal

  std::unique_ptr<DenseStack> two_sets = make();
  ASSERT_OK(two_sets->AddSecondBufferSet());
  EXPECT_THAT(two_sets->KeepOnDevice(MixedOptimizers(), &store),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  std::unique_ptr<DenseStack> kept = make();
  ASSERT_OK(kept->KeepOnDevice(MixedOptimizers(), &store));
  EXPECT_THAT(kept->KeepOnDevice(MixedOptimizers(), &store),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(kept->AddSecondBufferSet(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace ps::worker
