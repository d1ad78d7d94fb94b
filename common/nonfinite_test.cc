#include "common/nonfinite.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

TEST(CountNonFinite, CountsNanAndInfOnly) {
  std::vector<float> values = {1.0f,
                               std::numeric_limits<float>::quiet_NaN(),
                               kInf,
                               -kInf,
                               0.0f,
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min(),
                               FromBits(0xff800001u)};
  EXPECT_EQ(CountNonFinite(values), 4u);
  EXPECT_EQ(CountNonFinite({}), 0u);
  std::vector<float> many(100003, 1.0f);
  many[0] = kInf;
  many[50000] = kInf;
  many[100002] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(CountNonFinite(many), 3u);
  // Across the vector loop's internal chunk boundary (2^20 values) and its scalar tail.
  std::vector<float> chunked((size_t{1} << 20) + 7, -1.0f);
  chunked[(size_t{1} << 20) - 1] = kInf;
  chunked[size_t{1} << 20] = -kInf;
  chunked.back() = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(CountNonFinite(chunked), 3u);
  EXPECT_EQ(CountNonFinite(absl::MakeConstSpan(chunked).subspan(1, 5)), 0u);
}

TEST(CountNonFinite, FindsAValueAtEveryPositionOfTheVectorGroupsAndTheTail) {
  // The loops take 32 values (AVX2), then 16 (SSE2), then one at a time: a value in any of
  // them, at any misalignment of the start, counts once.
  std::vector<float> values(200, 0.5f);
  for (size_t start = 0; start < 4; ++start) {
    for (size_t n = 0; n + start <= 100; ++n) {
      for (size_t at = 0; at < n; ++at) {
        values[start + at] = (at % 2 == 0) ? kInf : std::numeric_limits<float>::quiet_NaN();
        ASSERT_EQ(CountNonFinite(absl::MakeConstSpan(values).subspan(start, n)), 1u)
            << "start " << start << " n " << n << " at " << at;
        values[start + at] = 0.5f;
      }
    }
  }
}

TEST(CountNonFinite, FindsAValueWhereTheVectorLoopPrefetchesAndWhereItNoLongerDoes) {
  // The AVX2 loop asks for the lines 1024 values ahead until that would pass the end: lengths
  // around that point, at any misalignment of the start, a value anywhere in them, each
  // counted once.
  std::vector<float> values(1250, 0.5f);
  for (size_t start = 0; start < 4; ++start) {
    for (size_t n = 1024; n + start <= 1210; n += 13) {
      const auto span = absl::MakeConstSpan(values).subspan(start, n);
      for (size_t at = 0; at < n; ++at) {
        values[start + at] = kInf;
        values[start + n - 1 - at] = std::numeric_limits<float>::quiet_NaN();
        const size_t want = at == n - 1 - at ? 1 : 2;
        ASSERT_EQ(CountNonFinite(span), want) << "start " << start << " n " << n << " at " << at;
        values[start + at] = 0.5f;
        values[start + n - 1 - at] = 0.5f;
      }
    }
  }
}

TEST(CountNonFinite, ReadsValuesAtAnyByteOffset) {
  // Payloads are checked where gRPC's receive buffers hold them, at any byte offset.
  std::vector<float> values(100, 0.5f);
  std::vector<unsigned char> bytes(values.size() * sizeof(float) + 3);
  for (size_t offset = 0; offset < 4; ++offset) {
    for (size_t at = 0; at < values.size(); at += 7) {
      values[at] = std::numeric_limits<float>::quiet_NaN();
      values[values.size() - 1 - at / 7] = -kInf;
      std::memcpy(bytes.data() + offset, values.data(), values.size() * sizeof(float));
      ASSERT_EQ(CountNonFinite(bytes.data() + offset, values.size()), CountNonFinite(values))
          << "offset " << offset << " at " << at;
      EXPECT_EQ(CountNonFinite(bytes.data() + offset, values.size() - 1),
                CountNonFinite(absl::MakeConstSpan(values).first(values.size() - 1)));
      values[at] = 0.5f;
      values[values.size() - 1 - at / 7] = 0.5f;
    }
  }
}

}  // namespace
}  // namespace ps::common
