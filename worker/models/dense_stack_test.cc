#include "worker/models/dense_stack.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/parameter_store.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::Pointwise;

DenseStackOptions TwoLayers() {
  DenseStackOptions options;
  options.widths = {2, 2, 1};
  options.weight_tables = {"w0", "w1"};
  options.bias_tables = {"b0", "b1"};
  options.hidden_activation = kernels::Activation::kRelu;
  options.max_batch = 2;
  return options;
}

std::unique_ptr<kernels::Backend> CpuBackend() {
  return *kernels::CreateBackend("cpu", kernels::BackendOptions());
}

// Fills the pulled buffers the way a store would.
void FillParams(DenseStack& stack, const std::vector<std::vector<float>>& values) {
  common::PullBatch pull;
  stack.AddPulls(&pull);
  ASSERT_EQ(pull.dense.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(pull.dense[i].out.size(), values[i].size()) << pull.dense[i].table;
    std::copy(values[i].begin(), values[i].end(), pull.dense[i].out.begin());
  }
}

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

}  // namespace
}  // namespace ps::worker
