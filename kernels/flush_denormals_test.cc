#include "kernels/flush_denormals.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace ps::kernels {
namespace {

// Arithmetic the compiler cannot fold: its operands come through volatiles.
float Half(float x) {
  volatile float v = x;
  volatile float h = 0.5f;
  return v * h;
}
float Sum(float x, float y) {
  volatile float a = x;
  volatile float b = y;
  return a + b;
}
// Compared by their bits: under DAZ a subnormal compares equal to 0.
uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

constexpr float kMin = std::numeric_limits<float>::min();          // smallest normal
constexpr float kTiny = std::numeric_limits<float>::denorm_min();  // smallest subnormal

TEST(ScopedFlushDenormalsTest, FlushesResultsAndInputsInsideItsScopeOnly) {
  if (!ScopedFlushDenormals::kSupported) GTEST_SKIP() << "no flush mode on this CPU";
  ASSERT_FALSE(ScopedFlushDenormals::Active()) << "threads start with subnormals kept";
  const uint32_t half_min = Bits(Half(kMin));             // a subnormal result
  const uint32_t min_plus_tiny = Bits(Sum(kMin, kTiny));  // a subnormal input
  EXPECT_EQ(std::fpclassify(Half(kMin)), FP_SUBNORMAL);
  EXPECT_EQ(min_plus_tiny, Bits(std::nextafter(kMin, 1.f)));
  {
    const ScopedFlushDenormals flush;
    EXPECT_TRUE(ScopedFlushDenormals::Active());
    EXPECT_EQ(Bits(Half(kMin)), Bits(0.f));         // the result written as 0
    EXPECT_EQ(Bits(Sum(kMin, kTiny)), Bits(kMin));  // the input read as 0
    {
      const ScopedFlushDenormals inner;  // finds the mode set: leaves it set when it ends
      EXPECT_TRUE(ScopedFlushDenormals::Active());
    }
    EXPECT_TRUE(ScopedFlushDenormals::Active());
    EXPECT_EQ(Bits(Half(kMin)), Bits(0.f));
  }
  EXPECT_FALSE(ScopedFlushDenormals::Active());
  EXPECT_EQ(Bits(Half(kMin)), half_min);
  EXPECT_EQ(Bits(Sum(kMin, kTiny)), min_plus_tiny);
}

#if defined(__x86_64__) || defined(__i386__)
// A caller with only one of the two bits set gets back exactly that mode (exception flags,
// the low six bits, may have been raised inside).
TEST(ScopedFlushDenormalsTest, PutsBackAModeWithOneOfTheTwoBits) {
  const unsigned original = _mm_getcsr();
  for (const unsigned bit : {0x8000u, 0x0040u}) {
    _mm_setcsr((original & ~0x8040u) | bit);
    const unsigned before = _mm_getcsr();
    {
      const ScopedFlushDenormals flush;
      EXPECT_TRUE(ScopedFlushDenormals::Active());
      EXPECT_EQ(Bits(Half(kMin)), Bits(0.f));
    }
    EXPECT_EQ(_mm_getcsr() & ~0x3Fu, before & ~0x3Fu) << "bit " << bit;
  }
  _mm_setcsr(original);
}
#endif

}  // namespace
}  // namespace ps::kernels
