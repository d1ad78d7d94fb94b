// Kernel benchmarks:
//  - GEMM through the Backend API next to a direct BLAS call on the same buffers and shapes
//    (squares, and the MLP 784-256-128-10 at batch 64: forward, dW = X^T dY, dX = dY W^T),
//    as GFLOP/s of each (from the median call time) and their ratio, which should be ~1 (the
//    API adds a virtual call and argument checks). The direct call is cblas_sgemm on the CPU
//    backend and cublasSgemm (own handle) on the CUDA backend, where the squares go up to
//    8192. Row time = both calls.
//  - Adam and Adagrad ApplyOptimizer on 16M floats next to memcpy of 16M floats, reported as
//    GB/s of memory traffic: Adam reads w, g, m, v and writes w, m, v (28 B/element), Adagrad
//    reads w, g, a and writes w, a (20 B/element), memcpy reads and writes 8 B/element. The
//    optimizer runs as a server runs it: over 1 MB blocks, each holding its parameters and
//    slots in one allocation (server/table.h's DenseTablePart::Block), with the gradient in
//    a buffer of its own. Not over a separate 64 MB vector per array: glibc maps those 64 MB +
//    4 KB apart, a spacing at which the development VM's memory ran Adam's streams 2-5x
//    slower (docs/lab/2026-12-03-stream-layout.md).
//
//   bazel run //kernels:kernels_benchmark -- --benchmark_min_time=0.2
//   --device=cuda (in a --config=cuda build) runs the API GEMMs on the GPU.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
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
#include "kernels/blas_core.h"
#include "kernels/internal/direct_cublas.h"
#include "kernels/optimizer.h"

namespace ps::kernels {
namespace {

struct GemmShape {
  std::string name;
  bool trans_a, trans_b;
  int m, n, k;
};

std::vector<GemmShape> GemmShapes(bool gpu) {
  std::vector<GemmShape> shapes;
  for (int s : {256, 512, 1024, 2048, 4096, 8192}) {
    if (s > 2048 && !gpu) break;
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

double Median(std::vector<double>& v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// One row per shape: the Backend API call and the direct cblas_sgemm alternate inside the
// same loop (in alternating order) and are timed separately. On a machine shared with other
// jobs, back-to-back rows see different load; pairing makes the ratio meaningful.
void BM_Gemm(benchmark::State& state, Backend* backend, internal::DirectCublas* cublas,
             GemmShape s) {
  GemmOperands host(s);
  auto a = backend->AllocateFloats(host.a.size());
  auto b = backend->AllocateFloats(host.b.size());
  auto c = backend->AllocateFloats(host.c.size());
  CHECK(a.ok() && b.ok() && c.ok());
  CHECK(backend->CopyToDevice(a->data(), host.a.data(), a->size_bytes()).ok());
  CHECK(backend->CopyToDevice(b->data(), host.b.data(), b->size_bytes()).ok());
  CHECK(backend->Zero(c->data(), c->size_bytes()).ok());
  // Both paths use the very same buffers (on the host for the CPU backend, on the device for
  // CUDA, where the direct path is cuBLAS).
  const bool on_cpu = backend->kind() == DeviceKind::kCpu;
  const float* direct_a = a->floats();
  const float* direct_b = b->floats();
  float* direct_c = c->floats();

  auto api = [&] {
    absl::Status status =
        backend->Gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.f, a->floats(), host.lda, b->floats(),
                      host.ldb, 0.f, c->floats(), host.ldc);
    // Device work is asynchronous: time each GEMM to completion (a no-op on the CPU).
    if (status.ok() && !on_cpu) status = backend->Synchronize();
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
  };
  auto direct = [&] {
    if (!on_cpu) {
      absl::Status status =
          cublas->SgemmAndWait(s.trans_a, s.trans_b, s.m, s.n, s.k, a->floats(), host.lda,
                               b->floats(), host.ldb, c->floats(), host.ldc);
      if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
      return;
    }
    cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans,
                s.trans_b ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.f, direct_a, host.lda,
                direct_b, host.ldb, 0.f, direct_c, host.ldc);
    benchmark::ClobberMemory();
  };
  using Clock = std::chrono::steady_clock;
  std::vector<double> api_s, direct_s;
  bool api_first = true;
  for (auto _ : state) {
    const Clock::time_point t0 = Clock::now();
    api_first ? api() : direct();
    const Clock::time_point t1 = Clock::now();
    api_first ? direct() : api();
    const Clock::time_point t2 = Clock::now();
    const double first = std::chrono::duration<double>(t1 - t0).count();
    const double second = std::chrono::duration<double>(t2 - t1).count();
    api_s.push_back(api_first ? first : second);
    direct_s.push_back(api_first ? second : first);
    api_first = !api_first;
  }
  // Medians: a preemption by another job lands in one call and would skew a mean.
  const double api_median = Median(api_s), direct_median = Median(direct_s);
  const double gflop = 2e-9 * s.m * s.n * s.k;
  state.counters["api_GFLOP/s"] = gflop / api_median;
  state.counters[on_cpu ? "cblas_GFLOP/s" : "cublas_GFLOP/s"] = gflop / direct_median;
  state.counters["api/direct"] = direct_median / api_median;  // throughput ratio
}

constexpr int64_t kOptimizerElements = int64_t{16} << 20;  // 16M floats

void SetBandwidth(benchmark::State& state, double bytes_per_element) {
  const double bytes =
      bytes_per_element * kOptimizerElements * static_cast<double>(state.iterations());
  state.counters["GB"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
}

void BM_ApplyOptimizer(benchmark::State& state, OptimizerKind kind, double bytes_per_element) {
  constexpr int64_t kBlockFloats = int64_t{1} << 18;  // 1 MB blocks
  OptimizerParams p;
  p.kind = kind;
  const int num_slots = NumSlots(kind);
  std::vector<float> g(kOptimizerElements, 0.01f);
  std::vector<std::vector<float>> blocks;  // [w][slot 0][slot 1] per block
  for (int64_t b = 0; b < kOptimizerElements / kBlockFloats; ++b) {
    std::vector<float>& block = blocks.emplace_back((1 + num_slots) * kBlockFloats, 0.5f);
    for (int i = 0; i < num_slots; ++i) {
      std::fill_n(block.data() + (1 + i) * kBlockFloats, kBlockFloats, SlotInitialValue(p, i));
    }
  }
  int64_t step = 0;
  for (auto _ : state) {
    ++step;
    for (size_t b = 0; b < blocks.size(); ++b) {
      float* w = blocks[b].data();
      float* slots[2] = {w + kBlockFloats, w + 2 * kBlockFloats};
      ApplyOptimizer(p, step, absl::MakeSpan(w, kBlockFloats),
                     absl::MakeConstSpan(g.data() + b * kBlockFloats, kBlockFloats),
                     absl::MakeConstSpan(slots, num_slots));
    }
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
  if (const std::string core = BlasCoreToForce(); !core.empty()) {
    LOG(WARNING) << "OpenBLAS runs its " << BlasCoreName()
                 << " kernels, which use no AVX, on a CPU that has it: run with "
                    "OPENBLAS_CORETYPE="
                 << core << " for the GEMM figures of this CPU (ps_worker does so itself)";
  }
  // OpenBLAS starts its thread pool on the first call; keep that out of the first benchmark.
  {
    GemmShape warm{"warmup", false, false, 256, 256, 256};
    GemmOperands x(warm);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 256, 256, 256, 1.f, x.a.data(), 256,
                x.b.data(), 256, 0.f, x.c.data(), 256);
  }
  const bool gpu = (*backend)->kind() != DeviceKind::kCpu;
  std::unique_ptr<internal::DirectCublas> cublas;
  if (gpu) {
    absl::StatusOr<std::unique_ptr<internal::DirectCublas>> created =
        internal::DirectCublas::Create();
    if (!created.ok()) {
      LOG(ERROR) << created.status();
      return 1;
    }
    cublas = *std::move(created);
  }
  for (const GemmShape& s : GemmShapes(gpu)) {
    benchmark::internal::Benchmark* b =
        benchmark::RegisterBenchmark(("Gemm/" + s.name).c_str(), BM_Gemm, backend->get(),
                                     cublas.get(), s)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
    // A short --benchmark_min_time would give the big squares a single pair: no median.
    if (2.0 * s.m * s.n * s.k >= 1e9) b->Iterations(7);
  }
  benchmark::RegisterBenchmark("Optimizer/adam_16M", BM_ApplyOptimizer, OptimizerKind::kAdam, 28.0)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("Optimizer/adagrad_16M", BM_ApplyOptimizer, OptimizerKind::kAdagrad,
                               20.0)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("Optimizer/memcpy_16M", BM_Memcpy)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
