#include <memory>

#include "kernels/internal/direct_cublas.h"

namespace ps::kernels::internal {

absl::StatusOr<std::unique_ptr<DirectCublas>> DirectCublas::Create() {
  return absl::UnimplementedError("built without CUDA (build with --config=cuda)");
}

}  // namespace ps::kernels::internal
