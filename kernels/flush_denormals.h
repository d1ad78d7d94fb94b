// Subnormal floats (magnitudes below FLT_MIN, about 1.2e-38) read as zero and results that
// would be subnormal written as zero, for the scope of one object: x86's FTZ and DAZ bits of
// MXCSR, AArch64's FZ bit of FPCR (both per thread). Elsewhere it does nothing.
//
// Why: x86 cores take a microcode assist, about a hundred cycles, for each vector operation
// with a subnormal input or output. Optimizer state drifts there by itself: a weight whose
// gradient is 0 for a while (an input pixel that is black in every image of the batch) has
// Adam's first moment multiplied by beta1 = 0.9 at every step, through the whole subnormal
// range on its way to 0. A long Adam run's pushes got several times slower on the servers
// (docs/lab/2026-12-05-subnormals.md). TensorFlow flushes them in its CPU kernels for the same
// reason.
//
// The optimizer kernels (optimizer.h) take one of these on entry, so their results do not
// depend on the caller's mode. A caller that runs many small updates in a row (a sparse push's
// rows) may hold one around them all: the kernels' own then finds the mode set and writes
// nothing (a write of MXCSR costs more than its read).
//
// Thread-compatible: an object changes the mode of the thread it was made on, and must be
// destroyed on that thread, in the reverse order of making.
#ifndef PS_KERNELS_FLUSH_DENORMALS_H_
#define PS_KERNELS_FLUSH_DENORMALS_H_

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace ps::kernels {

class ScopedFlushDenormals {
 public:
  // Whether this host's CPU has the mode (x86, AArch64); elsewhere the class does nothing.
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
  static constexpr bool kSupported = true;
#else
  static constexpr bool kSupported = false;
#endif

  ScopedFlushDenormals() : saved_(Read()) {
    if ((saved_ & kBits) != kBits) Write(saved_ | kBits);
  }
  // Puts back the two bits as they were, and nothing else of the control word.
  ~ScopedFlushDenormals() {
    if ((saved_ & kBits) != kBits) Write((Read() & ~kBits) | (saved_ & kBits));
  }
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

  // Whether this thread flushes now (on x86 both bits set), for tests.
  static bool Active() { return kSupported && (Read() & kBits) == kBits; }

 private:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr uint64_t kBits = 0x8040;  // MXCSR's FTZ (bit 15) | DAZ (bit 6)
  static uint64_t Read() { return _mm_getcsr(); }
  static void Write(uint64_t v) { _mm_setcsr(static_cast<unsigned>(v)); }
#elif defined(__aarch64__)
  static constexpr uint64_t kBits = uint64_t{1} << 24;  // FPCR's FZ
  static uint64_t Read() {
    uint64_t v;
    asm volatile("mrs %0, fpcr" : "=r"(v));
    return v;
  }
  static void Write(uint64_t v) { asm volatile("msr fpcr, %0" : : "r"(v)); }
#else
  static constexpr uint64_t kBits = 0;
  static uint64_t Read() { return 0; }
  static void Write(uint64_t) {}
#endif

  const uint64_t saved_;
};

}  // namespace ps::kernels

#endif  // PS_KERNELS_FLUSH_DENORMALS_H_
