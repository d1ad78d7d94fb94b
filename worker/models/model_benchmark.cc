// The cost of the model layer over the bare kernels, for MLP 784-256-128-10 (ReLU) at
// batch 64 on the CPU backend. Throughput is reported as samples/s ("items_per_second").
//
//   BM_KernelsOnly        the same GEMMs, bias, activations and softmax cross-entropy issued
//                         on the backend directly, on preallocated buffers, no store.
//   BM_ModelStep          PreparePull + ForwardBackward + PreparePush, the parameters already
//                         in the model's buffers (what the model itself costs).
//   BM_ModelStepWithPull  as above plus FakeParameterStore::Pull copying every table out of
//                         an in-memory map (what a centralized step costs before pushing).
//
//   bazel run //worker/models:model_benchmark -- --benchmark_min_time=0.5
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "benchmark/benchmark.h"
#include "common/config/config.h"
#include "common/parameter_store.h"
#include "glog/logging.h"
#include "kernels/backend.h"
#include "proto/config.pb.h"
#include "worker/data/batch.h"
#include "worker/models/fake_parameter_store.h"
#include "worker/models/mlp_model.h"

namespace ps::worker {
namespace {

constexpr int64_t kBatch = 64;

ps::MlpConfig BenchConfig() {
  ps::MlpConfig config;
  config.set_input_dim(784);
  config.add_hidden(256);
  config.add_hidden(128);
  config.set_num_classes(10);
  config.set_activation(ps::MlpConfig::RELU);
  return config;
}

std::unique_ptr<kernels::Backend> Backend() {
  kernels::BackendOptions options;
  options.num_threads = 1;  // Stable numbers on a shared machine; both loops use the same.
  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend =
      kernels::CreateBackend("cpu", options);
  CHECK(backend.ok()) << backend.status();
  return *std::move(backend);
}

Batch RandomBatch() {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> pixel(0.f, 1.f);
  Batch batch;
  batch.size = kBatch;
  batch.feature_dim = 784;
  for (int64_t i = 0; i < kBatch * 784; ++i) batch.dense.push_back(pixel(rng));
  for (int64_t i = 0; i < kBatch; ++i) batch.class_labels.push_back(rng() % 10);
  return batch;
}

std::unique_ptr<FakeParameterStore> Store() {
  ps::ModelConfig model;
  *model.mutable_mlp() = BenchConfig();
  absl::StatusOr<std::vector<ps::TableConfig>> tables = common::ModelTables(model);
  CHECK(tables.ok()) << tables.status();
  absl::StatusOr<std::unique_ptr<FakeParameterStore>> store =
      FakeParameterStore::ForTables(*tables);
  CHECK(store.ok()) << store.status();
  return *std::move(store);
}

void CheckOk(const absl::Status& status) { CHECK(status.ok()) << status; }

// Forward and backward of the MLP straight on the backend: the floor the model is held to.
void BM_KernelsOnly(benchmark::State& state) {
  std::unique_ptr<kernels::Backend> backend = Backend();
  kernels::Backend& be = *backend;
  const std::vector<uint32_t> widths = common::MlpLayerWidths(BenchConfig());
  const int layers = static_cast<int>(widths.size()) - 1;
  const int m = kBatch;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
  // Backend allocations (256-byte aligned), as the model's buffers are.
  auto allocate = [&](int64_t n) {
    absl::StatusOr<kernels::DeviceBuffer> buffer = be.AllocateFloats(n);
    CHECK(buffer.ok()) << buffer.status();
    std::fill_n(buffer->floats(), n, 0.f);
    return *std::move(buffer);
  };
  std::vector<kernels::DeviceBuffer> w, b, dw, db, act;
  for (int i = 0; i < layers; ++i) {
    const int64_t in = widths[i], out = widths[i + 1];
    w.push_back(allocate(in * out));
    for (int64_t j = 0; j < in * out; ++j) w[i].floats()[j] = uniform(rng);
    b.push_back(allocate(out));
    dw.push_back(allocate(in * out));
    db.push_back(allocate(out));
    act.push_back(allocate(m * out));
  }
  kernels::DeviceBuffer grad_a = allocate(m * 256), grad_b = allocate(m * 256);
  const Batch batch = RandomBatch();
  for (auto _ : state) {
    const float* x = batch.dense.data();
    for (int i = 0; i < layers; ++i) {
      const int in = widths[i], out = widths[i + 1];
      CheckOk(be.Gemm(false, false, m, out, in, 1.f, x, in, w[i].floats(), out, 0.f,
                      act[i].floats(), out));
      CheckOk(be.BiasAdd(m, out, b[i].floats(), act[i].floats()));
      if (i + 1 < layers) {
        CheckOk(be.ActivationForward(kernels::Activation::kRelu, int64_t{m} * out, act[i].floats(),
                                     act[i].floats()));
      }
      x = act[i].floats();
    }
    float* logits = act[layers - 1].floats();
    auto loss =
        be.SoftmaxCrossEntropy(m, widths[layers], logits, batch.class_labels.data(), logits);
    CHECK(loss.ok());
    benchmark::DoNotOptimize(*loss);
    float* dz = logits;
    for (int i = layers - 1; i >= 0; --i) {
      const int in = widths[i], out = widths[i + 1];
      const float* input = i == 0 ? batch.dense.data() : act[i - 1].floats();
      CheckOk(be.Gemm(true, false, in, out, m, 1.f, input, in, dz, out, 0.f, dw[i].floats(), out));
      CheckOk(be.BiasGrad(m, out, dz, db[i].floats()));
      if (i == 0) break;
      float* d_input = i % 2 == 0 ? grad_a.floats() : grad_b.floats();
      CheckOk(be.Gemm(false, true, m, in, out, 1.f, dz, out, w[i].floats(), out, 0.f, d_input, in));
      CheckOk(be.ActivationBackward(kernels::Activation::kRelu, int64_t{m} * in, input, d_input,
                                    d_input));
      dz = d_input;
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_KernelsOnly)->Unit(benchmark::kMicrosecond);

void ModelStep(benchmark::State& state, bool pull_from_store) {
  std::unique_ptr<kernels::Backend> backend = Backend();
  std::unique_ptr<FakeParameterStore> store = Store();
  absl::StatusOr<std::unique_ptr<MlpModel>> model =
      MlpModel::Create(BenchConfig(), backend.get(), kBatch);
  CHECK(model.ok()) << model.status();
  const Batch batch = RandomBatch();
  {
    common::PullBatch pull;
    CheckOk((*model)->PreparePull(batch, &pull));
    CheckOk(store->Pull(pull, {}));
  }
  for (auto _ : state) {
    common::PullBatch pull;
    CheckOk((*model)->PreparePull(batch, &pull));
    if (pull_from_store) CheckOk(store->Pull(pull, {}));
    auto result = (*model)->ForwardBackward(batch);
    CHECK(result.ok()) << result.status();
    benchmark::DoNotOptimize(result->loss);
    common::PushBatch push;
    CheckOk((*model)->PreparePush(&push));
    benchmark::DoNotOptimize(push.dense.data());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void BM_ModelStep(benchmark::State& state) { ModelStep(state, /*pull_from_store=*/false); }
BENCHMARK(BM_ModelStep)->Unit(benchmark::kMicrosecond);

void BM_ModelStepWithPull(benchmark::State& state) { ModelStep(state, /*pull_from_store=*/true); }
BENCHMARK(BM_ModelStepWithPull)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace ps::worker

BENCHMARK_MAIN();
