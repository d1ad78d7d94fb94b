// Tests of CreateBackend's device selection (the ops are covered by cpu_backend_test and
// cuda_backend_test).
#include "kernels/backend.h"

#include <memory>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace ps::kernels {
namespace {

TEST(CreateBackendTest, CpuIsAlwaysAvailable) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu", BackendOptions());
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->kind(), DeviceKind::kCpu);
  EXPECT_EQ(DeviceKindName((*backend)->kind()), "cpu");
  EXPECT_FALSE((*backend)->Description().empty());
}

TEST(CreateBackendTest, AutoPicksCudaOnlyWhenCompiledInAndPresent) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("auto", BackendOptions());
  ASSERT_TRUE(backend.ok()) << backend.status();
  if (!CudaCompiledIn()) {
    EXPECT_EQ((*backend)->kind(), DeviceKind::kCpu);
  }
  // With CUDA compiled in, "auto" must agree with whether "cuda" can be created.
  const bool cuda_works = CreateBackend("cuda", BackendOptions()).ok();
  EXPECT_EQ((*backend)->kind() == DeviceKind::kCuda, cuda_works);
}

TEST(CreateBackendTest, CudaWithoutCudaIsFailedPrecondition) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cuda", BackendOptions());
  if (backend.ok()) GTEST_SKIP() << "a CUDA device is present: " << (*backend)->Description();
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition) << backend.status();
}

TEST(CreateBackendTest, UnknownDeviceIsInvalidArgument) {
  for (const char* name : {"", "gpu", "CPU", "tpu"}) {
    EXPECT_EQ(CreateBackend(name, BackendOptions()).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
}

TEST(CreateBackendTest, NegativeOptionsAreInvalidArgument) {
  BackendOptions options;
  options.num_threads = -1;
  EXPECT_EQ(CreateBackend("cpu", options).status().code(), absl::StatusCode::kInvalidArgument);
  options = BackendOptions();
  options.device_index = -1;
  EXPECT_EQ(CreateBackend("auto", options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::kernels
