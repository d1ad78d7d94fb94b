// Helpers shared by DenseStack's tests (dense_stack_test.cc, dense_stack_device_test.cc): a
// two-layer stack with a hand-computed step, and a store that lends push buffers.
#ifndef PS_WORKER_MODELS_DENSE_STACK_TESTING_H_
#define PS_WORKER_MODELS_DENSE_STACK_TESTING_H_

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/parameter_store.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/models/dense_stack.h"

namespace ps::worker::dense_stack_testing {

using ::testing::FloatEq;
using ::testing::Pointwise;

inline DenseStackOptions TwoLayers() {
  DenseStackOptions options;
  options.widths = {2, 2, 1};
  options.weight_tables = {"w0", "w1"};
  options.bias_tables = {"b0", "b1"};
  options.hidden_activation = kernels::Activation::kRelu;
  options.max_batch = 2;
  return options;
}

inline std::unique_ptr<kernels::Backend> CpuBackend() {
  return *kernels::CreateBackend("cpu", kernels::BackendOptions());
}

// Fills the pulled buffers the way a store would.
inline void FillParams(DenseStack& stack, const std::vector<std::vector<float>>& values) {
  common::PullBatch pull;
  stack.AddPulls(&pull);
  ASSERT_EQ(pull.dense.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(pull.dense[i].out.size(), values[i].size()) << pull.dense[i].table;
    std::copy(values[i].begin(), values[i].end(), pull.dense[i].out.begin());
  }
}

// A store that lends buffers of its own memory (ParameterStore::LendPushBuffer) to the tables
// asked for, when `lends` is set, and serves nothing else.
class LendingStore final : public common::ParameterStore {
 public:
  class Buffer final : public common::LentBuffer {
   public:
    Buffer(std::unique_ptr<float[]> data, size_t n, std::vector<size_t> starts,
           std::shared_ptr<const std::atomic<bool>> revoked)
        : LentBuffer(absl::MakeSpan(data.get(), n), std::move(starts), std::move(revoked)),
          data_(std::move(data)) {}
    // Memory the store keeps (LendingStore::carve_from).
    Buffer(absl::Span<float> values, std::vector<size_t> starts,
           std::shared_ptr<const std::atomic<bool>> revoked)
        : LentBuffer(values, std::move(starts), std::move(revoked)) {}

   private:
    std::unique_ptr<float[]> data_;
  };

  explicit LendingStore(std::map<std::string, size_t> sizes) : sizes_(std::move(sizes)) {}

  absl::Status Pull(const common::PullBatch&, const common::PullOptions&) override {
    return absl::UnimplementedError("pull");
  }
  absl::Status Push(const common::PushBatch&, const common::PushOptions&) override {
    return absl::UnimplementedError("push");
  }
  absl::Status Finish() override { return absl::OkStatus(); }
  std::unique_ptr<common::LentBuffer> LendPushBuffer(
      absl::Span<const std::string> tables) override {
    if (!lends) return nullptr;
    std::vector<size_t> starts = {0};
    for (const std::string& t : tables) {
      const bool lie = static_cast<int>(lent.size()) == lie_on_lend && t == "b1";
      starts.push_back(starts.back() + sizes_.at(t) + (lie ? 1 : 0));
    }
    const size_t n = starts.back();
    std::unique_ptr<Buffer> buffer;
    if (!carve_from.empty()) {  // one after the other, as an arena hands them out
      absl::Span<float> values = carve_from.subspan(0, n);
      carve_from.remove_prefix(std::min(carve_from.size(), n + carve_gap));
      std::fill(values.begin(), values.end(), -9.f);
      buffer = std::make_unique<Buffer>(values, std::move(starts), revoked);
    } else {
      auto data = std::make_unique<float[]>(n);
      std::fill_n(data.get(), n, -9.f);  // not the stack's zeros: Backward must write them all
      buffer = std::make_unique<Buffer>(std::move(data), n, std::move(starts), revoked);
    }
    lent.push_back(buffer->values());
    asked.emplace_back(tables.begin(), tables.end());
    return buffer;
  }

  bool lends = true;
  // Every buffer lent so far is revoked once this is set (as a store that gave up a call).
  std::shared_ptr<std::atomic<bool>> revoked = std::make_shared<std::atomic<bool>>(false);
  int lie_on_lend = -1;  // that lend (from 0) makes "b1" a value longer
  // Where set, lends are carved from here one after the other (else each is its own
  // allocation).
  absl::Span<float> carve_from;
  size_t carve_gap = 0;  // floats left between two carved lends
  std::vector<absl::Span<float>> lent;
  std::vector<std::vector<std::string>> asked;

 private:
  const std::map<std::string, size_t> sizes_;
};

inline bool Within(absl::Span<const float> part, absl::Span<const float> whole) {
  return part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size();
}

// One step of the hand-computed case: its parameters, x = [1, 2], dy = 1.
inline void HandComputedStep(DenseStack& stack) {
  FillParams(stack, {{1, -1, 2, 0.5}, {0.5, -1}, {2, 3}, {1}});
  const std::vector<float> x = {1, 2};
  absl::StatusOr<float*> y = stack.Forward(1, x.data());
  ASSERT_OK(y.status());
  (*y)[0] = 1.f;
  ASSERT_OK(stack.Backward(1, x.data(), *y, nullptr));
}

// The hand-computed case's gradients as AddPushes hands them out, every one within `lent`.
inline void ExpectHandComputedGradientsIn(const DenseStack& stack, absl::Span<const float> lent) {
  common::PushBatch push;
  stack.AddPushes(&push);
  ASSERT_EQ(push.dense.size(), 4u);
  for (const common::DensePush& p : push.dense) EXPECT_TRUE(Within(p.values, lent)) << p.table;
  EXPECT_THAT(push.dense[0].values, Pointwise(FloatEq(), {2.f, 0.f, 4.f, 0.f}));
  EXPECT_THAT(push.dense[1].values, Pointwise(FloatEq(), {2.f, 0.f}));
  EXPECT_THAT(push.dense[2].values, Pointwise(FloatEq(), {5.5f, 0.f}));
  EXPECT_THAT(push.dense[3].values, Pointwise(FloatEq(), {1.f}));
}

}  // namespace ps::worker::dense_stack_testing

#endif  // PS_WORKER_MODELS_DENSE_STACK_TESTING_H_
