#include "kernels/blas_core.h"

#include <cblas.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace ps::kernels {

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? std::string(name) : std::string();
}

CpuVectorFeatures CpuVectorFeatures::OfThisCpu() {
  CpuVectorFeatures f;
#if defined(__x86_64__) && defined(__GNUC__)
  // GCC's checks include the operating system's support (XGETBV) for the AVX registers.
  __builtin_cpu_init();
  f.avx = __builtin_cpu_supports("avx");
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#endif
  return f;
}

std::string BetterBlasCore(absl::string_view chosen, const CpuVectorFeatures& f) {
  // OpenBLAS's x86 sets whose kernels use no AVX.
  static constexpr absl::string_view kWithoutAvx[] = {
      "katmai", "coppermine", "northwood", "prescott", "banias",       "atom",      "core2",
      "penryn", "dunnington", "nehalem",   "opteron",  "opteron_sse3", "barcelona", "nano"};
  const std::string name = absl::AsciiStrToLower(chosen);
  bool weak = false;
  for (absl::string_view w : kWithoutAvx) weak = weak || name == w;
  if (!weak) return "";
  if (f.avx512) return "SkylakeX";
  if (f.avx2_fma) return "Haswell";
  if (f.avx) return "Sandybridge";
  return "";
}

std::string BlasCoreToForce() {
  const char* config = openblas_get_config();
  if (config == nullptr || !absl::StrContains(config, "DYNAMIC_ARCH")) return "";
  return BetterBlasCore(BlasCoreName(), CpuVectorFeatures::OfThisCpu());
}

}  // namespace ps::kernels
