#include "kernels/blas_core.h"

#include "gtest/gtest.h"

namespace ps::kernels {
namespace {

CpuVectorFeatures Features(bool avx, bool avx2_fma, bool avx512) {
  CpuVectorFeatures f;
  f.avx = avx;
  f.avx2_fma = avx2_fma;
  f.avx512 = avx512;
  return f;
}
CpuVectorFeatures Avx512() { return Features(true, true, true); }
CpuVectorFeatures Avx2() { return Features(true, true, false); }
CpuVectorFeatures AvxOnly() { return Features(true, false, false); }

TEST(BetterBlasCoreTest, ASetWithoutAvxOnACpuWithItGetsTheBestSetTheCpuRuns) {
  // What Debian 12's OpenBLAS chose on an Intel CPU model it did not know.
  EXPECT_EQ(BetterBlasCore("Prescott", Avx512()), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Prescott", Avx2()), "Haswell");
  EXPECT_EQ(BetterBlasCore("Prescott", AvxOnly()), "Sandybridge");
  EXPECT_EQ(BetterBlasCore("Core2", Avx2()), "Haswell");
  EXPECT_EQ(BetterBlasCore("NEHALEM", Avx512()), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Barcelona", Avx2()), "Haswell");
}

TEST(BetterBlasCoreTest, AnAvxSetOrACpuWithoutAvxIsLeftAlone) {
  for (const char* chosen : {"Sandybridge", "Haswell", "SkylakeX", "Cooperlake", "Zen",
                             "SapphireRapids", "", "unknown"}) {
    EXPECT_EQ(BetterBlasCore(chosen, Avx512()), "") << chosen;
  }
  EXPECT_EQ(BetterBlasCore("Prescott", CpuVectorFeatures{}), "");
}

}  // namespace
}  // namespace ps::kernels
