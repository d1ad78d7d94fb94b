// SeparateMemoryBackend: for tests without a GPU, a Backend whose device memory is apart from
// the host's, as a GPU's is, running the CPU backend's kernels. It calls itself kCuda, so that
// code which copies between host and device on such a backend (MirroredArray, DenseStack)
// takes those paths; its copies are memcpy. It counts the copies and records RegisterHost's
// ranges, refusing, as the CUDA driver does, a range that shares a page with one registered
// already, and can be told to refuse registrations.
//
// Asynchronous copies. CopyToDeviceAsync copies at once but keeps the source's bytes until the
// next call that waits for the device (Backend), and that call fails (FAILED_PRECONDITION) if
// a source changed before it, or was freed (an AllocateHost buffer) or unregistered in the
// meantime: a GPU could have read the new bytes, or memory no longer there. Failing the call,
// not just counting, lets every test on this backend catch such a bug. A freed or
// unregistered source's copy is dropped at once, so the check never reads freed memory (a
// source in memory the backend did not hand out is the caller's to keep alive).
//
// Never for production: nothing else about it is a GPU's.
#ifndef PS_KERNELS_SEPARATE_MEMORY_BACKEND_H_
#define PS_KERNELS_SEPARATE_MEMORY_BACKEND_H_

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/backend.h"

namespace ps::kernels {

class SeparateMemoryBackend final : public Backend {
 public:
  SeparateMemoryBackend() : cpu_(*CreateBackend("cpu", BackendOptions())) {}

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string Description() const override { return "separate memory (cpu kernels)"; }

  // Registered ranges (start -> bytes), as RegisterHost took them.
  const std::map<void*, size_t>& registered() const { return registered_; }
  // RegisterHost refuses (UNAVAILABLE) while set.
  bool refuse_registration = false;
  // Copies device -> host so far, and into registered memory among them.
  int copies_to_host = 0;
  int copies_to_registered = 0;
  // CopyToDeviceAsync calls so far; of them those whose source changed before the next wait
  // (Synchronize, CopyToHost, a loss, CountNonFinite), and those whose source was freed
  // (FreeHostRaw) or unregistered (UnregisterHost) before it. Either fails that wait.
  int async_copies_to_device = 0;
  int async_sources_changed = 0;
  int async_sources_released = 0;
  // Asynchronous copies not yet ended by a wait.
  size_t pending_async_copies() const { return pending_.size(); }
  // Synchronize calls so far; the next one returns synchronize_error where set (once), as a
  // device reports an error of earlier work.
  int synchronizes = 0;
  absl::Status synchronize_error;
  // The next call that waits returns error_before_wait where set (once) without waiting, as
  // CUDA's do when they cannot make their device current or issue their copy: the pending
  // copies stay pending, for a later wait.
  absl::Status error_before_wait;

  // The CUDA driver page-locks whole pages and refuses a range sharing a page with one
  // registered already (cudaErrorHostMemoryAlreadyRegistered, INTERNAL through
  // CudaErrorToStatus); the CUDA backend itself answers ALREADY_EXISTS for the same start.
  absl::Status RegisterHost(void* data, size_t bytes) override {
    if (absl::Status s = Backend::RegisterHost(data, bytes); !s.ok()) return s;
    if (registered_.count(data) > 0) {
      return absl::AlreadyExistsError("RegisterHost: registered already");
    }
    if (refuse_registration) return absl::UnavailableError("registration refused (test)");
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t first = reinterpret_cast<uintptr_t>(data) / page;
    const uintptr_t last = (reinterpret_cast<uintptr_t>(data) + bytes - 1) / page;
    for (const auto& [start, size] : registered_) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(start);
      if (first <= (begin + size - 1) / page && begin / page <= last) {
        return absl::InternalError(
            "cudaHostRegister: cudaErrorHostMemoryAlreadyRegistered (a page of the range is "
            "registered already; test backend)");
      }
    }
    registered_.emplace(data, bytes);
    return absl::OkStatus();
  }
  void UnregisterHost(void* data) override {
    auto it = registered_.find(data);
    if (it == registered_.end()) return;
    ReleaseSources(it->first, it->second);
    registered_.erase(it);
  }

  absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes) override {
    if (bytes > 0) std::memcpy(device_dst, host_src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToDeviceAsync(void* device_dst, const void* host_src, size_t bytes) override {
    ++async_copies_to_device;
    if (bytes == 0) return absl::OkStatus();
    std::memcpy(device_dst, host_src, bytes);
    const char* src = static_cast<const char*>(host_src);
    pending_.push_back({src, std::vector<char>(src, src + bytes)});
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes) override {
    if (absl::Status s = Wait("CopyToHost"); !s.ok()) return s;
    ++copies_to_host;
    if (InRegistered(host_dst, bytes)) ++copies_to_registered;
    if (bytes > 0) std::memcpy(host_dst, device_src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyDeviceToDevice(void* device_dst, const void* device_src, size_t bytes) override {
    if (bytes > 0) std::memmove(device_dst, device_src, bytes);
    return absl::OkStatus();
  }
  absl::Status Fill(float* x, int64_t n, float value) override { return cpu_->Fill(x, n, value); }
  absl::Status Zero(void* x, size_t bytes) override { return cpu_->Zero(x, bytes); }
  absl::Status Synchronize() override {
    ++synchronizes;
    if (absl::Status s = Wait("Synchronize"); !s.ok()) return s;
    if (!synchronize_error.ok()) return std::exchange(synchronize_error, absl::OkStatus());
    return cpu_->Synchronize();
  }
  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    return cpu_->Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  absl::Status BiasAdd(int64_t rows, int64_t cols, const float* bias, float* x) override {
    return cpu_->BiasAdd(rows, cols, bias, x);
  }
  absl::Status BiasGrad(int64_t rows, int64_t cols, const float* dy, float* db) override {
    return cpu_->BiasGrad(rows, cols, dy, db);
  }
  absl::Status ActivationForward(Activation act, int64_t n, const float* x, float* y) override {
    return cpu_->ActivationForward(act, n, x, y);
  }
  absl::Status ActivationBackward(Activation act, int64_t n, const float* y, const float* dy,
                                  float* dx) override {
    return cpu_->ActivationBackward(act, n, y, dy, dx);
  }
  absl::StatusOr<float> SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                            const int32_t* labels, float* grad_out) override {
    if (absl::Status s = Wait("SoftmaxCrossEntropy"); !s.ok()) return s;
    return cpu_->SoftmaxCrossEntropy(rows, classes, logits, labels, grad_out);
  }
  absl::StatusOr<SoftmaxEvalResult> SoftmaxEval(int64_t rows, int64_t classes, const float* logits,
                                                const int32_t* labels,
                                                float* probabilities) override {
    if (absl::Status s = Wait("SoftmaxEval"); !s.ok()) return s;
    return cpu_->SoftmaxEval(rows, classes, logits, labels, probabilities);
  }
  absl::StatusOr<float> SigmoidCrossEntropy(int64_t n, const float* logits, const float* labels,
                                            float* grad_out, float* probabilities) override {
    if (absl::Status s = Wait("SigmoidCrossEntropy"); !s.ok()) return s;
    return cpu_->SigmoidCrossEntropy(n, logits, labels, grad_out, probabilities);
  }
  absl::Status EmbeddingGather(int64_t n, int64_t dim, const float* table, int64_t table_rows,
                               const int32_t* indices, float* out) override {
    return cpu_->EmbeddingGather(n, dim, table, table_rows, indices, out);
  }
  absl::Status EmbeddingScatterAdd(int64_t n, int64_t dim, const float* grads,
                                   const int32_t* indices, int64_t out_rows, float* out) override {
    return cpu_->EmbeddingScatterAdd(n, dim, grads, indices, out_rows, out);
  }
  absl::StatusOr<int64_t> CountNonFinite(int64_t n, const float* x) override {
    if (absl::Status s = Wait("CountNonFinite"); !s.ok()) return s;
    return cpu_->CountNonFinite(n, x);
  }
  absl::Status ApplyOptimizer(const OptimizerParams& p, int64_t step, int64_t n, float* params,
                              const float* grads, absl::Span<float* const> slots) override {
    return cpu_->ApplyOptimizer(p, step, n, params, grads, slots);
  }

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes) override {
    void* p = ::operator new (bytes, std::align_val_t{256}, std::nothrow);
    if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("Allocate ", bytes));
    return p;
  }
  void FreeRaw(void* data) override { ::operator delete (data, std::align_val_t{256}); }
  // Backend's, with the sizes kept for FreeHostRaw.
  absl::StatusOr<void*> AllocateHostRaw(size_t bytes) override {
    absl::StatusOr<void*> p = Backend::AllocateHostRaw(bytes);
    if (p.ok()) host_allocations_.emplace(*p, bytes);
    return p;
  }
  void FreeHostRaw(void* data) override {
    auto it = host_allocations_.find(data);
    if (it != host_allocations_.end()) {
      ReleaseSources(it->first, it->second);
      host_allocations_.erase(it);
    }
    Backend::FreeHostRaw(data);
  }

 private:
  struct PendingCopy {
    const char* src;
    std::vector<char> bytes;  // what src held when the copy was issued
  };

  // The wait that ends the pending asynchronous copies: error_before_wait (leaving them
  // pending) where set, else FAILED_PRECONDITION, for `op`, if a source changed or was released
  // (ReleaseSources) since its copy was issued.
  absl::Status Wait(absl::string_view op) {
    if (!error_before_wait.ok()) return std::exchange(error_before_wait, absl::OkStatus());
    int changed = 0;
    for (const PendingCopy& copy : pending_) {
      if (std::memcmp(copy.src, copy.bytes.data(), copy.bytes.size()) != 0) ++changed;
    }
    pending_.clear();
    async_sources_changed += changed;
    const int released = std::exchange(released_since_wait_, 0);
    if (changed == 0 && released == 0) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": of the CopyToDeviceAsync copies the device had not waited for, ",
                     changed, " had their source changed and ", released,
                     " freed or unregistered (a GPU may have read those bytes; test backend)"));
  }

  // [data, data + bytes) is freed or unregistered: the copies reading it are dropped (their
  // bytes must never be read again) and fail the next wait.
  void ReleaseSources(const void* data, size_t bytes) {
    const char* begin = static_cast<const char*>(data);
    const char* end = begin + bytes;
    const size_t before = pending_.size();
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [&](const PendingCopy& copy) {
                                    return copy.src < end && copy.src + copy.bytes.size() > begin;
                                  }),
                   pending_.end());
    const int released = static_cast<int>(before - pending_.size());
    async_sources_released += released;
    released_since_wait_ += released;
  }

  bool InRegistered(const void* p, size_t bytes) const {
    const char* at = static_cast<const char*>(p);
    for (const auto& [start, size] : registered_) {
      const char* begin = static_cast<const char*>(start);
      if (at >= begin && at + bytes <= begin + size) return true;
    }
    return false;
  }

  std::unique_ptr<Backend> cpu_;
  std::map<void*, size_t> registered_;
  std::vector<PendingCopy> pending_;
  // Copies ReleaseSources dropped since the last wait, which fails for them.
  int released_since_wait_ = 0;
  // AllocateHostRaw's blocks and their sizes.
  std::map<void*, size_t> host_allocations_;
};

}  // namespace ps::kernels

#endif  // PS_KERNELS_SEPARATE_MEMORY_BACKEND_H_
