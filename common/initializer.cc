#include "common/initializer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace ps::common {
namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;
// 2^-24: the weight of the lowest of the 24 bits a uniform draw keeps.
constexpr double kUnit24 = 1.0 / 16777216.0;
// A truncated normal tries this many (u1, u2) pairs. Each pair is rejected with probability
// 4.6%, so running out (then the mean is used) has probability ~1e-85.
constexpr uint32_t kMaxTruncatedPairs = 64;

uint64_t TableBase(const ps::InitializerConfig& init, absl::string_view table_name) {
  return HashCombine(Mix64(init.seed()), Fingerprint64(table_name));
}

// In [0, 1), from the 24 high bits (exactly representable in a float).
double Uniform01(uint64_t bits) { return static_cast<double>(bits >> 40) * kUnit24; }
// In (0, 1]: safe for log().
double UniformOpen0(uint64_t bits) { return static_cast<double>((bits >> 40) + 1) * kUnit24; }

// Box-Muller over counters (c, c + 1) of `stream`.
double StandardNormal(uint64_t stream, uint32_t c) {
  double u1 = UniformOpen0(HashCombine(stream, c));
  double u2 = Uniform01(HashCombine(stream, c + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

// Uniform in [low, high). Rounding to float can reach `high`; that value is moved to the
// next float below it.
float UniformIn(float low, float high, double u) {
  float v = static_cast<float>(static_cast<double>(low) +
                               (static_cast<double>(high) - static_cast<double>(low)) * u);
  return v < high ? v : std::nextafter(high, low);
}

// The value of the element whose stream is `stream`.
float Draw(const ps::InitializerConfig& init, float glorot_limit, uint64_t stream) {
  switch (init.kind()) {
    case ps::InitializerConfig::CONSTANT:
      return init.value();
    case ps::InitializerConfig::UNIFORM:
      return UniformIn(init.low(), init.high(), Uniform01(HashCombine(stream, 0)));
    case ps::InitializerConfig::NORMAL:
      return static_cast<float>(init.mean() + init.stddev() * StandardNormal(stream, 0));
    case ps::InitializerConfig::TRUNCATED_NORMAL:
      for (uint32_t pair = 0; pair < kMaxTruncatedPairs; ++pair) {
        double z = StandardNormal(stream, 2 * pair);
        if (std::fabs(z) <= 2.0) return static_cast<float>(init.mean() + init.stddev() * z);
      }
      return init.mean();
    case ps::InitializerConfig::GLOROT_UNIFORM:
      if (glorot_limit <= 0) return 0.0f;
      return UniformIn(-glorot_limit, glorot_limit, Uniform01(HashCombine(stream, 0)));
    default:  // ZEROS, and unknown kinds (rejected by ValidateInitializer).
      return 0.0f;
  }
}

// True when every element gets the same value, which needs no per-element hashing.
bool IsConstantFill(const ps::InitializerConfig& init) {
  return init.kind() != ps::InitializerConfig::UNIFORM &&
         init.kind() != ps::InitializerConfig::NORMAL &&
         init.kind() != ps::InitializerConfig::TRUNCATED_NORMAL &&
         init.kind() != ps::InitializerConfig::GLOROT_UNIFORM;
}

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

absl::Status CheckFinite(absl::string_view field, float value) {
  if (std::isfinite(value)) return absl::OkStatus();
  return FieldError(field, absl::StrCat("must be finite, got ", value));
}

absl::Status CheckStddev(const ps::InitializerConfig& init) {
  if (init.stddev() > 0 && std::isfinite(init.stddev())) return CheckFinite("mean", init.mean());
  return FieldError("stddev", absl::StrCat("must be > 0 and finite, got ", init.stddev()));
}

}  // namespace

Fans ComputeFans(const ps::TableConfig& table) {
  if (table.kind() != ps::TABLE_KIND_DENSE || table.shape_size() == 0) return {};
  auto dim = [&](int i) { return static_cast<uint64_t>(std::max<int64_t>(0, table.shape(i))); };
  const int last = table.shape_size() - 1;
  uint64_t in = 1;
  for (int i = 0; i < last; ++i) in *= dim(i);
  if (last == 0) in = dim(0);
  return {in, dim(last)};
}

absl::Status ValidateInitializer(const ps::InitializerConfig& init, const ps::TableConfig& table) {
  switch (init.kind()) {
    case ps::InitializerConfig::ZEROS:
      return absl::OkStatus();
    case ps::InitializerConfig::CONSTANT:
      return CheckFinite("value", init.value());
    case ps::InitializerConfig::UNIFORM:
      if (!std::isfinite(init.low())) return CheckFinite("low", init.low());
      if (!std::isfinite(init.high())) return CheckFinite("high", init.high());
      if (!(init.low() < init.high())) {
        return FieldError("high",
                          absl::StrCat("must be > low (", init.low(), "), got ", init.high()));
      }
      return absl::OkStatus();
    case ps::InitializerConfig::NORMAL:
    case ps::InitializerConfig::TRUNCATED_NORMAL:
      return CheckStddev(init);
    case ps::InitializerConfig::GLOROT_UNIFORM: {
      if (table.kind() != ps::TABLE_KIND_DENSE || table.shape_size() != 2) {
        return FieldError("kind", "GLOROT_UNIFORM needs a dense 2-D table ([fan_in, fan_out])");
      }
      Fans fans = ComputeFans(table);
      if (fans.in + fans.out == 0) return FieldError("kind", "GLOROT_UNIFORM with fans 0");
      return absl::OkStatus();
    }
    default:
      return FieldError("kind", absl::StrCat("unknown value ", static_cast<int>(init.kind())));
  }
}

void InitializeValues(const ps::InitializerConfig& init, absl::string_view table_name,
                      uint64_t fan_in, uint64_t fan_out, uint64_t first_index,
                      absl::Span<float> out) {
  if (IsConstantFill(init)) {
    std::fill(out.begin(), out.end(), Draw(init, 0.0f, 0));
    return;
  }
  const float glorot_limit =
      fan_in + fan_out == 0
          ? 0.0f
          : static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
  const uint64_t base = TableBase(init, table_name);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = Draw(init, glorot_limit, HashCombine(base, first_index + i));
  }
}

void InitializeSparseRow(const ps::InitializerConfig& init, absl::string_view table_name,
                         uint64_t key, absl::Span<float> row) {
  if (IsConstantFill(init) || init.kind() == ps::InitializerConfig::GLOROT_UNIFORM) {
    std::fill(row.begin(), row.end(), Draw(init, 0.0f, 0));
    return;
  }
  const uint64_t base = TableBase(init, table_name);
  for (size_t j = 0; j < row.size(); ++j) {
    row[j] = Draw(init, 0.0f, HashCombine(base, HashCombine(key, j)));
  }
}

}  // namespace ps::common
