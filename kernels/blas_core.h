// Which of OpenBLAS's kernel sets ("cores") this process runs its GEMMs with, and whether this
// CPU could run a faster one.
//
// Debian's OpenBLAS holds kernels for many CPUs and picks one set when it loads, by the CPU's
// model number; a model it does not know may get a set without AVX kernels (Debian 12's
// 0.3.21 gives Intel's 2023 server parts its Prescott kernels: SSE3, from 2004, about a third
// of the speed of its SkylakeX set there; docs/lab/2026-12-05-blas-kernels.md). The variable
// OPENBLAS_CORETYPE names the set to take instead, and is read only when the library loads: a
// main that finds a weak set starts itself again with it set (common/startup/restart.h).
#ifndef PS_KERNELS_BLAS_CORE_H_
#define PS_KERNELS_BLAS_CORE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ps::kernels {

// The name of the kernel set OpenBLAS chose in this process ("Prescott", "SkylakeX", "Zen").
std::string BlasCoreName();

// What this CPU and its operating system can run, of what OpenBLAS's kernel sets use.
struct CpuVectorFeatures {
  bool avx = false;
  bool avx2_fma = false;  // AVX2 and FMA
  bool avx512 = false;    // AVX-512 F, CD, BW, DQ and VL
  static CpuVectorFeatures OfThisCpu();
};

// The kernel set to name in OPENBLAS_CORETYPE when OpenBLAS chose `chosen`, one of its sets
// without AVX kernels (Prescott, Core2, Nehalem, ...: its fallback for CPUs it does not know),
// on a CPU with `f`: "SkylakeX" with AVX-512, "Haswell" with AVX2 and FMA, "Sandybridge" with
// AVX. Empty when the chosen set is not one of those, or the CPU has no AVX.
std::string BetterBlasCore(absl::string_view chosen, const CpuVectorFeatures& f);

// BetterBlasCore for this process's set and CPU, when this OpenBLAS holds every set
// (DYNAMIC_ARCH, as Debian builds it; a build for one CPU ignores OPENBLAS_CORETYPE): the set
// a main should start again with, or empty.
std::string BlasCoreToForce();

}  // namespace ps::kernels

#endif  // PS_KERNELS_BLAS_CORE_H_
