// MirroredArray<T>: an array with a host side and a device side on one kernels::Backend.
//
// The models keep parameters and gradients in host buffers (the ParameterStore reads and
// writes host memory) and compute on the backend's device. On a backend whose device memory
// is host memory (the CPU backend) the two sides are the *same* allocation, so the copies
// below are no-ops and a store pulls straight into the memory the kernels read. On the CUDA
// backend the host side is page-locked host memory (Backend::AllocateHost) and the copies
// cross PCIe.
#ifndef PS_WORKER_MODELS_MIRRORED_ARRAY_H_
#define PS_WORKER_MODELS_MIRRORED_ARRAY_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/backend.h"

namespace ps::worker {

// True when `backend`'s device pointers are host pointers (no copies are needed).
inline bool SharesHostMemory(const kernels::Backend& backend) {
  return backend.kind() == kernels::DeviceKind::kCpu;
}

// A growable array of trivially copyable T (float, int32_t) mirrored on a Backend's device.
// Contents are not preserved when the capacity grows. Move-only.
// Thread-compatible: callers synchronize. The Backend must outlive the array.
template <typename T>
class MirroredArray {
  static_assert(std::is_trivially_copyable_v<T>, "MirroredArray holds plain values");

 public:
  // An empty array on `backend` (not owned).
  explicit MirroredArray(kernels::Backend* backend)
      : backend_(backend), shared_(SharesHostMemory(*backend)) {}
  MirroredArray(MirroredArray&&) noexcept = default;
  MirroredArray& operator=(MirroredArray&&) noexcept = default;

  // Ensures room for `n` elements on both sides. Growing discards the contents.
  // Errors: INVALID_ARGUMENT for n < 0; RESOURCE_EXHAUSTED when the device is out of memory.
  [[nodiscard]] absl::Status Reserve(int64_t n) {
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("MirroredArray: size ", n));
    if (n <= capacity_) return absl::OkStatus();
    absl::StatusOr<kernels::DeviceBuffer> buffer =
        backend_->Allocate(static_cast<size_t>(n) * sizeof(T));
    if (!buffer.ok()) return buffer.status();
    if (!shared_) {
      absl::StatusOr<kernels::DeviceBuffer> host =
          backend_->AllocateHost(static_cast<size_t>(n) * sizeof(T));
      if (!host.ok()) return host.status();
      host_ = *std::move(host);  // zeroed
    }
    device_ = *std::move(buffer);
    capacity_ = n;
    return absl::OkStatus();
  }

  int64_t capacity() const { return capacity_; }
  // The host side (capacity() elements); the same memory as device() where shared.
  T* host() { return shared_ ? device_.as<T>() : host_.as<T>(); }
  const T* host() const { return shared_ ? device_.as<T>() : host_.as<T>(); }
  absl::Span<T> host_span(int64_t n) { return absl::MakeSpan(host(), static_cast<size_t>(n)); }
  // The device side (capacity() elements).
  T* device() const { return device_.as<T>(); }

  // Copies the first n elements host -> device / device -> host (no-ops where shared).
  // REQUIRES 0 <= n <= capacity().
  [[nodiscard]] absl::Status CopyToDevice(int64_t n) {
    if (shared_ || n == 0) return absl::OkStatus();
    return backend_->CopyToDevice(device(), host(), static_cast<size_t>(n) * sizeof(T));
  }
  // CopyToDevice without waiting for the copy (Backend::CopyToDeviceAsync): the host side must
  // stay unchanged until the backend next waits for the device.
  [[nodiscard]] absl::Status CopyToDeviceAsync(int64_t n) {
    if (shared_ || n == 0) return absl::OkStatus();
    return backend_->CopyToDeviceAsync(device(), host(), static_cast<size_t>(n) * sizeof(T));
  }
  [[nodiscard]] absl::Status CopyToHost(int64_t n) {
    if (shared_ || n == 0) return absl::OkStatus();
    return backend_->CopyToHost(host(), device(), static_cast<size_t>(n) * sizeof(T));
  }

  // A device pointer holding `n` elements equal to `src` (host memory): `src` itself where
  // the device reads host memory (no copy; valid while `src` is), else this array's device
  // side, to which the copy is issued without waiting for it (growing it as needed): `src`
  // must stay unchanged until the backend next waits for the device (a loss, CopyToHost,
  // Synchronize). Errors: those of Reserve and CopyToDeviceAsync.
  [[nodiscard]] absl::StatusOr<const T*> Stage(const T* src, int64_t n) {
    if (shared_) return src;
    absl::Status status = Reserve(n);
    if (!status.ok()) return status;
    if (n > 0) {
      status = backend_->CopyToDeviceAsync(device(), src, static_cast<size_t>(n) * sizeof(T));
      if (!status.ok()) return status;
    }
    return static_cast<const T*>(device());
  }

 private:
  kernels::Backend* backend_;  // Not owned.
  bool shared_;
  int64_t capacity_ = 0;
  kernels::DeviceBuffer device_;
  kernels::DeviceBuffer host_;  // Backend::AllocateHost; unused where shared_.
};

}  // namespace ps::worker

#endif  // PS_WORKER_MODELS_MIRRORED_ARRAY_H_
