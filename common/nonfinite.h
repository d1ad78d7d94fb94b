// Counting NaN and +/-inf values in float32 data, at memory speed: what a server checks every
// pushed gradient with before applying any of it, and what the CPU backend counts with.
// Free of proto/ so that kernels/ may use it too.
#ifndef PS_COMMON_NONFINITE_H_
#define PS_COMMON_NONFINITE_H_

#include <cstddef>

#include "absl/types/span.h"

namespace ps::common {

// Number of NaN and +/-inf values in `values`. Memory-bound (SSE2 on x86-64, AVX2 where the
// CPU has it).
size_t CountNonFinite(absl::Span<const float> values);
// The same over `n` little-endian float32 values at `bytes`, at any alignment.
size_t CountNonFinite(const void* bytes, size_t n);

}  // namespace ps::common

#endif  // PS_COMMON_NONFINITE_H_
