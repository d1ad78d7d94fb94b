// DenseStack on a device with its own memory (kernels::SeparateMemoryBackend, as CUDA's): the
// copies between host and device, their waits, and the registration of lent memory.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/parameter_store.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/separate_memory_backend.h"
#include "worker/models/dense_stack.h"
#include "worker/models/dense_stack_testing.h"

namespace ps::worker {
namespace {

using dense_stack_testing::CpuBackend;
using dense_stack_testing::ExpectHandComputedGradientsIn;
using dense_stack_testing::FillParams;
using dense_stack_testing::HandComputedStep;
using dense_stack_testing::LendingStore;
using dense_stack_testing::TwoLayers;
using ::ps::common::StatusIs;
using ::testing::FloatEq;
using ::testing::HasSubstr;
using ::testing::Pointwise;

// Every lent buffer lies in one of `backend`'s registered ranges, and no two ranges share a
// page (the driver refuses those).
void ExpectRegisteredOnce(const kernels::SeparateMemoryBackend& backend,
                          absl::Span<const absl::Span<float>> lent) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t last_page = 0;
  for (const auto& [start, bytes] : backend.registered()) {  // in address order
    const auto begin = reinterpret_cast<uintptr_t>(start);
    EXPECT_TRUE(last_page == 0 || begin / page > last_page) << "ranges share a page";
    last_page = (begin + bytes - 1) / page;
  }
  for (const absl::Span<float> buffer : lent) {
    const auto at = reinterpret_cast<uintptr_t>(buffer.data());
    const uintptr_t end = at + buffer.size() * sizeof(float);
    bool inside = false;
    for (const auto& [start, bytes] : backend.registered()) {
      const auto begin = reinterpret_cast<uintptr_t>(start);
      inside = inside || (at >= begin && end <= begin + bytes);
    }
    EXPECT_TRUE(inside) << "a lent buffer outside the registered ranges";
  }
}

// On a device with its own memory (as CUDA's), lent gradients are copied from the device
// straight into the lent memory, one copy a step, after the stack registered one range over
// both sets with the backend; the stack unregisters it when it goes. Laid out as the lent
// memory (no padding between tables), the values are those of the hand-computed case.
TEST(DenseStack, OnASeparateDeviceLentGradientsAreCopiedIntoRegisteredMemory) {
  kernels::SeparateMemoryBackend backend;
  LendingStore store({{"w0", 4}, {"b0", 2}, {"w1", 2}, {"b1", 1}});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), &backend));
  ASSERT_OK(stack->AddSecondBufferSet());
  ASSERT_TRUE(stack->LendGradients(&store));
  ASSERT_EQ(store.lent.size(), 2u);
  ExpectRegisteredOnce(backend, store.lent);
  for (int set = 0; set < 2; ++set) {
    SCOPED_TRACE(absl::StrCat("set ", set));
    const int copies = backend.copies_to_host;
    HandComputedStep(*stack);
    EXPECT_EQ(backend.copies_to_host, copies + 1);
    EXPECT_EQ(backend.copies_to_registered, set + 1);
    ExpectHandComputedGradientsIn(*stack, store.lent[set]);
    stack->SwapBufferSets();
  }
  stack.reset();
  EXPECT_TRUE(backend.registered().empty());
}

// On a device with its own memory the parameters' copy to the device is issued without a
// wait, and their host side is not written until the device has waited: by Backward's copy
// of the gradients, else by AddPulls or SwapBufferSets before a store may write it. The
// backend counts the copies whose source changed before a wait (and fails that wait).
TEST(DenseStack, TheParametersCopyIsNotWaitedForButTheirHostSideIs) {
  kernels::SeparateMemoryBackend backend;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), &backend));
  const std::vector<float> x = {1, 2};
  // A Forward alone (as an evaluation's), then the next pull's values written.
  FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  int synchronizes = backend.synchronizes;
  ASSERT_OK_AND_ASSIGN(float* y, stack->Forward(1, x.data()));
  EXPECT_FLOAT_EQ(y[0], 12.f);
  EXPECT_EQ(backend.async_copies_to_device, 1);   // the parameters'
  EXPECT_EQ(backend.synchronizes, synchronizes);  // not waited for
  FillParams(*stack, {{2, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  EXPECT_EQ(backend.synchronizes, synchronizes + 1);  // AddPulls waited
  ASSERT_OK_AND_ASSIGN(y, stack->Forward(1, x.data()));
  EXPECT_FLOAT_EQ(y[0], 14.f);  // z0 = [6.5, -1]: the new values reached the device
  // A whole step: Backward's copy of the gradients ends the wait, so the next pull need not.
  y[0] = 1.f;
  ASSERT_OK(stack->Backward(1, x.data(), y, nullptr));
  synchronizes = backend.synchronizes;
  FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  EXPECT_EQ(backend.synchronizes, synchronizes);
  // Two sets: the set put aside by a swap may be written at once.
  ASSERT_OK(stack->AddSecondBufferSet());
  common::PullBatch first;
  stack->AddPulls(&first);
  ASSERT_OK(stack->Forward(1, x.data()).status());
  stack->SwapBufferSets();
  std::fill(first.dense[0].out.begin(), first.dense[0].out.end(), 7.f);
  ASSERT_OK(backend.Synchronize());
  EXPECT_EQ(backend.async_copies_to_device, 3);
  EXPECT_EQ(backend.async_sources_changed, 0);
}

// A device error that the wait before a pull reports (AddPulls returns nothing) is returned
// by the next Forward, once.
TEST(DenseStack, AnErrorOfTheWaitBeforeAPullIsReturnedByTheNextForward) {
  kernels::SeparateMemoryBackend backend;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), &backend));
  const std::vector<float> x = {1, 2};
  FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  ASSERT_OK(stack->Forward(1, x.data()).status());
  backend.synchronize_error = absl::InternalError("device fault");
  FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  EXPECT_THAT(stack->Forward(1, x.data()).status(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("device fault")));
  ASSERT_OK_AND_ASSIGN(float* y, stack->Forward(1, x.data()));
  EXPECT_FLOAT_EQ(y[0], 12.f);
}

// A gradient copy that fails before it waits for the device (CUDA's, where it cannot make the
// device current or issue the copy) has not ended the parameters' copy: the next pull waits
// for it before a store writes their host side.
TEST(DenseStack, AGradientCopyThatFailsBeforeWaitingLeavesTheWaitToThePull) {
  kernels::SeparateMemoryBackend backend;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), &backend));
  const std::vector<float> x = {1, 2};
  FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  ASSERT_OK_AND_ASSIGN(float* y, stack->Forward(1, x.data()));
  y[0] = 1.f;
  backend.error_before_wait = absl::InternalError("cannot issue the copy");
  EXPECT_THAT(stack->Backward(1, x.data(), y, nullptr),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("cannot issue")));
  const int synchronizes = backend.synchronizes;
  FillParams(*stack, {{2, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  EXPECT_EQ(backend.synchronizes, synchronizes + 1);
  EXPECT_EQ(backend.pending_async_copies(), 0u);
  ASSERT_OK_AND_ASSIGN(y, stack->Forward(1, x.data()));
  EXPECT_FLOAT_EQ(y[0], 14.f);
}

// Likewise a wait of SwapBufferSets that fails before waiting (its error goes to the next
// Forward): the copy still reads the set put aside, and the stack waits for it before that
// set's memory goes with the stack.
TEST(DenseStack, AWaitThatFailsBeforeWaitingIsTriedAgain) {
  kernels::SeparateMemoryBackend backend;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), &backend));
  ASSERT_OK(stack->AddSecondBufferSet());
  const std::vector<float> x = {1, 2};
  FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  ASSERT_OK(stack->Forward(1, x.data()).status());
  backend.error_before_wait = absl::InternalError("cannot make the device current");
  stack->SwapBufferSets();
  EXPECT_EQ(backend.pending_async_copies(), 1u);
  const int synchronizes = backend.synchronizes;
  stack.reset();
  EXPECT_EQ(backend.synchronizes, synchronizes + 1);
  EXPECT_EQ(backend.async_sources_released, 0);  // freed only once waited for
}

// Two sets' buffers lent one after the other (as the segment's arena hands them out) share a
// page: registered as one range. 1 MB apart: two ranges, not the memory between.
TEST(DenseStack, LentBuffersAreRegisteredByTheirPagesOnly) {
  for (bool adjacent : {true, false}) {
    SCOPED_TRACE(adjacent ? "adjacent" : "far apart");
    kernels::SeparateMemoryBackend backend;
    LendingStore store({{"w0", 4}, {"b0", 2}, {"w1", 2}, {"b1", 1}});
    std::vector<float> arena(1 << 20);
    store.carve_from = absl::MakeSpan(arena);
    if (!adjacent) store.carve_gap = 1 << 18;  // 1 MB apart
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                         DenseStack::Create(TwoLayers(), &backend));
    ASSERT_OK(stack->AddSecondBufferSet());
    ASSERT_TRUE(stack->LendGradients(&store));
    ExpectRegisteredOnce(backend, store.lent);
    size_t registered = 0;
    for (const auto& range : backend.registered()) registered += range.second;
    EXPECT_EQ(backend.registered().size(), adjacent ? 1u : 2u);
    EXPECT_EQ(registered, 2 * 9 * sizeof(float));
    stack.reset();
    EXPECT_TRUE(backend.registered().empty());
  }
}

// A backend that cannot register the lent memory: nothing is lent, and the gradients reach
// the stack's own buffers as before.
TEST(DenseStack, LentMemoryTheDeviceCannotRegisterIsNotUsed) {
  kernels::SeparateMemoryBackend backend;
  backend.refuse_registration = true;
  LendingStore store({{"w0", 4}, {"b0", 2}, {"w1", 2}, {"b1", 1}});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DenseStack> stack,
                       DenseStack::Create(TwoLayers(), &backend));
  common::PushBatch own;
  stack->AddPushes(&own);
  EXPECT_FALSE(stack->LendGradients(&store));
  EXPECT_TRUE(backend.registered().empty());
  FillParams(*stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  const std::vector<float> x = {1, 2};
  ASSERT_OK_AND_ASSIGN(float* y, stack->Forward(1, x.data()));
  y[0] = 1.f;
  ASSERT_OK(stack->Backward(1, x.data(), y, nullptr));
  EXPECT_EQ(backend.copies_to_registered, 0);
  common::PushBatch push;
  stack->AddPushes(&push);
  for (size_t i = 0; i < push.dense.size(); ++i) {
    EXPECT_EQ(push.dense[i].values.data(), own.dense[i].values.data()) << push.dense[i].table;
  }
  EXPECT_THAT(push.dense[0].values, Pointwise(FloatEq(), {2.f, 0.f, 4.f, 0.f}));
  EXPECT_THAT(push.dense[3].values, Pointwise(FloatEq(), {1.f}));
  // Registration works again: the next ask lends.
  backend.refuse_registration = false;
  EXPECT_TRUE(stack->LendGradients(&store));
  EXPECT_EQ(backend.registered().size(), 1u);
}

}  // namespace
}  // namespace ps::worker
