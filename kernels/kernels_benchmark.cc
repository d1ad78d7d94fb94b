// Kernel benchmarks:
//  - GEMM through the Backend API next to a direct cblas_sgemm on the same buffers and shapes
//    (squares, and the MLP 784-256-128-10 at batch 64: forward, dW = X^T dY, dX = dY W^T),
//    reported as GFLOP/s; the two should agree within noise (the API adds a virtual call and
//    argument checks).
//  - Adam and Adagrad ApplyOptimizer on 16M floats next to memcpy of 16M floats, reported as
//    GB/s of memory traffic: Adam reads w, g, m, v and writes w, m, v (28 B/element), Adagrad
//    reads w, g, a and writes w, a (20 B/element), memcpy reads and writes 8 B/element.
//
//   bazel run //kernels:kernels_benchmark -- --benchmark_min_time=0.2
//   On a shared machine add --benchmark_repetitions=5 --benchmark_enable_random_interleaving
//   and read the medians.
//   add --device=cuda in a --config=cuda build to run the API GEMMs on the GPU.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "glog/logging.h"
#include "kernels/backend.h"
#include "kernels/optimizer.h"

namespace ps::kernels {
namespace {

struct GemmShape {
  std::string name;
  bool trans_a, trans_b;
  int m, n, k;
};

std::vector<GemmShape> GemmShapes() {
  std::vector<GemmShape> shapes;
  for (int s : {256, 512, 1024, 2048}) {
    shapes.push_back({absl::StrCat("square_", s), false, false, s, s, s});
  }
  // MLP 784-256-128-10, batch 64. Layer (in -> out): forward X[64 x in] W[in x out];
  // weight gradient X^T dY; input gradient dY W^T.
  const int batch = 64;
  const int dims[] = {784, 256, 128, 10};
  for (int l = 0; l < 3; ++l) {
    const int in = dims[l], out = dims[l + 1];
    const std::string layer = absl::StrCat("mlp_", in, "x", out);
    shapes.push_back({layer + "_fwd", false, false, batch, out, in});
    shapes.push_back({layer + "_dW", true, false, in, out, batch});
    shapes.push_back({layer + "_dX", false, true, batch, in, out});
  }
  return shapes;
}

// Operands of one shape, stored densely (leading dimension = stored column count).
struct GemmOperands {
  explicit GemmOperands(const GemmShape& s)
      : lda(s.trans_a ? s.m : s.k),
        ldb(s.trans_b ? s.k : s.n),
        ldc(s.n),
        a(static_cast<size_t>(s.m) * s.k, 0.5f),
        b(static_cast<size_t>(s.k) * s.n, 0.25f),
        c(static_cast<size_t>(s.m) * s.n, 0.f) {}
  int lda, ldb, ldc;
  std::vector<float> a, b, c;
};

void SetGflops(benchmark::State& state, const GemmShape& s) {
  const double flops = 2.0 * s.m * s.n * s.k * static_cast<double>(state.iterations());
  state.counters["GFLOP"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
}

void BM_GemmBackendApi(benchmark::State& state, Backend* backend, GemmShape s) {
  // Device buffers (host memory for the CPU backend), so the same code measures CUDA too.
  GemmOperands host(s);
  auto a = backend->AllocateFloats(host.a.size());
  auto b = backend->AllocateFloats(host.b.size());
  auto c = backend->AllocateFloats(host.c.size());
  CHECK(a.ok() && b.ok() && c.ok());
  CHECK(backend->CopyToDevice(a->data(), host.a.data(), a->size_bytes()).ok());
  CHECK(backend->CopyToDevice(b->data(), host.b.data(), b->size_bytes()).ok());
  CHECK(backend->Zero(c->data(), c->size_bytes()).ok());
  // Device work is asynchronous: time each GEMM to completion (a no-op on the CPU).
  const bool wait_each = backend->kind() != DeviceKind::kCpu;
  for (auto _ : state) {
    absl::Status status =
        backend->Gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.f, a->floats(), host.lda,
                      b->floats(), host.ldb, 0.f, c->floats(), host.ldc);
    if (status.ok() && wait_each) status = backend->Synchronize();
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
  }
  CHECK(backend->Synchronize().ok());
  SetGflops(state, s);
}

void BM_GemmDirectCblas(benchmark::State& state, GemmShape s) {
  GemmOperands x(s);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans,
                s.trans_b ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.f, x.a.data(), x.lda,
                x.b.data(), x.ldb, 0.f, x.c.data(), x.ldc);
    benchmark::ClobberMemory();
  }
  SetGflops(state, s);
}

constexpr int64_t kOptimizerElements = int64_t{16} << 20;  // 16M floats

void SetBandwidth(benchmark::State& state, double bytes_per_element) {
  const double bytes =
      bytes_per_element * kOptimizerElements * static_cast<double>(state.iterations());
  state.counters["GB"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
}

void BM_ApplyOptimizer(benchmark::State& state, OptimizerKind kind, double bytes_per_element) {
  OptimizerParams p;
  p.kind = kind;
  std::vector<float> w(kOptimizerElements, 0.5f), g(kOptimizerElements, 0.01f);
  std::vector<std::vector<float>> slots;
  std::vector<float*> slot_ptrs;
  for (int i = 0; i < NumSlots(kind); ++i) {
    slots.emplace_back(kOptimizerElements, SlotInitialValue(p, i));
    slot_ptrs.push_back(slots.back().data());
  }
  int64_t step = 0;
  for (auto _ : state) {
    ApplyOptimizer(p, ++step, absl::MakeSpan(w), g, slot_ptrs);
    benchmark::ClobberMemory();
  }
  SetBandwidth(state, bytes_per_element);
}

void BM_Memcpy(benchmark::State& state) {
  std::vector<float> src(kOptimizerElements, 1.f), dst(kOptimizerElements, 0.f);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kOptimizerElements * sizeof(float));
    benchmark::ClobberMemory();
  }
  SetBandwidth(state, 2 * sizeof(float));
}

}  // namespace
}  // namespace ps::kernels

int main(int argc, char** argv) {
  using namespace ps::kernels;  // NOLINT: a benchmark main.
  benchmark::Initialize(&argc, argv);
  // Own flag, read after Google Benchmark removed its own: --device=cpu|cuda|auto.
  std::string device = "cpu";
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(const_cast<absl::string_view*>(&arg), "--device=")) {
      device = std::string(arg);
    }
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(device, BackendOptions());
  if (!backend.ok()) {
    LOG(ERROR) << backend.status();
    return 1;
  }
  LOG(INFO) << "Backend: " << (*backend)->Description();
  // OpenBLAS starts its thread pool on the first call; keep that out of the first benchmark.
  {
    GemmShape warm{"warmup", false, false, 256, 256, 256};
    GemmOperands x(warm);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 256, 256, 256, 1.f, x.a.data(), 256,
                x.b.data(), 256, 0.f, x.c.data(), 256);
  }
  for (const GemmShape& s : GemmShapes()) {
    benchmark::RegisterBenchmark(("Gemm/api_" + s.name).c_str(), BM_GemmBackendApi,
                                 backend->get(), s)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("Gemm/cblas_" + s.name).c_str(), BM_GemmDirectCblas, s)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark("Optimizer/adam_16M", BM_ApplyOptimizer, OptimizerKind::kAdam,
                               28.0)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("Optimizer/adagrad_16M", BM_ApplyOptimizer,
                               OptimizerKind::kAdagrad, 20.0)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("Optimizer/memcpy_16M", BM_Memcpy)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
