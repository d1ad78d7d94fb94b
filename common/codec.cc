#include "common/codec.h"

#include <algorithm>
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

// The wire is little-endian. On a little-endian host a value's bytes are already in wire
// order, so encoding is memcpy. A big-endian port would byte-swap the 16-bit values in
// EncodeInto/DecodeFloats and every value on the FLOAT32 paths.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "common/codec.cc assumes a little-endian host; add byte swaps for this target");
static_assert(sizeof(float) == 4, "float must be IEEE-754 binary32");

namespace ps::common {
namespace {

inline uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float BitsFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kFloatInf = 0x7f800000u;

// True when the dropped low bits `rem` (out of 2^shift) should round the kept part up, for
// stochastic rounding: probability rem / 2^shift, decided by comparing with `random_bits`
// as a fraction of 2^32. Shifts above 32 lose the lowest bits of `rem`, which only matters
// for probabilities below 2^-32.
inline bool StochasticRoundUp(uint32_t rem, int shift, uint32_t random_bits) {
  uint64_t threshold = shift <= 32 ? uint64_t{rem} << (32 - shift)
                                   : (shift >= 64 ? 0 : uint64_t{rem} >> (shift - 32));
  return random_bits < threshold;
}

// Rounds |x| (finite, in the fp16 range after rounding) to fp16 magnitude bits. `up` decides,
// from the kept bits' parity, the dropped bits and their count, whether to round up.
template <typename RoundUp>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint16_t HalfMagnitude(uint32_t abs, RoundUp up) {
  if (abs >= 0x38800000u) {  // >= 2^-14: a normal fp16 (or overflow to inf by rounding).
    // Rebias the exponent from 127 to 15; the mantissa keeps its top 10 of 23 bits. A
    // carry out of the mantissa correctly increments the exponent (up to inf, 0x7c00).
    uint32_t v = abs - (112u << 23);
    uint32_t kept = v >> 13;
    if (up(kept, v & 0x1fffu, 13)) ++kept;
    return static_cast<uint16_t>(kept);
  }
  // Below 2^-14: an fp16 subnormal in units of 2^-24, i.e. m * 2^(e - 126) for the 24-bit
  // significand m. A carry to 0x400 gives exactly the smallest normal.
  // Below 2^-25 round to nearest gives zero; stochastic rounding may still round up. Float
  // subnormals (exponent 0, < 2^-126) are zero in either mode.
  int exponent = static_cast<int>(abs >> 23);
  if (exponent == 0) return 0;
  int shift = 126 - exponent;  // >= 14.
  uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
  uint32_t kept = shift < 32 ? significand >> shift : 0;
  uint32_t rem = shift < 32 ? significand & ((1u << shift) - 1) : significand;
  if (up(kept, rem, shift)) ++kept;
  return static_cast<uint16_t>(kept);
}

// Handles sign, NaN, inf and overflow around HalfMagnitude.
template <typename RoundUp>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint16_t ToHalf(float value, RoundUp up) {
  uint32_t bits = FloatBits(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & kAbsMask;
  if (abs > kFloatInf) {  // NaN: quiet bit set, top payload bits kept.
    return sign | 0x7e00u | static_cast<uint16_t>((abs >> 13) & 0x3ffu);
  }
  if (abs >= 0x47800000u) return sign | 0x7c00u;  // >= 65536 or inf: inf either way.
  return sign | HalfMagnitude(abs, up);
}

template <typename RoundUp>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint16_t ToBfloat16(float value, RoundUp up) {
  uint32_t bits = FloatBits(value);
  if ((bits & kAbsMask) > kFloatInf) {  // NaN: keep sign and payload top, force quiet.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // The carry out of the kept mantissa bits increments the exponent, up to inf: correct
  // rounding for the 16-bit format, including overflow.
  uint32_t kept = bits >> 16;
  if (up(kept, bits & 0xffffu, 16)) ++kept;
  return static_cast<uint16_t>(kept);
}

// Round to nearest, ties to even. A function object (not a function pointer) so that it
// inlines into ToHalf/ToBfloat16.
struct NearestEven {
  bool operator()(uint32_t kept, uint32_t rem, int shift) const {
    if (shift > 32) return false;  // rem < 2^32 is below half.
    uint64_t half = uint64_t{1} << (shift - 1);
    return rem > half || (rem == half && (kept & 1u));
  }
};

void CheckKnown(ps::Encoding encoding) {
  CHECK(IsKnownEncoding(encoding)) << "unknown encoding " << static_cast<int>(encoding)
                                   << "; callers must check IsKnownEncoding first";
}

// Writes values.size() encoded values at `dst`, which must have room for them.
void EncodeInto(absl::Span<const float> values, ps::Encoding encoding, char* dst) {
  switch (encoding) {
    case ps::ENCODING_FLOAT32:
      if (!values.empty()) std::memcpy(dst, values.data(), values.size() * sizeof(float));
      return;
    case ps::ENCODING_FP16:
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t h = ToHalf(values[i], NearestEven());
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case ps::ENCODING_BF16:
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t h = ToBfloat16(values[i], NearestEven());
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    default:
      CheckKnown(encoding);
  }
}

}  // namespace

bool IsKnownEncoding(ps::Encoding encoding) { return BytesPerValue(encoding) != 0; }

size_t BytesPerValue(ps::Encoding encoding) {
  switch (encoding) {
    case ps::ENCODING_FLOAT32:
      return 4;
    case ps::ENCODING_FP16:
    case ps::ENCODING_BF16:
      return 2;
    default:
      return 0;
  }
}

std::string EncodingName(ps::Encoding encoding) {
  switch (encoding) {
    case ps::ENCODING_FLOAT32:
      return "float32";
    case ps::ENCODING_FP16:
      return "fp16";
    case ps::ENCODING_BF16:
      return "bf16";
    default:
      return absl::StrCat("encoding(", static_cast<int>(encoding), ")");
  }
}

void EncodeFloats(absl::Span<const float> values, ps::Encoding encoding, std::string* out) {
  out->clear();
  AppendFloats(values, encoding, out);
}

void AppendFloats(absl::Span<const float> values, ps::Encoding encoding, std::string* out) {
  CheckKnown(encoding);
  size_t old_size = out->size();
  out->resize(old_size + values.size() * BytesPerValue(encoding));
  EncodeInto(values, encoding, &(*out)[old_size]);
}

absl::Status DecodeFloats(absl::string_view bytes, ps::Encoding encoding, absl::Span<float> out) {
  const size_t width = BytesPerValue(encoding);
  if (width == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown encoding ", static_cast<int>(encoding),
                                                   " (", bytes.size(), " bytes for ", out.size(),
                                                   " values)"));
  }
  if (bytes.size() != out.size() * width) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", out.size() * width, " bytes (", out.size(), " values of ",
                     EncodingName(encoding), "), got ", bytes.size()));
  }
  const char* src = bytes.data();
  switch (encoding) {
    case ps::ENCODING_FLOAT32:
      if (!out.empty()) std::memcpy(out.data(), src, bytes.size());
      break;
    case ps::ENCODING_FP16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      break;
    case ps::ENCODING_BF16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = Bfloat16ToFloat(h);
      }
      break;
    default:
      break;  // Unreachable: width != 0.
  }
  return absl::OkStatus();
}

uint16_t FloatToHalf(float value) { return ToHalf(value, NearestEven()); }

float HalfToFloat(uint16_t half) {
  uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f) return BitsFloat(sign | kFloatInf | (mantissa << 13));  // Inf, NaN.
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in binary32.
    float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return BitsFloat(sign | FloatBits(magnitude));
  }
  return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t FloatToBfloat16(float value) { return ToBfloat16(value, NearestEven()); }

float Bfloat16ToFloat(uint16_t bf16) { return BitsFloat(static_cast<uint32_t>(bf16) << 16); }

uint16_t FloatToHalfStochastic(float value, uint32_t random_bits) {
  return ToHalf(value, [random_bits](uint32_t, uint32_t rem, int shift) {
    return StochasticRoundUp(rem, shift, random_bits);
  });
}

uint16_t FloatToBfloat16Stochastic(float value, uint32_t random_bits) {
  return ToBfloat16(value, [random_bits](uint32_t, uint32_t rem, int shift) {
    return StochasticRoundUp(rem, shift, random_bits);
  });
}

}  // namespace ps::common
