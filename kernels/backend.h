// One device API for the dense math of training: memory, GEMM, bias, activations, losses,
// embedding gather/scatter and optimizer updates. The implementation is chosen at run time
// (--device=cpu|cuda|auto) by CreateBackend:
//   - "cpu":  OpenBLAS cblas_sgemm plus plain loops. Always available.
//   - "cuda": cuBLAS plus small CUDA kernels. Compiled in only with `--config=cuda`.
//
// Pointers. Every float*/int32_t* a Backend method takes is a *device* pointer of that
// backend (from Allocate), except the host side of CopyToDevice/CopyToHost. For the CPU
// backend device pointers are ordinary host pointers, so host memory may be passed directly.
// Matrices are dense row-major with a leading dimension (row stride, in elements).
//
// Argument order: memory functions follow memcpy/std::fill_n (destination first); math
// functions follow BLAS (sizes, then inputs, then outputs). An output may alias an input
// only where the function says so.
//
// Ordering and errors. Work is ordered as issued on one backend. On the CUDA backend it runs
// asynchronously on the backend's stream: a call that returns OK has been *issued*, and an
// error that only the device can detect (a kernel fault, an out-of-range embedding index)
// is returned by a later call that waits for the device: Synchronize(), CopyToHost(), or a
// loss function. CopyToDevice/CopyToHost are synchronous with respect to the host buffer;
// CopyToDeviceAsync is not (its host buffer is read until the next wait).
// Arguments that the host can check (negative sizes, too-small leading dimensions, null
// pointers, bad optimizer params) give INVALID_ARGUMENT before anything is issued.
//
// Thread-safety: a Backend is thread-compatible: callers synchronize. Use one Backend per
// thread (each CUDA backend owns its own stream and cuBLAS handle).
#ifndef PS_KERNELS_BACKEND_H_
#define PS_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/optimizer.h"

namespace ps::kernels {

enum class DeviceKind { kCpu, kCuda };

// "cpu" or "cuda".
absl::string_view DeviceKindName(DeviceKind kind);

// Elementwise nonlinearities of ActivationForward/Backward.
enum class Activation { kRelu, kTanh, kSigmoid };

// Configures a Backend for its lifetime.
struct BackendOptions {
  // CPU backend: threads OpenBLAS uses in Gemm. 0 = the library default (OPENBLAS_NUM_THREADS
  // or the number of cores). OpenBLAS keeps this setting process-wide, so the last backend
  // created with a non-zero value wins. REQUIRES >= 0. Ignored by the CUDA backend.
  int num_threads = 0;
  // CUDA backend: which device to use. REQUIRES 0 <= device_index < number of devices.
  // Ignored by the CPU backend.
  int device_index = 0;
};

// Result of SoftmaxEval.
struct SoftmaxEvalResult {
  // Mean over rows of -log softmax(logits)[label].
  float mean_loss = 0.f;
  // Rows whose argmax (the lowest index among ties) equals the label.
  int64_t num_correct = 0;
};

class Backend;

// Owns one allocation of a Backend, on its device (Allocate) or in host memory the device
// copies to and from directly (AllocateHost), and frees it on destruction (RAII). Move-only.
// The Backend must outlive its buffers. Thread-compatible.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  // Address of the first byte (a device address, or a host one from AllocateHost); nullptr
  // for an empty buffer.
  void* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }
  // The buffer viewed as an array of T (float, int32_t).
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  float* floats() const { return as<float>(); }
  int32_t* ints() const { return as<int32_t>(); }

  // Frees the allocation now; the buffer becomes empty.
  void Reset();

 private:
  friend class Backend;
  DeviceBuffer(Backend* backend, void* data, size_t size_bytes, bool host)
      : backend_(backend), data_(data), size_bytes_(size_bytes), host_(host) {}

  Backend* backend_ = nullptr;  // Not owned.
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
  bool host_ = false;  // from AllocateHost
};

// The device API. Abstract; create one with CreateBackend. Thread-compatible.
class Backend {
 public:
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  // Human-readable description, e.g. "cpu (OpenBLAS SkylakeX kernels, 2 threads)" or "cuda:0
  // (NVIDIA H200)".
  virtual std::string Description() const = 0;

  // ---- Memory --------------------------------------------------------------------------

  // A buffer of `bytes` bytes (uninitialized; 256-byte aligned). RESOURCE_EXHAUSTED when the
  // device is out of memory; a zero-byte request gives an empty buffer.
  [[nodiscard]] absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  // Allocate(n * sizeof(float)), n >= 0.
  [[nodiscard]] absl::StatusOr<DeviceBuffer> AllocateFloats(int64_t n);
  // A buffer of `bytes` bytes of host memory (zeroed; 256-byte aligned) that CopyToDevice and
  // CopyToHost move at the bus's full speed: page-locked on the CUDA backend (up to 1 GiB of
  // such buffers per backend, beyond which or where the driver cannot lock more it is
  // ordinary memory), where a copy from ordinary (pageable) memory goes through a staging
  // buffer at a fraction of it. RESOURCE_EXHAUSTED when it cannot be had; a zero-byte request
  // gives an empty buffer.
  [[nodiscard]] absl::StatusOr<DeviceBuffer> AllocateHost(size_t bytes);
  // Makes `bytes` bytes of host memory the caller owns (e.g. part of a shared-memory segment)
  // move at the bus's full speed in CopyToDevice and CopyToHost, as AllocateHost's buffers do:
  // the CUDA backend page-locks the pages that hold them (counted against AllocateHost's
  // limit). The memory must stay mapped until UnregisterHost(data). OK, and nothing done,
  // where the device reads host memory (the CPU backend). Errors: INVALID_ARGUMENT for a null
  // `data` or zero bytes; RESOURCE_EXHAUSTED past the limit; the driver's otherwise (e.g. some
  // of those pages are registered already): the memory is then ordinary, copied more slowly.
  [[nodiscard]] virtual absl::Status RegisterHost(void* data, size_t bytes);
  // Undoes RegisterHost(data, ...); nothing for memory not registered.
  virtual void UnregisterHost(void* data);

  // Host -> device, device -> host, device -> device copies of `bytes` bytes. The host side
  // may be any host memory; host copies return once the host buffer may be reused/read.
  [[nodiscard]] virtual absl::Status CopyToDevice(void* device_dst, const void* host_src,
                                                  size_t bytes) = 0;
  [[nodiscard]] virtual absl::Status CopyToHost(void* host_dst, const void* device_src,
                                                size_t bytes) = 0;
  [[nodiscard]] virtual absl::Status CopyDeviceToDevice(void* device_dst, const void* device_src,
                                                        size_t bytes) = 0;
  // Host -> device without waiting for it: the copy is issued in order with the backend's other
  // work (later kernels see the copied bytes) and the call returns at once, so the host goes
  // on issuing work while the bus moves the bytes. host_src must then stay unchanged until the
  // next call that waits for the device returns (Synchronize, CopyToHost, a loss,
  // CountNonFinite). Fully asynchronous from AllocateHost or RegisterHost memory; from other
  // host memory the CUDA driver first copies into a staging buffer. By default (the CPU
  // backend) CopyToDevice.
  [[nodiscard]] virtual absl::Status CopyToDeviceAsync(void* device_dst, const void* host_src,
                                                       size_t bytes) {
    return CopyToDevice(device_dst, host_src, bytes);
  }
  // x[0..n) = value.
  [[nodiscard]] virtual absl::Status Fill(float* x, int64_t n, float value) = 0;
  // Sets `bytes` bytes at x to zero (0.f for floats, 0 for ints).
  [[nodiscard]] virtual absl::Status Zero(void* x, size_t bytes) = 0;
  // Waits until all issued work is done; returns the first deferred device error, if any.
  [[nodiscard]] virtual absl::Status Synchronize() = 0;

  // ---- Dense layers --------------------------------------------------------------------

  // c = alpha * op(a) * op(b) + beta * c, row-major; op(x) = trans_x ? x^T : x.
  // c is m x n, op(a) is m x k, op(b) is k x n. Leading dimensions: lda >= (trans_a ? m : k),
  // ldb >= (trans_b ? k : n), ldc >= n, each >= 1. beta == 0 overwrites c (NaNs in c are
  // ignored). c must not alias a or b.
  [[nodiscard]] virtual absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                                          float alpha, const float* a, int lda, const float* b,
                                          int ldb, float beta, float* c, int ldc) = 0;
  // x[r][c] += bias[c] for a rows x cols matrix x (leading dimension cols).
  [[nodiscard]] virtual absl::Status BiasAdd(int64_t rows, int64_t cols, const float* bias,
                                             float* x) = 0;
  // db[c] = sum_r dy[r][c] (written, not accumulated): the bias gradient of BiasAdd.
  [[nodiscard]] virtual absl::Status BiasGrad(int64_t rows, int64_t cols, const float* dy,
                                              float* db) = 0;
  // y = act(x) elementwise over n elements; y may equal x (in place).
  [[nodiscard]] virtual absl::Status ActivationForward(Activation act, int64_t n,
                                                       const float* x, float* y) = 0;
  // dx = dy * act'(x), computed from the forward *output* y = act(x), which is the usual
  // convention for these three: ReLU dy * (y > 0), Tanh dy * (1 - y^2), Sigmoid
  // dy * y * (1 - y). dx may equal dy (in place).
  [[nodiscard]] virtual absl::Status ActivationBackward(Activation act, int64_t n,
                                                        const float* y, const float* dy,
                                                        float* dx) = 0;

  // ---- Losses (these wait for the device and return host values) ------------------------

  // Softmax cross-entropy over `rows` rows of `classes` logits with int32 labels in
  // [0, classes). Returns the mean loss over rows; if grad_out is not null writes
  // grad_out = (softmax(logits) - onehot(label)) / rows (rows x classes; may equal logits).
  // INVALID_ARGUMENT for a label out of range (the outputs are then unspecified).
  // REQUIRES rows >= 1, classes >= 1.
  [[nodiscard]] virtual absl::StatusOr<float> SoftmaxCrossEntropy(int64_t rows, int64_t classes,
                                                                  const float* logits,
                                                                  const int32_t* labels,
                                                                  float* grad_out) = 0;
  // Evaluation variant: mean loss and the number of rows predicted correctly (argmax); if
  // probabilities is not null writes softmax(logits) there (rows x classes).
  [[nodiscard]] virtual absl::StatusOr<SoftmaxEvalResult> SoftmaxEval(
      int64_t rows, int64_t classes, const float* logits, const int32_t* labels,
      float* probabilities) = 0;
  // Binary (CTR) cross-entropy of n logits against float labels in [0, 1] (usually {0, 1}).
  // Returns the mean loss; if grad_out is not null writes (sigmoid(x) - label) / n there; if
  // probabilities is not null writes sigmoid(x) there. Outputs may equal logits.
  // REQUIRES n >= 1.
  [[nodiscard]] virtual absl::StatusOr<float> SigmoidCrossEntropy(int64_t n, const float* logits,
                                                                  const float* labels,
                                                                  float* grad_out,
                                                                  float* probabilities) = 0;

  // ---- Embeddings ----------------------------------------------------------------------

  // out[i][:] = table[indices[i]][:] for i < n; rows have `dim` floats (dense, no padding).
  // INVALID_ARGUMENT if an index is outside [0, table_rows); such output rows are zeroed.
  [[nodiscard]] virtual absl::Status EmbeddingGather(int64_t n, int64_t dim, const float* table,
                                                     int64_t table_rows,
                                                     const int32_t* indices, float* out) = 0;
  // out[indices[i]][:] += grads[i][:] for i < n (repeated indices accumulate): the gradient
  // of EmbeddingGather onto unique rows, and sum pooling of bags (indices = bag id per
  // row). INVALID_ARGUMENT if an index is outside [0, out_rows); such rows are skipped.
  // Summation order of repeated indices is unspecified on CUDA (float atomics).
  [[nodiscard]] virtual absl::Status EmbeddingScatterAdd(int64_t n, int64_t dim,
                                                         const float* grads,
                                                         const int32_t* indices,
                                                         int64_t out_rows, float* out) = 0;

  // ---- Optimizer -----------------------------------------------------------------------

  // How many of x[0..n) are NaN or infinite (waits for the device). n >= 0.
  [[nodiscard]] virtual absl::StatusOr<int64_t> CountNonFinite(int64_t n, const float* x) = 0;

  // kernels::ApplyOptimizer (optimizer.h) on n device floats: same rules and order (the CUDA
  // backend keeps subnormal values, which the CPU's flushes to 0).
  // INVALID_ARGUMENT for invalid params, step < 1, or slots.size() != NumSlots(p.kind).
  // `slots` is a host array of device pointers.
  [[nodiscard]] virtual absl::Status ApplyOptimizer(const OptimizerParams& p, int64_t step,
                                                    int64_t n, float* params,
                                                    const float* grads,
                                                    absl::Span<float* const> slots) = 0;

 protected:
  Backend() = default;

  // Implementation of Allocate: a 256-byte-aligned block of bytes > 0 bytes.
  virtual absl::StatusOr<void*> AllocateRaw(size_t bytes) = 0;
  // Frees a block from AllocateRaw. Cannot fail usefully (called from destructors); a
  // backend logs device errors here.
  virtual void FreeRaw(void* data) = 0;
  // Implementation of AllocateHost (bytes > 0; need not zero) and its free. By default,
  // ordinary aligned host memory.
  virtual absl::StatusOr<void*> AllocateHostRaw(size_t bytes);
  virtual void FreeHostRaw(void* data);

 private:
  friend class DeviceBuffer;
};

// True when this binary contains the CUDA backend (built with --config=cuda).
bool CudaCompiledIn();

// Creates the backend named by `device`:
//   "cpu"  - the CPU backend.
//   "cuda" - the CUDA backend on options.device_index; FAILED_PRECONDITION when CUDA is not
//            compiled in or no usable device is present (the message says which).
//   "auto" - "cuda" when compiled in and a device is present, else "cpu".
// INVALID_ARGUMENT for any other name or for invalid options.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    absl::string_view device, const BackendOptions& options);

// ---- Inline definitions ------------------------------------------------------------------

inline DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    backend_ = other.backend_;
    data_ = other.data_;
    size_bytes_ = other.size_bytes_;
    host_ = other.host_;
    other.backend_ = nullptr;
    other.data_ = nullptr;
    other.size_bytes_ = 0;
    other.host_ = false;
  }
  return *this;
}

inline void DeviceBuffer::Reset() {
  if (data_ != nullptr) {
    if (host_) {
      backend_->FreeHostRaw(data_);
    } else {
      backend_->FreeRaw(data_);
    }
  }
  backend_ = nullptr;
  data_ = nullptr;
  size_bytes_ = 0;
  host_ = false;
}

inline absl::StatusOr<DeviceBuffer> Backend::Allocate(size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  absl::StatusOr<void*> data = AllocateRaw(bytes);
  if (!data.ok()) return data.status();
  return DeviceBuffer(this, *data, bytes, /*host=*/false);
}

inline absl::StatusOr<void*> Backend::AllocateHostRaw(size_t bytes) {
  void* p = ::operator new (bytes, std::align_val_t{256}, std::nothrow);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("AllocateHost ", bytes, " bytes"));
  }
  return p;
}

inline void Backend::FreeHostRaw(void* data) { ::operator delete (data, std::align_val_t{256}); }

inline absl::Status Backend::RegisterHost(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("RegisterHost: null or empty range");
  }
  return absl::OkStatus();
}

inline void Backend::UnregisterHost(void* data) { (void)data; }

inline absl::StatusOr<DeviceBuffer> Backend::AllocateHost(size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  absl::StatusOr<void*> data = AllocateHostRaw(bytes);
  if (!data.ok()) return data.status();
  std::memset(*data, 0, bytes);
  return DeviceBuffer(this, *data, bytes, /*host=*/true);
}

inline absl::StatusOr<DeviceBuffer> Backend::AllocateFloats(int64_t n) {
  if (n < 0) return absl::InvalidArgumentError("AllocateFloats: negative count");
  return Allocate(static_cast<size_t>(n) * sizeof(float));
}

}  // namespace ps::kernels

#endif  // PS_KERNELS_BACKEND_H_
