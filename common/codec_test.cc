#include "common/codec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

using ::testing::HasSubstr;

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t ToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

bool IsHalfNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(FloatToHalf, KnownBitPatterns) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.5f), 0xc100);
  EXPECT_EQ(FloatToHalf(0.1f), 0x2e66);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);  // Largest finite fp16.
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);     // Smallest normal.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);     // Smallest subnormal.
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.0f, -24)), 0x03ff);  // Largest subnormal.
}

TEST(FloatToHalf, OverflowBecomesInfinity) {
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // Halfway to 2^16: ties to even = inf.
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(FloatToHalf(kInf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-kInf), 0xfc00);
}

TEST(FloatToHalf, TiesRoundToEven) {
  // 1 + 2^-11 lies halfway between 1 (even) and 1 + 2^-10 (odd).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 lies halfway between 0x3c01 (odd) and 0x3c02 (even).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3c02);
  // Just above a tie rounds up.
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  // Subnormal ties: 2^-25 is halfway between 0 and the smallest subnormal; 3 * 2^-25
  // halfway between 1 and 2 units.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);
  EXPECT_EQ(FloatToHalf(std::ldexp(5.0f, -25)), 0x0002);
  // Rounding the largest subnormal up carries into the smallest normal.
  EXPECT_EQ(FloatToHalf(std::ldexp(2047.0f, -25)), 0x0400);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::denorm_min()), 0x8000);
}

TEST(FloatToHalf, NanStaysNan) {
  EXPECT_TRUE(IsHalfNan(FloatToHalf(std::numeric_limits<float>::quiet_NaN())));
  // A signaling NaN whose payload lives only in the low bits must not become inf.
  uint16_t h = FloatToHalf(FromBits(0x7f800001u));
  EXPECT_TRUE(IsHalfNan(h)) << std::hex << h;
  EXPECT_EQ(FloatToHalf(FromBits(0xff800001u)) & 0x8000, 0x8000);  // Sign kept.
}

TEST(FloatToHalf, MatchesCompilerConversionOnManyValues) {
#ifdef __FLT16_MAX__
  // The compiler's _Float16 conversion (libgcc, round to nearest even) is an independent
  // reference. Walk the float bit patterns with a stride that hits every exponent.
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4099) {
    float f = FromBits(static_cast<uint32_t>(bits));
    if (std::isnan(f)) continue;
    _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(FloatToHalf(f), ref_bits) << "float bits 0x" << std::hex << bits;
  }
#else
  GTEST_SKIP() << "no _Float16 on this compiler";
#endif
}

TEST(HalfToFloat, KnownValues) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc100), -2.5f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(HalfToFloat(0x7c00), kInf);
  EXPECT_EQ(HalfToFloat(0xfc00), -kInf);
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7c01)));
  EXPECT_EQ(ToBits(HalfToFloat(0x8000)), 0x80000000u);  // -0.
  EXPECT_EQ(ToBits(HalfToFloat(0x8001)), ToBits(-std::ldexp(1.0f, -24)));
}

TEST(Half, EveryNonNanValueRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    uint16_t half = static_cast<uint16_t>(h);
    if (IsHalfNan(half)) {
      EXPECT_TRUE(IsHalfNan(FloatToHalf(HalfToFloat(half)))) << std::hex << h;
    } else {
      ASSERT_EQ(FloatToHalf(HalfToFloat(half)), half) << std::hex << h;
    }
  }
}

TEST(FloatToBfloat16, KnownBitPatterns) {
  EXPECT_EQ(FloatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBfloat16(-2.5f), 0xc020);
  EXPECT_EQ(FloatToBfloat16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBfloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBfloat16(kInf), 0x7f80);
  EXPECT_EQ(FloatToBfloat16(-kInf), 0xff80);
  EXPECT_EQ(FloatToBfloat16(FromBits(0x00000001u)), 0x0000);  // Float subnormal.
  EXPECT_EQ(FloatToBfloat16(FromBits(0x00018000u)), 0x0002);  // Subnormal tie to even.
}

TEST(FloatToBfloat16, TiesRoundToEvenAndOverflowToInf) {
  EXPECT_EQ(FloatToBfloat16(FromBits(0x3f808000u)), 0x3f80);  // Tie, 0x3f80 even.
  EXPECT_EQ(FloatToBfloat16(FromBits(0x3f818000u)), 0x3f82);  // Tie, 0x3f81 odd.
  EXPECT_EQ(FloatToBfloat16(FromBits(0x3f808001u)), 0x3f81);  // Above the tie.
  EXPECT_EQ(FloatToBfloat16(FromBits(0x3f807fffu)), 0x3f80);  // Below the tie.
  EXPECT_EQ(FloatToBfloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBfloat16(FromBits(0x7f7f7fffu)), 0x7f7f);  // Largest that stays finite.
}

TEST(FloatToBfloat16, NanIsKeptQuiet) {
  // Truncating 0x7f800001 would give 0x7f80, which is inf.
  EXPECT_EQ(FloatToBfloat16(FromBits(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(FloatToBfloat16(FromBits(0xffc00000u)), 0xffc0);
  // Rounding must not carry a NaN's payload into the sign bit.
  EXPECT_EQ(FloatToBfloat16(FromBits(0x7fffffffu)), 0x7fff);
  EXPECT_TRUE(std::isnan(Bfloat16ToFloat(FloatToBfloat16(FromBits(0x7f800001u)))));
}

TEST(Bfloat16, EveryValueRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    uint16_t bf = static_cast<uint16_t>(b);
    float f = Bfloat16ToFloat(bf);
    ASSERT_EQ(ToBits(f), b << 16);
    if (std::isnan(f)) {
      EXPECT_EQ(FloatToBfloat16(f), bf | 0x0040) << std::hex << b;
    } else {
      ASSERT_EQ(FloatToBfloat16(f), bf) << std::hex << b;
    }
  }
}

// Fraction of 1024 evenly spaced random_bits values for which the conversion rounds up.
template <typename Fn>
int RoundUpsOutOf1024(Fn convert, uint16_t truncated) {
  int ups = 0;
  for (uint64_t k = 0; k < 1024; ++k) {
    uint16_t result = convert(static_cast<uint32_t>(k << 22));
    if (result != truncated) {
      EXPECT_EQ(result, truncated + 1);
      ++ups;
    }
  }
  return ups;
}

TEST(Stochastic, ExtremeRandomBitsTruncateOrRoundAway) {
  float x = 1.0f + std::ldexp(1.0f, -12);  // A quarter ulp above 1 in fp16.
  EXPECT_EQ(FloatToHalfStochastic(x, 0xffffffffu), 0x3c00);
  EXPECT_EQ(FloatToHalfStochastic(x, 0), 0x3c01);
  EXPECT_EQ(FloatToHalfStochastic(-x, 0), 0xbc01);
  float y = FromBits(0x3f800001u);  // Tiny excess over 1 in bf16.
  EXPECT_EQ(FloatToBfloat16Stochastic(y, 0xffffffffu), 0x3f80);
  EXPECT_EQ(FloatToBfloat16Stochastic(y, 0), 0x3f81);
  // Exactly representable values never change.
  EXPECT_EQ(FloatToHalfStochastic(1.0f, 0), 0x3c00);
  EXPECT_EQ(FloatToBfloat16Stochastic(1.0f, 0), 0x3f80);
}

TEST(Stochastic, RoundsUpInProportionToTheRemainder) {
  // A quarter ulp: exactly a quarter of evenly spread random_bits round up.
  float half_quarter = 1.0f + std::ldexp(1.0f, -12);
  EXPECT_EQ(
      RoundUpsOutOf1024([&](uint32_t r) { return FloatToHalfStochastic(half_quarter, r); }, 0x3c00),
      256);
  float bf_three_quarters = FromBits(0x3f80c000u);
  EXPECT_EQ(
      RoundUpsOutOf1024([&](uint32_t r) { return FloatToBfloat16Stochastic(bf_three_quarters, r); },
                        0x3f80),
      768);
  // Subnormal fp16, including below half the smallest subnormal (nearest would give 0).
  float quarter_subnormal = std::ldexp(1.0f, -26);
  EXPECT_EQ(
      RoundUpsOutOf1024([&](uint32_t r) { return FloatToHalfStochastic(quarter_subnormal, r); }, 0),
      256);
}

TEST(Stochastic, KeepsNanAndInf) {
  EXPECT_TRUE(IsHalfNan(FloatToHalfStochastic(FromBits(0x7f800001u), 0)));
  EXPECT_EQ(FloatToHalfStochastic(kInf, 0), 0x7c00);
  EXPECT_EQ(FloatToBfloat16Stochastic(FromBits(0x7f800001u), 0), 0x7fc0);
  EXPECT_EQ(FloatToBfloat16Stochastic(-kInf, 0), 0xff80);
}

TEST(BytesPerValue, PerEncoding) {
  EXPECT_EQ(BytesPerValue(ps::ENCODING_FLOAT32), 4u);
  EXPECT_EQ(BytesPerValue(ps::ENCODING_FP16), 2u);
  EXPECT_EQ(BytesPerValue(ps::ENCODING_BF16), 2u);
  EXPECT_EQ(BytesPerValue(static_cast<ps::Encoding>(7)), 0u);
  EXPECT_FALSE(IsKnownEncoding(static_cast<ps::Encoding>(7)));
  EXPECT_TRUE(IsKnownEncoding(ps::ENCODING_BF16));
}

TEST(EncodeFloats, IsLittleEndian) {
  std::string out;
  EncodeFloats({1.0f}, ps::ENCODING_FLOAT32, &out);
  EXPECT_EQ(out, std::string("\x00\x00\x80\x3f", 4));
  EncodeFloats({1.0f, -2.5f}, ps::ENCODING_FP16, &out);
  EXPECT_EQ(out, std::string("\x00\x3c\x00\xc1", 4));
  EncodeFloats({1.0f}, ps::ENCODING_BF16, &out);
  EXPECT_EQ(out, std::string("\x80\x3f", 2));
}

TEST(EncodeFloats, ReplacesAndAppendFloatsAppends) {
  std::string out = "stale";
  EncodeFloats({2.0f}, ps::ENCODING_BF16, &out);
  EXPECT_EQ(out.size(), 2u);
  AppendFloats({1.0f, 1.0f}, ps::ENCODING_FP16, &out);
  EXPECT_EQ(out, std::string("\x00\x40\x00\x3c\x00\x3c", 6));
  EncodeFloats({}, ps::ENCODING_FLOAT32, &out);
  EXPECT_TRUE(out.empty());
}

TEST(EncodeFloatsDeathTest, UnknownEncodingIsAProgrammerError) {
  std::string out;
  EXPECT_DEATH(EncodeFloats({1.0f}, static_cast<ps::Encoding>(9), &out), "unknown encoding 9");
}

TEST(DecodeFloats, Float32RoundTripIsBitExact) {
  std::vector<float> values = {
      1.0f, -0.0f, 3.14159f, kInf, FromBits(0x7fa00001u), std::numeric_limits<float>::denorm_min()};
  std::string bytes;
  EncodeFloats(values, ps::ENCODING_FLOAT32, &bytes);
  std::vector<float> decoded(values.size());
  ASSERT_OK(DecodeFloats(bytes, ps::ENCODING_FLOAT32, absl::MakeSpan(decoded)));
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(ToBits(decoded[i]), ToBits(values[i]));
}

TEST(DecodeFloats, SixteenBitRoundTripsWithinHalfAnUlp) {
  std::vector<float> values;
  for (int i = -500; i <= 500; ++i) values.push_back(i * 0.37f);
  for (ps::Encoding encoding : {ps::ENCODING_FP16, ps::ENCODING_BF16}) {
    std::string bytes;
    EncodeFloats(values, encoding, &bytes);
    ASSERT_EQ(bytes.size(), values.size() * 2);
    std::vector<float> decoded(values.size());
    ASSERT_OK(DecodeFloats(bytes, encoding, absl::MakeSpan(decoded)));
    // Half an ulp relative: 2^-11 for fp16, 2^-8 for bf16.
    const float rel = encoding == ps::ENCODING_FP16 ? std::ldexp(1.0f, -11) : std::ldexp(1.0f, -8);
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_NEAR(decoded[i], values[i], std::fabs(values[i]) * rel) << EncodingName(encoding);
    }
  }
}

TEST(DecodeFloats, SizeMismatchIsInvalidArgumentAndLeavesOutputAlone) {
  std::vector<float> out = {7.0f, 7.0f, 7.0f, 7.0f};
  EXPECT_THAT(
      DecodeFloats(std::string(7, '\0'), ps::ENCODING_FP16, absl::MakeSpan(out)),
      StatusIs(absl::StatusCode::kInvalidArgument, "expected 8 bytes (4 values of fp16), got 7"));
  EXPECT_THAT(DecodeFloats(std::string(8, '\0'), ps::ENCODING_FLOAT32, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "expected 16 bytes (4 values of float32), got 8"));
  EXPECT_THAT(out, testing::Each(7.0f));
}

TEST(DecodeFloats, UnknownEncodingIsInvalidArgument) {
  std::vector<float> out(2);
  EXPECT_THAT(DecodeFloats(std::string(8, '\0'), static_cast<ps::Encoding>(5), absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown encoding 5")));
}

TEST(DecodeFloats, EmptyIsOk) {
  EXPECT_OK(DecodeFloats("", ps::ENCODING_BF16, absl::Span<float>()));
}

}  // namespace
}  // namespace ps::common
