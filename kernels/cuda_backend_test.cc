// Every op of the CUDA backend against the CPU backend on the same inputs. Tagged "gpu" and
// built only with --config=cuda; skips itself when no CUDA device is present.
//   bazel test --config=cuda --config=gpu_tests //kernels:cuda_backend_test
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/optimizer.h"

namespace ps::kernels {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// |a - b| <= tol * max(1, |b|) elementwise.
void ExpectClose(const std::vector<float>& actual, const std::vector<float>& expected, float tol) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], tol * std::max(1.f, std::fabs(expected[i])))
        << "at index " << i;
  }
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateBackend("cuda", BackendOptions());
    if (!cuda.ok()) {
      ASSERT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition) << cuda.status();
      GTEST_SKIP() << "no CUDA device: " << cuda.status();
    }
    cuda_ = std::move(cuda).value();
    absl::StatusOr<std::unique_ptr<Backend>> cpu = CreateBackend("cpu", BackendOptions());
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(cpu).value();
  }

  template <typename T>
  DeviceBuffer Upload(const std::vector<T>& host) {
    absl::StatusOr<DeviceBuffer> buffer = cuda_->Allocate(host.size() * sizeof(T));
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_TRUE(cuda_->CopyToDevice(buffer->data(), host.data(), host.size() * sizeof(T)).ok());
    return std::move(buffer).value();
  }

  std::vector<float> Download(const DeviceBuffer& buffer, size_t n) {
    std::vector<float> host(n);
    const absl::Status s = cuda_->CopyToHost(host.data(), buffer.data(), n * sizeof(float));
    EXPECT_TRUE(s.ok()) << s;
    return host;
  }

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> cuda_;
};

TEST_F(CudaBackendTest, DescribesItself) {
  EXPECT_EQ(cuda_->kind(), DeviceKind::kCuda);
  EXPECT_FALSE(cuda_->Description().empty());
  absl::StatusOr<std::unique_ptr<Backend>> automatic = CreateBackend("auto", BackendOptions());
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ((*automatic)->kind(), DeviceKind::kCuda);
}

TEST_F(CudaBackendTest, CopyFillAndZero) {
  const std::vector<float> host = Random(1000, 1);
  DeviceBuffer a = Upload(host);
  absl::StatusOr<DeviceBuffer> b = cuda_->AllocateFloats(1000);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(cuda_->CopyDeviceToDevice(b->data(), a.data(), 4000).ok());
  EXPECT_EQ(Download(*b, 1000), host);
  ASSERT_TRUE(cuda_->Fill(b->floats(), 999, 2.5f).ok());
  ASSERT_TRUE(cuda_->Zero(b->floats() + 10, 5 * sizeof(float)).ok());
  std::vector<float> expected(1000, 2.5f);
  expected[999] = host[999];
  for (int i = 10; i < 15; ++i) expected[i] = 0.f;
  EXPECT_EQ(Download(*b, 1000), expected);
}

// A failed allocation leaves no error behind for the next kernel launch to report as its own
// (the runtime keeps a failed call's error until cudaGetLastError reads it, and every launcher
// ends with that call).
TEST_F(CudaBackendTest, AFailedAllocationDoesNotFailTheNextLaunch) {
  absl::StatusOr<DeviceBuffer> small = cuda_->AllocateFloats(16);
  ASSERT_TRUE(small.ok()) << small.status();
  absl::StatusOr<DeviceBuffer> huge = cuda_->Allocate(size_t{1} << 50);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  const absl::Status fill = cuda_->Fill(small->floats(), 16, 1.5f);
  EXPECT_TRUE(fill.ok()) << fill;
  EXPECT_EQ(Download(*small, 16), std::vector<float>(16, 1.5f));
}

// Likewise a loss whose scratch cannot grow (2^47 doubles), which also keeps the scratch it
// had for CountNonFinite and ApplyOptimizer, which use it without growing it.
TEST_F(CudaBackendTest, AScratchThatCannotGrowFailsOnlyItsOwnCall) {
  DeviceBuffer values = Upload(std::vector<float>{0.5f, 1.f, NAN, 0.f});
  const absl::StatusOr<float> loss = cuda_->SigmoidCrossEntropy(int64_t{1} << 47, values.floats(),
                                                                values.floats(), nullptr, nullptr);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kResourceExhausted) << loss.status();
  const absl::StatusOr<int64_t> bad = cuda_->CountNonFinite(4, values.floats());
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(*bad, 1);
  EXPECT_TRUE(cuda_->Fill(values.floats(), 4, 2.f).ok());
  EXPECT_EQ(Download(values, 4), std::vector<float>(4, 2.f));
}

TEST_F(CudaBackendTest, HostBuffersRoundTripThroughTheDevice) {
  const std::vector<float> values = Random(300'000, 4);
  absl::StatusOr<DeviceBuffer> host = cuda_->AllocateHost(values.size() * sizeof(float));
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(std::vector<float>(host->floats(), host->floats() + values.size()),
            std::vector<float>(values.size()));
  std::copy(values.begin(), values.end(), host->floats());
  absl::StatusOr<DeviceBuffer> device = cuda_->AllocateFloats(values.size());
  ASSERT_TRUE(device.ok());
  ASSERT_TRUE(cuda_->CopyToDevice(device->data(), host->data(), host->size_bytes()).ok());
  std::fill_n(host->floats(), values.size(), 0.f);
  ASSERT_TRUE(cuda_->CopyToHost(host->data(), device->data(), host->size_bytes()).ok());
  EXPECT_EQ(std::vector<float>(host->floats(), host->floats() + values.size()), values);
  EXPECT_EQ(Download(*device, values.size()), values);
}

// An asynchronous copy from page-locked memory is ordered before the work issued after it:
// a kernel that scales the copied values and the copy back see them, from page-locked and
// from ordinary (pageable) memory, and the host may write the source once the device waited.
TEST_F(CudaBackendTest, AsyncCopiesToTheDeviceComeBeforeLaterWork) {
  const std::vector<float> values = Random(300'000, 5);
  absl::StatusOr<DeviceBuffer> host = cuda_->AllocateHost(values.size() * sizeof(float));
  ASSERT_TRUE(host.ok()) << host.status();
  std::copy(values.begin(), values.end(), host->floats());
  std::vector<float> pageable = Random(1000, 6);
  absl::StatusOr<DeviceBuffer> device = cuda_->AllocateFloats(values.size());
  absl::StatusOr<DeviceBuffer> small = cuda_->AllocateFloats(pageable.size());
  ASSERT_TRUE(device.ok() && small.ok());
  ASSERT_TRUE(cuda_->Fill(device->floats(), values.size(), -1.f).ok());
  ASSERT_TRUE(cuda_->CopyToDeviceAsync(device->data(), host->data(), host->size_bytes()).ok());
  ASSERT_TRUE(cuda_->CopyToDeviceAsync(small->data(), pageable.data(), pageable.size() * 4).ok());
  // y = relu(x) in place, then back: each value as copied, or 0 where negative.
  ASSERT_TRUE(
      cuda_->ActivationForward(Activation::kRelu, values.size(), device->floats(), device->floats())
          .ok());
  ASSERT_TRUE(cuda_->Synchronize().ok());
  std::fill_n(host->floats(), values.size(), 0.f);
  std::vector<float> expected = values;
  for (float& v : expected) v = std::max(v, 0.f);
  EXPECT_EQ(Download(*device, values.size()), expected);
  EXPECT_EQ(Download(*small, pageable.size()), pageable);
  EXPECT_TRUE(cuda_->CopyToDeviceAsync(nullptr, host->data(), 4).code() ==
              absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, CountNonFiniteMatchesCpu) {
  // More elements than one reduction pass of blocks covers, non-finite values spread over it.
  std::vector<float> host = Random(3'000'000, 5);
  for (size_t i = 7; i < host.size(); i += 99'991) {
    host[i] = i % 3 == 0   ? std::numeric_limits<float>::quiet_NaN()
              : i % 3 == 1 ? std::numeric_limits<float>::infinity()
                           : -std::numeric_limits<float>::infinity();
  }
  DeviceBuffer x = Upload(host);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{100'000}, static_cast<int64_t>(host.size())}) {
    absl::StatusOr<int64_t> expected = cpu_->CountNonFinite(n, host.data());
    absl::StatusOr<int64_t> actual = cuda_->CountNonFinite(n, x.floats());
    ASSERT_TRUE(expected.ok() && actual.ok()) << actual.status();
    EXPECT_EQ(*actual, *expected) << "n = " << n;
  }
  EXPECT_GT(*cpu_->CountNonFinite(host.size(), host.data()), 20);
}

class CudaGemmTest : public CudaBackendTest,
                     public ::testing::WithParamInterface<std::tuple<bool, bool>> {};

TEST_P(CudaGemmTest, MatchesCpu) {
  const auto [trans_a, trans_b] = GetParam();
  const int m = 67, n = 45, k = 129;
  const int a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  const int lda = a_cols + 3, ldb = b_cols + 1, ldc = n + 7;
  const std::vector<float> a = Random(static_cast<size_t>(a_rows) * lda, 2);
  const std::vector<float> b = Random(static_cast<size_t>(b_rows) * ldb, 3);
  std::vector<float> c = Random(static_cast<size_t>(m) * ldc, 4);
  DeviceBuffer da = Upload(a), db = Upload(b), dc = Upload(c);
  ASSERT_TRUE(cuda_
                  ->Gemm(trans_a, trans_b, m, n, k, 1.5f, da.floats(), lda, db.floats(), ldb, -0.5f,
                         dc.floats(), ldc)
                  .ok());
  ASSERT_TRUE(cpu_->Gemm(trans_a, trans_b, m, n, k, 1.5f, a.data(), lda, b.data(), ldb, -0.5f,
                         c.data(), ldc)
                  .ok());
  ExpectClose(Download(dc, c.size()), c, 1e-4f);
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, CudaGemmTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST_F(CudaBackendTest, GemmEdgeCases) {
  // beta == 0 ignores NaN in c; k == 0 scales c by beta.
  const std::vector<float> a = {1, 2, 3, 4}, b = {1, 0, 0, 1};
  DeviceBuffer da = Upload(a), db = Upload(b);
  DeviceBuffer dc = Upload(std::vector<float>(4, std::numeric_limits<float>::quiet_NaN()));
  ASSERT_TRUE(
      cuda_->Gemm(false, false, 2, 2, 2, 1.f, da.floats(), 2, db.floats(), 2, 0.f, dc.floats(), 2)
          .ok());
  EXPECT_EQ(Download(dc, 4), a);
  ASSERT_TRUE(
      cuda_->Gemm(false, false, 2, 2, 0, 1.f, nullptr, 1, nullptr, 2, 2.f, dc.floats(), 2).ok());
  EXPECT_EQ(Download(dc, 4), (std::vector<float>{2, 4, 6, 8}));
}

TEST_F(CudaBackendTest, BiasAddAndBiasGradMatchCpu) {
  const int rows = 300, cols = 77;
  std::vector<float> x = Random(rows * cols, 5);
  const std::vector<float> bias = Random(cols, 6);
  DeviceBuffer dx = Upload(x), dbias = Upload(bias);
  ASSERT_TRUE(cuda_->BiasAdd(rows, cols, dbias.floats(), dx.floats()).ok());
  ASSERT_TRUE(cpu_->BiasAdd(rows, cols, bias.data(), x.data()).ok());
  ExpectClose(Download(dx, x.size()), x, 1e-6f);

  std::vector<float> db(cols);
  DeviceBuffer ddb = Upload(std::vector<float>(cols, 7.f));
  ASSERT_TRUE(cuda_->BiasGrad(rows, cols, dx.floats(), ddb.floats()).ok());
  ASSERT_TRUE(cpu_->BiasGrad(rows, cols, x.data(), db.data()).ok());
  ExpectClose(Download(ddb, cols), db, 1e-5f);
}

TEST_F(CudaBackendTest, ActivationsMatchCpu) {
  const int n = 10001;
  const std::vector<float> x = Random(n, 7, -5.f, 5.f);
  const std::vector<float> dy = Random(n, 8);
  for (Activation act : {Activation::kRelu, Activation::kTanh, Activation::kSigmoid}) {
    std::vector<float> y(n), dx(n);
    ASSERT_TRUE(cpu_->ActivationForward(act, n, x.data(), y.data()).ok());
    ASSERT_TRUE(cpu_->ActivationBackward(act, n, y.data(), dy.data(), dx.data()).ok());
    DeviceBuffer dx_dev = Upload(x), dy_dev = Upload(dy);
    absl::StatusOr<DeviceBuffer> y_dev = cuda_->AllocateFloats(n);
    ASSERT_TRUE(y_dev.ok());
    ASSERT_TRUE(cuda_->ActivationForward(act, n, dx_dev.floats(), y_dev->floats()).ok());
    ExpectClose(Download(*y_dev, n), y, 1e-6f);
    // In place: dx overwrites dy.
    ASSERT_TRUE(
        cuda_->ActivationBackward(act, n, y_dev->floats(), dy_dev.floats(), dy_dev.floats()).ok());
    ExpectClose(Download(dy_dev, n), dx, 1e-6f);
  }
}

TEST_F(CudaBackendTest, SoftmaxCrossEntropyMatchesCpu) {
  for (int classes : {10, 33, 1000}) {
    const int rows = 129;
    const std::vector<float> logits = Random(rows * classes, 9, -4.f, 4.f);
    std::vector<int32_t> labels(rows);
    for (int r = 0; r < rows; ++r) labels[r] = (r * 7) % classes;
    std::vector<float> grad(logits.size());
    absl::StatusOr<float> cpu_loss =
        cpu_->SoftmaxCrossEntropy(rows, classes, logits.data(), labels.data(), grad.data());
    ASSERT_TRUE(cpu_loss.ok());
    DeviceBuffer dlogits = Upload(logits), dlabels = Upload(labels);
    absl::StatusOr<DeviceBuffer> dgrad = cuda_->AllocateFloats(logits.size());
    ASSERT_TRUE(dgrad.ok());
    absl::StatusOr<float> cuda_loss = cuda_->SoftmaxCrossEntropy(rows, classes, dlogits.floats(),
                                                                 dlabels.ints(), dgrad->floats());
    ASSERT_TRUE(cuda_loss.ok()) << cuda_loss.status();
    EXPECT_NEAR(*cuda_loss, *cpu_loss, 1e-5f * std::fabs(*cpu_loss)) << classes;
    ExpectClose(Download(*dgrad, grad.size()), grad, 1e-6f);
  }
}

TEST_F(CudaBackendTest, SoftmaxEvalMatchesCpuIncludingTies) {
  const int rows = 40, classes = 7;
  std::vector<float> logits = Random(rows * classes, 10);
  // Rows with ties: the lowest index must win on both backends.
  for (int r = 0; r < rows; r += 3) {
    logits[r * classes + 2] = 5.f;
    logits[r * classes + 5] = 5.f;
  }
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = r % 2 == 0 ? 2 : 5;
  std::vector<float> probs(logits.size());
  absl::StatusOr<SoftmaxEvalResult> cpu =
      cpu_->SoftmaxEval(rows, classes, logits.data(), labels.data(), probs.data());
  ASSERT_TRUE(cpu.ok());
  DeviceBuffer dlogits = Upload(logits), dlabels = Upload(labels);
  absl::StatusOr<DeviceBuffer> dprobs = cuda_->AllocateFloats(logits.size());
  ASSERT_TRUE(dprobs.ok());
  absl::StatusOr<SoftmaxEvalResult> cuda =
      cuda_->SoftmaxEval(rows, classes, dlogits.floats(), dlabels.ints(), dprobs->floats());
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->num_correct, cpu->num_correct);
  EXPECT_NEAR(cuda->mean_loss, cpu->mean_loss, 1e-5f);
  ExpectClose(Download(*dprobs, probs.size()), probs, 1e-6f);
}

TEST_F(CudaBackendTest, SoftmaxRejectsBadLabel) {
  DeviceBuffer dlogits = Upload(std::vector<float>(6, 0.f));
  DeviceBuffer dlabels = Upload(std::vector<int32_t>{1, 3});
  EXPECT_EQ(
      cuda_->SoftmaxCrossEntropy(2, 3, dlogits.floats(), dlabels.ints(), nullptr).status().code(),
      absl::StatusCode::kInvalidArgument);
  // The error is reported once, then the backend is usable again.
  EXPECT_TRUE(cuda_->Synchronize().ok());
}

TEST_F(CudaBackendTest, SigmoidCrossEntropyMatchesCpu) {
  const int n = 5000;
  const std::vector<float> logits = Random(n, 11, -20.f, 20.f);
  std::vector<float> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = i % 3 == 0 ? 1.f : 0.f;
  std::vector<float> grad(n), probs(n);
  absl::StatusOr<float> cpu_loss =
      cpu_->SigmoidCrossEntropy(n, logits.data(), labels.data(), grad.data(), probs.data());
  ASSERT_TRUE(cpu_loss.ok());
  DeviceBuffer dlogits = Upload(logits), dlabels = Upload(labels);
  absl::StatusOr<DeviceBuffer> dgrad = cuda_->AllocateFloats(n), dprobs = cuda_->AllocateFloats(n);
  ASSERT_TRUE(dgrad.ok() && dprobs.ok());
  absl::StatusOr<float> cuda_loss = cuda_->SigmoidCrossEntropy(
      n, dlogits.floats(), dlabels.floats(), dgrad->floats(), dprobs->floats());
  ASSERT_TRUE(cuda_loss.ok()) << cuda_loss.status();
  EXPECT_NEAR(*cuda_loss, *cpu_loss, 1e-5f * std::fabs(*cpu_loss));
  ExpectClose(Download(*dgrad, n), grad, 1e-6f);
  ExpectClose(Download(*dprobs, n), probs, 1e-6f);
}

TEST_F(CudaBackendTest, EmbeddingGatherAndScatterAddMatchCpu) {
  const int rows = 500, dim = 24, n = 3000;
  const std::vector<float> table = Random(rows * dim, 12);
  std::vector<int32_t> indices(n);
  std::mt19937 rng(13);
  for (int32_t& i : indices) i = static_cast<int32_t>(rng() % rows);  // many repeats
  std::vector<float> out(n * dim);
  ASSERT_TRUE(cpu_->EmbeddingGather(n, dim, table.data(), rows, indices.data(), out.data()).ok());
  DeviceBuffer dtable = Upload(table), dindices = Upload(indices);
  absl::StatusOr<DeviceBuffer> dout = cuda_->AllocateFloats(n * dim);
  ASSERT_TRUE(dout.ok());
  ASSERT_TRUE(
      cuda_->EmbeddingGather(n, dim, dtable.floats(), rows, dindices.ints(), dout->floats()).ok());
  EXPECT_EQ(Download(*dout, out.size()), out);

  std::vector<float> acc(rows * dim, 1.f);
  ASSERT_TRUE(cpu_->EmbeddingScatterAdd(n, dim, out.data(), indices.data(), rows, acc.data()).ok());
  DeviceBuffer dacc = Upload(std::vector<float>(rows * dim, 1.f));
  ASSERT_TRUE(
      cuda_->EmbeddingScatterAdd(n, dim, dout->floats(), dindices.ints(), rows, dacc.floats())
          .ok());
  ExpectClose(Download(dacc, acc.size()), acc, 1e-5f);
}

// Memory registered with RegisterHost, here a shared mapping of a memfd as a worker's
// shared-memory segment is, at an offset inside a page: copies both ways land where they
// should, registering it again is refused, and after UnregisterHost it can be registered anew.
TEST_F(CudaBackendTest, RegisteredSharedMemoryCopiesBothWays) {
  const size_t bytes = size_t{4} << 20;
  const int fd = memfd_create("cuda_backend_test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED);
  const size_t n = 300000;  // floats, from byte 1024 on
  float* host = reinterpret_cast<float*>(static_cast<char*>(map) + 1024);
  ASSERT_TRUE(cuda_->RegisterHost(host, n * sizeof(float)).ok());
  EXPECT_EQ(cuda_->RegisterHost(host, n * sizeof(float)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(cuda_->RegisterHost(nullptr, 4).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<float> values = Random(n, 21);
  DeviceBuffer device = Upload(values);
  ASSERT_TRUE(cuda_->CopyToHost(host, device.data(), n * sizeof(float)).ok());
  EXPECT_TRUE(std::equal(values.begin(), values.end(), host));
  for (size_t i = 0; i < n; ++i) host[i] = -values[i];
  ASSERT_TRUE(cuda_->CopyToDevice(device.data(), host, n * sizeof(float)).ok());
  const std::vector<float> back = Download(device, n);
  for (size_t i = 0; i < n; i += 9973) ASSERT_EQ(back[i], -values[i]) << i;
  cuda_->UnregisterHost(host);
  cuda_->UnregisterHost(host);  // nothing: not registered any more
  EXPECT_TRUE(cuda_->RegisterHost(host, n * sizeof(float)).ok());
  cuda_->UnregisterHost(host);
  munmap(map, bytes);
}

TEST_F(CudaBackendTest, EmbeddingBadIndexIsReportedBySynchronize) {
  DeviceBuffer dtable = Upload(std::vector<float>{1, 2, 3, 4});
  DeviceBuffer dindices = Upload(std::vector<int32_t>{1, 7});
  absl::StatusOr<DeviceBuffer> dout = cuda_->AllocateFloats(4);
  ASSERT_TRUE(dout.ok());
  ASSERT_TRUE(
      cuda_->EmbeddingGather(2, 2, dtable.floats(), 2, dindices.ints(), dout->floats()).ok());
  EXPECT_EQ(cuda_->Synchronize().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cuda_->Synchronize().ok());
  EXPECT_EQ(Download(*dout, 4), (std::vector<float>{3, 4, 0, 0}));
}

class CudaOptimizerTest : public CudaBackendTest,
                          public ::testing::WithParamInterface<OptimizerKind> {};

TEST_P(CudaOptimizerTest, ThreeStepsMatchCpu) {
  const int n = 100003;  // several blocks and a ragged tail
  OptimizerParams p;
  p.kind = GetParam();
  p.learning_rate = 0.05f;
  p.l1 = 0.001f;
  p.l2 = 0.01f;
  p.weight_decay = 0.001f;
  p.clip_value = 0.8f;
  p.clip_norm = 100.f;  // the gradients below have norm ~ 180, so clipping is active
  const int slots = NumSlots(p.kind);
  std::vector<float> w = Random(n, 14);
  std::vector<std::vector<float>> s(slots);
  std::vector<DeviceBuffer> ds;
  std::vector<float*> s_ptrs, ds_ptrs;
  for (int i = 0; i < slots; ++i) {
    s[i].assign(n, SlotInitialValue(p, i));
    ds.push_back(Upload(s[i]));
  }
  for (int i = 0; i < slots; ++i) {
    s_ptrs.push_back(s[i].data());
    ds_ptrs.push_back(ds[i].floats());
  }
  DeviceBuffer dw = Upload(w);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> g = Random(n, 100 + step);
    DeviceBuffer dg = Upload(g);
    ASSERT_TRUE(cuda_->ApplyOptimizer(p, step, n, dw.floats(), dg.floats(), ds_ptrs).ok());
    ApplyOptimizer(p, step, absl::MakeSpan(w), g, s_ptrs);
  }
  ExpectClose(Download(dw, n), w, 1e-5f);
  for (int i = 0; i < slots; ++i) ExpectClose(Download(ds[i], n), s[i], 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, CudaOptimizerTest,
                         ::testing::Values(OptimizerKind::kSgd, OptimizerKind::kMomentum,
                                           OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                                           OptimizerKind::kFtrl));

}  // namespace
}  // namespace ps::kernels
