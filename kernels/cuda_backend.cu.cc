// The CUDA backend: cuBLAS for GEMM, the kernels of cuda_kernels.cu.cc for the rest. Built
// only with --config=cuda; cuda_backend_stub.cc stands in for it otherwise.
//
// Execution model: one device, one non-blocking stream and one cuBLAS handle per backend; all
// work is enqueued on that stream in call order. Host-visible results (loss sums, the device
// error flags) live in one small block of mapped pinned host memory, which kernels write
// directly, so reading them costs a stream synchronization and no extra copy.
//
// Deferred errors: kernels that meet a bad index or label set a bit in the mapped flags
// instead of faulting. Wait() (called by Synchronize, CopyToHost and the losses) turns set
// bits into INVALID_ARGUMENT and clears them.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/backend.h"
#include "kernels/cuda_status.h"
#include "kernels/internal/backend_checks.h"
#include "kernels/internal/backend_factories.h"
#include "kernels/internal/cuda_kernels.h"
#include "kernels/internal/optimizer_math.h"

namespace ps::kernels {
namespace {

using internal::CheckMatrix;
using internal::CheckPointer;
using internal::CheckSize;

// ---- RAII owners of CUDA resources -------------------------------------------------------------

void LogIfCudaError(cudaError_t error, absl::string_view what) {
  if (error != cudaSuccess) LOG(ERROR) << CudaCallToStatus(error, what);
}

struct StreamDeleter {
  void operator()(cudaStream_t s) const {
    LogIfCudaError(cudaStreamDestroy(s), "cudaStreamDestroy");
  }
};
using StreamPtr = std::unique_ptr<CUstream_st, StreamDeleter>;

struct CublasDeleter {
  void operator()(cublasHandle_t h) const {
    const absl::Status s = CublasErrorToStatus(cublasDestroy(h), "cublasDestroy");
    if (!s.ok()) LOG(ERROR) << s;
  }
};
using CublasPtr = std::unique_ptr<cublasContext, CublasDeleter>;

struct DeviceMemoryDeleter {
  void operator()(void* p) const { LogIfCudaError(cudaFree(p), "cudaFree"); }
};
using DeviceMemoryPtr = std::unique_ptr<void, DeviceMemoryDeleter>;

struct PinnedMemoryDeleter {
  void operator()(void* p) const { LogIfCudaError(cudaFreeHost(p), "cudaFreeHost"); }
};
using PinnedMemoryPtr = std::unique_ptr<void, PinnedMemoryDeleter>;

// Host-mapped block that kernels write and the host reads after synchronizing.
struct MappedStatus {
  int error_flags;  // internal::kEmbeddingIndexError | internal::kLabelError
  int padding;
  double sums[2];  // reduction results of the loss functions
};

// Scratch layout, in doubles: reduction partials, the optimizer's squared norm, then
// per-row/per-element values of the losses.
constexpr int64_t kPartialsOffset = 0;
constexpr int64_t kSumSqOffset = internal::kMaxReduceBlocks;
constexpr int64_t kItemsOffset = internal::kMaxReduceBlocks + 32;
constexpr int64_t kInitialScratch = kItemsOffset + 4096;

// Thread-compatible (see Backend).
class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const BackendOptions& options) {
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess || count == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device \"cuda\" requested, but no usable CUDA device is present (",
          error != cudaSuccess ? CudaCallToStatus(error, "cudaGetDeviceCount").message()
                               : "cudaGetDeviceCount: 0 devices",
          ")"));
    }
    if (options.device_index >= count) {
      return absl::InvalidArgumentError(absl::StrCat("BackendOptions.device_index ",
                                                     options.device_index, " but only ", count,
                                                     " CUDA devices are present"));
    }
    auto backend = std::unique_ptr<CudaBackend>(new CudaBackend(options.device_index));
    RETURN_IF_ERROR_CTX(backend->Init(), absl::StrCat("cuda:", options.device_index));
    return std::unique_ptr<Backend>(std::move(backend));
  }

  ~CudaBackend() override {
    // Outstanding work may still use buffers the members free.
    if (stream_ != nullptr) {
      LogIfCudaError(cudaSetDevice(device_), "cudaSetDevice");
      LogIfCudaError(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
    }
    // Ranges the caller did not unregister: the memory may be unmapped after us.
    while (!registered_.empty()) UnregisterHost(registered_.begin()->first);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string Description() const override { return description_; }

  absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes) override {
    RETURN_IF_ERROR(CheckCopy("CopyToDevice", device_dst, host_src, bytes));
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream()),
        "CopyToDevice");
    // The caller may reuse host_src as soon as we return.
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream()), "CopyToDevice");
    return absl::OkStatus();
  }

  // Issued on the stream, not waited for: host_src is read until the next wait (Backend).
  absl::Status CopyToDeviceAsync(void* device_dst, const void* host_src, size_t bytes) override {
    RETURN_IF_ERROR(CheckCopy("CopyToDeviceAsync", device_dst, host_src, bytes));
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream()),
        "CopyToDeviceAsync");
    return absl::OkStatus();
  }

  // Page-locks the pages under [data, data + bytes) (cudaHostRegister), within the same
  // kMaxPinnedBytes as AllocateHost's buffers.
  absl::Status RegisterHost(void* data, size_t bytes) override {
    RETURN_IF_ERROR(Backend::RegisterHost(data, bytes));
    if (registered_.count(data) > 0) {
      return absl::AlreadyExistsError("RegisterHost: that memory is registered already");
    }
    if (bytes > kMaxPinnedBytes - std::min(pinned_bytes_, kMaxPinnedBytes)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("RegisterHost: ", bytes, " bytes past the ", kMaxPinnedBytes,
                       "-byte limit of page-locked memory (", pinned_bytes_, " in use)"));
    }
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(cudaHostRegister(data, bytes, cudaHostRegisterDefault),
                         "cudaHostRegister");
    pinned_bytes_ += bytes;
    registered_.emplace(data, bytes);
    return absl::OkStatus();
  }

  void UnregisterHost(void* data) override {
    auto it = registered_.find(data);
    if (it == registered_.end()) return;
    pinned_bytes_ -= it->second;
    registered_.erase(it);
    LogIfCudaError(cudaSetDevice(device_), "cudaSetDevice");
    LogIfCudaError(cudaHostUnregister(data), "cudaHostUnregister");
  }

  absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes) override {
    RETURN_IF_ERROR(CheckCopy("CopyToHost", host_dst, device_src, bytes));
    RETURN_IF_ERROR(Activate());
    if (bytes > 0) {
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream()),
          "CopyToHost");
    }
    return Wait("CopyToHost");
  }

  absl::Status CopyDeviceToDevice(void* device_dst, const void* device_src, size_t bytes) override {
    RETURN_IF_ERROR(CheckCopy("CopyDeviceToDevice", device_dst, device_src, bytes));
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, stream()),
        "CopyDeviceToDevice");
    return absl::OkStatus();
  }

  absl::Status Fill(float* x, int64_t n, float value) override {
    RETURN_IF_ERROR(CheckSize("Fill", "n", n));
    RETURN_IF_ERROR(CheckPointer("Fill", "x", x, n));
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(internal::LaunchFill(n, value, x, stream()), "Fill");
    return absl::OkStatus();
  }

  absl::Status Zero(void* x, size_t bytes) override {
    RETURN_IF_ERROR(CheckPointer("Zero", "x", x, static_cast<int64_t>(bytes)));
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(cudaMemsetAsync(x, 0, bytes, stream()), "Zero");
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    RETURN_IF_ERROR(Activate());
    return Wait("Synchronize");
  }

  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    RETURN_IF_ERROR(internal::CheckGemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc));
    if (m == 0 || n == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Activate());
    if (k == 0) {
      RETURN_IF_CUDA_ERROR(internal::LaunchScaleMatrix(m, n, beta, c, ldc, stream()), "Gemm");
      return absl::OkStatus();
    }
    // cuBLAS is column-major; a row-major matrix is its transpose in column-major view. So
    // row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands and
    // m/n, keep each operand's own transpose flag.
    RETURN_IF_CUBLAS_ERROR(cublasSgemm(cublas_.get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb,
                                       a, lda, &beta, c, ldc),
                           "Gemm");
    return absl::OkStatus();
  }

  absl::Status BiasAdd(int64_t rows, int64_t cols, const float* bias, float* x) override {
    RETURN_IF_ERROR(CheckMatrix("BiasAdd", rows, cols, 0, {bias, x}));
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(internal::LaunchBiasAdd(rows, cols, bias, x, stream()), "BiasAdd");
    return absl::OkStatus();
  }

  absl::Status BiasGrad(int64_t rows, int64_t cols, const float* dy, float* db) override {
    RETURN_IF_ERROR(CheckMatrix("BiasGrad", rows, cols, 0, {dy, db}));
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(internal::LaunchBiasGrad(rows, cols, dy, db, stream()), "BiasGrad");
    return absl::OkStatus();
  }

  absl::Status ActivationForward(Activation act, int64_t n, const float* x, float* y) override {
    RETURN_IF_ERROR(CheckMatrix("ActivationForward", 1, n, 0, {x, y}));
    RETURN_IF_ERROR(CheckActivation("ActivationForward", act));
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(internal::LaunchActivationForward(act, n, x, y, stream()),
                         "ActivationForward");
    return absl::OkStatus();
  }

  absl::Status ActivationBackward(Activation act, int64_t n, const float* y, const float* dy,
                                  float* dx) override {
    RETURN_IF_ERROR(CheckMatrix("ActivationBackward", 1, n, 0, {y, dy, dx}));
    RETURN_IF_ERROR(CheckActivation("ActivationBackward", act));
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(internal::LaunchActivationBackward(act, n, y, dy, dx, stream()),
                         "ActivationBackward");
    return absl::OkStatus();
  }

  absl::StatusOr<float> SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                            const int32_t* labels, float* grad_out) override {
    ASSIGN_OR_RETURN(const SoftmaxEvalResult result,
                     RunSoftmax("SoftmaxCrossEntropy", rows, classes, logits, labels, grad_out,
                                nullptr, /*count_correct=*/false));
    return result.mean_loss;
  }

  absl::StatusOr<SoftmaxEvalResult> SoftmaxEval(int64_t rows, int64_t classes, const float* logits,
                                                const int32_t* labels,
                                                float* probabilities) override {
    return RunSoftmax("SoftmaxEval", rows, classes, logits, labels, nullptr, probabilities,
                      /*count_correct=*/true);
  }

  absl::StatusOr<float> SigmoidCrossEntropy(int64_t n, const float* logits, const float* labels,
                                            float* grad_out, float* probabilities) override {
    constexpr absl::string_view kOp = "SigmoidCrossEntropy";
    RETURN_IF_ERROR(CheckMatrix(kOp, 1, n, 1, {logits, labels}));
    RETURN_IF_ERROR(Activate());
    RETURN_IF_ERROR(EnsureScratch(kItemsOffset + n));
    double* elem_loss = scratch() + kItemsOffset;
    RETURN_IF_CUDA_ERROR(internal::LaunchSigmoidXent(n, logits, labels, 1.f / n, grad_out,
                                                     probabilities, elem_loss, stream()),
                         kOp);
    RETURN_IF_CUDA_ERROR(internal::LaunchSum(n, elem_loss, scratch() + kPartialsOffset,
                                             &mapped_device_->sums[0], stream()),
                         kOp);
    RETURN_IF_ERROR(Wait(kOp));
    return static_cast<float>(mapped_->sums[0] / n);
  }

  absl::Status EmbeddingGather(int64_t n, int64_t dim, const float* table, int64_t table_rows,
                               const int32_t* indices, float* out) override {
    constexpr absl::string_view kOp = "EmbeddingGather";
    RETURN_IF_ERROR(CheckMatrix(kOp, n, dim, 0, {indices, out}));
    RETURN_IF_ERROR(CheckSize(kOp, "table_rows", table_rows));
    RETURN_IF_ERROR(CheckPointer(kOp, "table", table, table_rows * dim));
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(internal::LaunchEmbeddingGather(n, dim, table, table_rows, indices, out,
                                                         &mapped_device_->error_flags, stream()),
                         kOp);
    return absl::OkStatus();
  }

  absl::Status EmbeddingScatterAdd(int64_t n, int64_t dim, const float* grads,
                                   const int32_t* indices, int64_t out_rows, float* out) override {
    constexpr absl::string_view kOp = "EmbeddingScatterAdd";
    RETURN_IF_ERROR(CheckMatrix(kOp, n, dim, 0, {grads, indices}));
    RETURN_IF_ERROR(CheckSize(kOp, "out_rows", out_rows));
    RETURN_IF_ERROR(CheckPointer(kOp, "out", out, out_rows * dim));
    RETURN_IF_ERROR(Activate());
    RETURN_IF_CUDA_ERROR(
        internal::LaunchEmbeddingScatterAdd(n, dim, grads, indices, out_rows, out,
                                            &mapped_device_->error_flags, stream()),
        kOp);
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> CountNonFinite(int64_t n, const float* x) override {
    constexpr absl::string_view kOp = "CountNonFinite";
    RETURN_IF_ERROR(CheckSize(kOp, "n", n, 0));
    RETURN_IF_ERROR(CheckPointer(kOp, "x", x, n));
    if (n == 0) return 0;
    RETURN_IF_ERROR(Activate());
    // (A no-op but after a scratch that could not grow nor be taken again at its old size.)
    RETURN_IF_ERROR(EnsureScratch(kInitialScratch));
    RETURN_IF_CUDA_ERROR(internal::LaunchCountNonFinite(n, x, scratch() + kPartialsOffset,
                                                        &mapped_device_->sums[0], stream()),
                         kOp);
    RETURN_IF_ERROR(Wait(kOp));
    return static_cast<int64_t>(mapped_->sums[0] + 0.5);
  }

  absl::Status ApplyOptimizer(const OptimizerParams& p, int64_t step, int64_t n, float* params,
                              const float* grads, absl::Span<float* const> slots) override {
    constexpr absl::string_view kOp = "ApplyOptimizer";
    RETURN_IF_ERROR(internal::CheckOptimizerCall(p, step, n, params, grads, slots));
    if (n == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Activate());
    const internal::OptimizerConsts c = internal::MakeOptimizerConsts(p, step);
    // With clip_norm the norm is reduced on the device and read there by the update kernel:
    // no host round trip between the two passes.
    const double* sum_sq = nullptr;
    if (p.clip_norm > 0) {
      RETURN_IF_ERROR(EnsureScratch(kInitialScratch));  // as CountNonFinite
      double* out = scratch() + kSumSqOffset;
      RETURN_IF_CUDA_ERROR(internal::LaunchClippedGradSumSq(
                               c, n, params, grads, scratch() + kPartialsOffset, out, stream()),
                           kOp);
      sum_sq = out;
    }
    float* slot0 = slots.size() > 0 ? slots[0] : nullptr;
    float* slot1 = slots.size() > 1 ? slots[1] : nullptr;
    RETURN_IF_CUDA_ERROR(internal::LaunchOptimizer(p.kind, c, p.clip_norm, sum_sq, n, params, grads,
                                                   slot0, slot1, stream()),
                         kOp);
    return absl::OkStatus();
  }

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes) override {
    RETURN_IF_ERROR(Activate());
    void* p = nullptr;
    RETURN_IF_CUDA_ERROR(cudaMalloc(&p, bytes), absl::StrCat("Allocate ", bytes, " bytes"));
    return p;
  }

  void FreeRaw(void* data) override {
    LogIfCudaError(cudaSetDevice(device_), "cudaSetDevice");
    LogIfCudaError(cudaFree(data), "cudaFree");
  }

  // Page-locked, up to kMaxPinnedBytes per backend: a copy from pageable memory goes through
  // the driver's staging buffer (the MLP's two 0.94 MB copies a step took 0.45-0.49 ms of
  // compute instead of 0.32-0.40 on an H200). Beyond the cap, or when the driver cannot lock
  // more, ordinary memory: page-locked memory is taken from the whole machine's.
  absl::StatusOr<void*> AllocateHostRaw(size_t bytes) override {
    RETURN_IF_ERROR(Activate());
    if (pinned_bytes_ + bytes <= kMaxPinnedBytes) {
      void* p = nullptr;
      const cudaError_t error = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
      if (error == cudaSuccess) {
        pinned_bytes_ += bytes;
        pinned_.emplace(p, bytes);
        return p;
      }
      cudaGetLastError();  // not sticky; clear it for the next call's check
      LOG_FIRST_N(WARNING, 1) << "cudaHostAlloc of " << bytes << " bytes failed ("
                              << cudaGetErrorString(error)
                              << "): host buffers in ordinary memory, copied more slowly";
    }
    return Backend::AllocateHostRaw(bytes);
  }

  void FreeHostRaw(void* data) override {
    auto it = pinned_.find(data);
    if (it == pinned_.end()) return Backend::FreeHostRaw(data);
    pinned_bytes_ -= it->second;
    pinned_.erase(it);
    LogIfCudaError(cudaFreeHost(data), "cudaFreeHost");
  }

 private:
  explicit CudaBackend(int device) : device_(device) {}

  absl::Status Init() {
    RETURN_IF_ERROR(Activate());
    cudaDeviceProp prop;
    RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    description_ = absl::StrCat("cuda:", device_, " (", prop.name, ", ", prop.multiProcessorCount,
                                " SMs, ", prop.totalGlobalMem >> 20, " MiB)");
    cudaStream_t stream = nullptr;
    RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                         "cudaStreamCreate");
    stream_.reset(stream);
    cublasHandle_t handle = nullptr;
    RETURN_IF_CUBLAS_ERROR(cublasCreate(&handle), "cublasCreate");
    cublas_.reset(handle);
    RETURN_IF_CUBLAS_ERROR(cublasSetStream(handle, stream), "cublasSetStream");
    void* mapped = nullptr;
    RETURN_IF_CUDA_ERROR(cudaHostAlloc(&mapped, sizeof(MappedStatus), cudaHostAllocMapped),
                         "cudaHostAlloc");
    mapped_memory_.reset(mapped);
    mapped_ = static_cast<MappedStatus*>(mapped);
    *mapped_ = MappedStatus{};
    void* mapped_device = nullptr;
    RETURN_IF_CUDA_ERROR(cudaHostGetDevicePointer(&mapped_device, mapped, 0),
                         "cudaHostGetDevicePointer");
    mapped_device_ = static_cast<MappedStatus*>(mapped_device);
    return EnsureScratch(kInitialScratch);
  }

  // Makes this backend's device current for the calling thread (a Backend may be handed
  // between threads; the current device is per thread).
  absl::Status Activate() const {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    return absl::OkStatus();
  }

  cudaStream_t stream() const { return stream_.get(); }
  double* scratch() const { return static_cast<double*>(scratch_.get()); }

  absl::Status EnsureScratch(int64_t doubles) {
    if (doubles <= scratch_doubles_) return absl::OkStatus();
    const int64_t grown = doubles > 2 * scratch_doubles_ ? doubles : 2 * scratch_doubles_;
    // Allocated while the old one is kept, where both fit. Where they do not, the old one is
    // let go first (after the work that may still read it), and where the new one does not fit
    // alone either (a loss over more rows than the device holds), the old size is taken again
    // for CountNonFinite and ApplyOptimizer, which use the scratch without growing it.
    void* p = nullptr;
    absl::Status made = CudaCallToStatus(cudaMalloc(&p, grown * sizeof(double)), "scratch");
    // Issued work may still read the old scratch.
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream()), "scratch");
    if (!made.ok()) {
      const int64_t old = scratch_doubles_;
      scratch_.reset();
      scratch_doubles_ = 0;
      made = CudaCallToStatus(cudaMalloc(&p, grown * sizeof(double)), "scratch");
      if (!made.ok()) {
        if (old > 0 && CudaCallToStatus(cudaMalloc(&p, old * sizeof(double)), "scratch").ok()) {
          scratch_.reset(p);
          scratch_doubles_ = old;
        }
        return made;
      }
    }
    scratch_.reset(p);
    scratch_doubles_ = grown;
    return absl::OkStatus();
  }

  // Waits for the stream; then reports (and clears) any deferred input error.
  absl::Status Wait(absl::string_view op) {
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream()), op);
    const int flags = mapped_->error_flags;
    if (flags == 0) return absl::OkStatus();
    mapped_->error_flags = 0;
    std::string what;
    if (flags & internal::kLabelError) what = "a label is outside [0, classes)";
    if (flags & internal::kEmbeddingIndexError) {
      absl::StrAppend(&what, what.empty() ? "" : "; ",
                      "an EmbeddingGather/EmbeddingScatterAdd index was out of range "
                      "(those rows were zeroed/skipped)");
    }
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
  }

  absl::StatusOr<SoftmaxEvalResult> RunSoftmax(absl::string_view op, int64_t rows, int64_t classes,
                                               const float* logits, const int32_t* labels,
                                               float* grad_out, float* probabilities,
                                               bool count_correct) {
    RETURN_IF_ERROR(CheckMatrix(op, rows, classes, 1, {logits, labels}));
    RETURN_IF_ERROR(Activate());
    RETURN_IF_ERROR(EnsureScratch(kItemsOffset + 2 * rows));
    double* row_loss = scratch() + kItemsOffset;
    double* row_correct = row_loss + rows;
    double* partials = scratch() + kPartialsOffset;
    RETURN_IF_CUDA_ERROR(internal::LaunchSoftmaxXent(rows, classes, logits, labels, 1.f / rows,
                                                     grad_out, probabilities, row_loss, row_correct,
                                                     &mapped_device_->error_flags, stream()),
                         op);
    RETURN_IF_CUDA_ERROR(
        internal::LaunchSum(rows, row_loss, partials, &mapped_device_->sums[0], stream()), op);
    if (count_correct) {
      RETURN_IF_CUDA_ERROR(
          internal::LaunchSum(rows, row_correct, partials, &mapped_device_->sums[1], stream()), op);
    }
    RETURN_IF_ERROR(Wait(op));
    SoftmaxEvalResult result;
    result.mean_loss = static_cast<float>(mapped_->sums[0] / rows);
    result.num_correct = count_correct ? static_cast<int64_t>(mapped_->sums[1] + 0.5) : 0;
    return result;
  }

  static absl::Status CheckCopy(absl::string_view op, void* dst, const void* src, size_t bytes) {
    RETURN_IF_ERROR(CheckPointer(op, "destination", dst, static_cast<int64_t>(bytes)));
    return CheckPointer(op, "source", src, static_cast<int64_t>(bytes));
  }

  static absl::Status CheckActivation(absl::string_view op, Activation act) {
    switch (act) {
      case Activation::kRelu:
      case Activation::kTanh:
      case Activation::kSigmoid:
        return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(op, ": unknown activation"));
  }

  static constexpr size_t kMaxPinnedBytes = size_t{1} << 30;

  // Constant after construction.
  const int device_;
  std::string description_;
  // Declared before the buffers so that it is destroyed after them.
  StreamPtr stream_;
  CublasPtr cublas_;
  PinnedMemoryPtr mapped_memory_;
  MappedStatus* mapped_ = nullptr;         // Host view of mapped_memory_.
  MappedStatus* mapped_device_ = nullptr;  // Device view of mapped_memory_.
  // AllocateHost's page-locked buffers and their sizes (the others are ordinary memory).
  std::unordered_map<void*, size_t> pinned_;
  // RegisterHost's ranges (their bytes count in pinned_bytes_ too).
  std::unordered_map<void*, size_t> registered_;
  size_t pinned_bytes_ = 0;

  // Grown on demand; only touched by the owning (thread-compatible) caller.
  DeviceMemoryPtr scratch_;
  int64_t scratch_doubles_ = 0;
};

}  // namespace

bool CudaCompiledIn() { return true; }

namespace internal {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options) {
  return CudaBackend::Create(options);
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    // Clear the (non-sticky) error so it does not surface in a later cudaGetLastError.
    cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace internal
}  // namespace ps::kernels
