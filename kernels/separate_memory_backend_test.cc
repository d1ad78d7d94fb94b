#include "kernels/separate_memory_backend.h"

#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace ps::kernels {
namespace {

// Each call that waits for the device, by name, on buffers of 4 device floats.
std::vector<std::pair<std::string, std::function<absl::Status(Backend&, float*)>>> Waits() {
  return {
      {"Synchronize", [](Backend& b, float*) { return b.Synchronize(); }},
      {"CopyToHost",
       [](Backend& b, float* device) {
         float host[4];
         return b.CopyToHost(host, device, sizeof(host));
       }},
      {"CountNonFinite",
       [](Backend& b, float* device) { return b.CountNonFinite(4, device).status(); }},
      {"SigmoidCrossEntropy",
       [](Backend& b, float* device) {
         return b.SigmoidCrossEntropy(2, device, device + 2, nullptr, nullptr).status();
       }},
  };
}

// A source written before the device waited for its copy (a GPU could have read the new
// bytes) fails that wait, whichever it is, and is counted; the next wait is clean.
TEST(SeparateMemoryBackend, AChangedAsyncSourceFailsTheNextWait) {
  for (const auto& [name, wait] : Waits()) {
    SCOPED_TRACE(name);
    SeparateMemoryBackend backend;
    absl::StatusOr<DeviceBuffer> device = backend.AllocateFloats(4);
    ASSERT_TRUE(device.ok()) << device.status();
    std::vector<float> host = {1, 0, 1, 0};
    ASSERT_TRUE(backend.CopyToDeviceAsync(device->data(), host.data(), 16).ok());
    host[1] = 3;
    const absl::Status s = wait(backend, device->floats());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(backend.async_sources_changed, 1);
    EXPECT_EQ(backend.pending_async_copies(), 0u);
    EXPECT_TRUE(wait(backend, device->floats()).ok());
  }
}

// An unchanged source passes every wait, which ends its copy.
TEST(SeparateMemoryBackend, AnUnchangedAsyncSourcePassesTheWait) {
  for (const auto& [name, wait] : Waits()) {
    SCOPED_TRACE(name);
    SeparateMemoryBackend backend;
    absl::StatusOr<DeviceBuffer> device = backend.AllocateFloats(4);
    ASSERT_TRUE(device.ok()) << device.status();
    const std::vector<float> host = {1, 0, 1, 0};
    ASSERT_TRUE(backend.CopyToDeviceAsync(device->data(), host.data(), 16).ok());
    EXPECT_EQ(backend.pending_async_copies(), 1u);
    const absl::Status s = wait(backend, device->floats());
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(backend.pending_async_copies(), 0u);
    EXPECT_EQ(backend.async_sources_changed, 0);
  }
}

// An AllocateHost buffer freed while a copy from it is pending fails the next wait, and the
// wait does not read the freed memory (ASan: no heap-use-after-free). A copy from another
// buffer stays pending.
TEST(SeparateMemoryBackend, AFreedAsyncSourceFailsTheNextWaitWithoutBeingRead) {
  SeparateMemoryBackend backend;
  absl::StatusOr<DeviceBuffer> device = backend.Allocate(64);
  absl::StatusOr<DeviceBuffer> host = backend.AllocateHost(64);
  absl::StatusOr<DeviceBuffer> other = backend.AllocateHost(64);
  ASSERT_TRUE(device.ok() && host.ok() && other.ok());
  ASSERT_TRUE(backend.CopyToDeviceAsync(device->data(), host->as<char>() + 16, 16).ok());
  ASSERT_TRUE(backend.CopyToDeviceAsync(device->data(), other->data(), 64).ok());
  host->Reset();
  EXPECT_EQ(backend.async_sources_released, 1);
  EXPECT_EQ(backend.pending_async_copies(), 1u);
  EXPECT_EQ(backend.Synchronize().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(backend.Synchronize().ok());
}

// Likewise a registered range unregistered while a copy from it is pending (the caller may
// unmap it next).
TEST(SeparateMemoryBackend, AnUnregisteredAsyncSourceFailsTheNextWait) {
  SeparateMemoryBackend backend;
  absl::StatusOr<DeviceBuffer> device = backend.Allocate(64);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<char> host(64);
  ASSERT_TRUE(backend.RegisterHost(host.data(), host.size()).ok());
  ASSERT_TRUE(backend.CopyToDeviceAsync(device->data(), host.data() + 60, 4).ok());
  backend.UnregisterHost(host.data());
  EXPECT_EQ(backend.async_sources_released, 1);
  EXPECT_EQ(backend.pending_async_copies(), 0u);
  EXPECT_EQ(backend.Synchronize().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(backend.Synchronize().ok());
}

// error_before_wait fails the next wait before it waits: the copies stay pending, for the
// next wait.
TEST(SeparateMemoryBackend, AnErrorBeforeTheWaitLeavesTheCopiesPending) {
  SeparateMemoryBackend backend;
  absl::StatusOr<DeviceBuffer> device = backend.AllocateFloats(4);
  ASSERT_TRUE(device.ok()) << device.status();
  const std::vector<float> host = {1, 2, 3, 4};
  ASSERT_TRUE(backend.CopyToDeviceAsync(device->data(), host.data(), 16).ok());
  backend.error_before_wait = absl::InternalError("cudaSetDevice");
  std::vector<float> back(4);
  EXPECT_EQ(backend.CopyToHost(back.data(), device->data(), 16).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(backend.pending_async_copies(), 1u);
  EXPECT_EQ(backend.copies_to_host, 0);
  ASSERT_TRUE(backend.CopyToHost(back.data(), device->data(), 16).ok());
  EXPECT_EQ(backend.pending_async_copies(), 0u);
  EXPECT_EQ(back, host);
}

// As the CUDA driver, the backend refuses a range that shares a page with one registered
// already (INTERNAL, the driver's code through CudaErrorToStatus), and ALREADY_EXISTS for the
// same start; a range on the next page, and the refused one once the first is gone, are
// taken.
TEST(SeparateMemoryBackend, RangesSharingAPageAreRefused) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  SeparateMemoryBackend backend;
  absl::StatusOr<DeviceBuffer> pages = backend.AllocateHost(4 * page);
  ASSERT_TRUE(pages.ok()) << pages.status();
  // The start of the buffer's second whole page, so that the ranges below lie where the test
  // says, in the buffer.
  char* first = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(pages->data()) + 2 * page - 1) / page * page);
  ASSERT_TRUE(backend.RegisterHost(first, 64).ok());
  EXPECT_EQ(backend.RegisterHost(first, 64).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(backend.RegisterHost(first + 128, 64).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(backend.RegisterHost(first - 64, 128).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(backend.RegisterHost(first + page, 64).ok());
  EXPECT_EQ(backend.registered().size(), 2u);
  backend.UnregisterHost(first);
  EXPECT_TRUE(backend.RegisterHost(first + 128, 64).ok());
  backend.UnregisterHost(first + 128);
  backend.UnregisterHost(first + page);
  EXPECT_TRUE(backend.registered().empty());
}

}  // namespace
}  // namespace ps::kernels
