// The one float codec: packs float payloads (parameters, gradients) into the `bytes` fields of
// ps.proto and unpacks them, in one of the ps::Encoding formats.
//
// Wire layout: values are packed back to back with no header, each little-endian:
//   ENCODING_FLOAT32  4 bytes per value, IEEE-754 binary32.
//   ENCODING_FP16     2 bytes per value, IEEE-754 binary16.
//   ENCODING_BF16     2 bytes per value, bfloat16 (the upper 16 bits of a binary32).
// The number of values is never on the wire: the receiver knows it (block size, keys * dim)
// and DecodeFloats checks that the byte count matches.
//
// Rounding of the 16-bit formats: round to nearest, ties to even. Values beyond the fp16
// range (|x| >= 65520) become +/-inf; fp16 subnormals are exact where representable; NaN
// stays NaN (made quiet, sign and top payload bits kept); +/-0 and +/-inf are kept.
// The *Stochastic variants round the magnitude up with probability equal to the fraction of
// a unit in the last place that is dropped, which makes the rounding unbiased on average.
//
// All functions are thread-safe (pure functions of their arguments).
#ifndef PS_COMMON_CODEC_H_
#define PS_COMMON_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/nonfinite.h"
#include "proto/types.pb.h"

namespace ps::common {

// True for the encodings this codec implements (every value of ps::Encoding today).
// `encoding` may come from a peer's message (proto3 enums carry any int), so check it before
// calling EncodeFloats.
bool IsKnownEncoding(ps::Encoding encoding);

// Bytes per encoded value: 4 for FLOAT32, 2 for FP16 and BF16, 0 for an unknown encoding.
size_t BytesPerValue(ps::Encoding encoding);

// A short name for messages: "float32", "fp16", "bf16", or "encoding(<number>)".
std::string EncodingName(ps::Encoding encoding);

// Replaces `*out` with `values` encoded as `encoding` (values.size() * BytesPerValue bytes).
// FLOAT32 is one memcpy.
// REQUIRES: IsKnownEncoding(encoding) (checked; an unknown encoding is a programmer error).
void EncodeFloats(absl::Span<const float> values, ps::Encoding encoding, std::string* out);

// As EncodeFloats, but appends to `*out` instead of replacing it.
void AppendFloats(absl::Span<const float> values, ps::Encoding encoding, std::string* out);

// Decodes `bytes` into `out`, which must hold exactly bytes.size() / BytesPerValue values.
// Errors: INVALID_ARGUMENT "expected N bytes (M values of <enc>), got K" when the size does
// not match out.size(), and INVALID_ARGUMENT for an unknown encoding. `out` is unchanged on
// error. FLOAT32 is one memcpy. Non-finite values are decoded as they are (see
// CountNonFinite).
[[nodiscard]] absl::Status DecodeFloats(absl::string_view bytes, ps::Encoding encoding,
                                        absl::Span<float> out);

// CountNonFinite (NaN and +/-inf values): common/nonfinite.h, included above.

// ---- Scalar conversions ------------------------------------------------------------------

// binary32 -> binary16 bits, round to nearest even (see the file comment).
uint16_t FloatToHalf(float value);
// binary16 bits -> binary32; exact (every fp16 value is a float).
float HalfToFloat(uint16_t half);
// binary32 -> bfloat16 bits, round to nearest even; NaN becomes a quiet NaN.
uint16_t FloatToBfloat16(float value);
// bfloat16 bits -> binary32; exact.
float Bfloat16ToFloat(uint16_t bf16);

// Stochastic rounding: `random_bits` is a uniformly random 32-bit number; the magnitude is
// rounded up iff random_bits < (dropped fraction of an ulp) * 2^32. So random_bits ==
// 0xffffffff truncates toward zero, random_bits == 0 rounds every inexact value away from
// zero, and the expectation over random_bits is the input value (a value beyond the largest
// finite result may become inf). NaN, inf and exactly representable values are converted as
// by the round-to-nearest functions.
uint16_t FloatToHalfStochastic(float value, uint32_t random_bits);
uint16_t FloatToBfloat16Stochastic(float value, uint32_t random_bits);

}  // namespace ps::common

#endif  // PS_COMMON_CODEC_H_
