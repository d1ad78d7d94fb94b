#include "common/initializer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace ps::common {
namespace {

using ::testing::HasSubstr;

ps::InitializerConfig Init(ps::InitializerConfig::Kind kind) {
  ps::InitializerConfig init;
  init.set_kind(kind);
  return init;
}

ps::TableConfig Dense(std::vector<int64_t> shape) {
  ps::TableConfig table;
  table.set_name("t");
  table.set_kind(ps::TABLE_KIND_DENSE);
  for (int64_t d : shape) table.add_shape(d);
  return table;
}

std::vector<float> Values(const ps::InitializerConfig& init, uint64_t first, size_t n,
                          const char* table = "t", uint64_t fan_in = 784, uint64_t fan_out = 10) {
  std::vector<float> out(n);
  InitializeValues(init, table, fan_in, fan_out, first, absl::MakeSpan(out));
  return out;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

struct Moments {
  double mean = 0, stddev = 0, min = 0, max = 0;
};

Moments Measure(const std::vector<float>& v) {
  Moments m;
  m.min = std::numeric_limits<double>::infinity();
  m.max = -m.min;
  double sum = 0, sum_sq = 0;
  for (float x : v) {
    sum += x;
    sum_sq += static_cast<double>(x) * x;
    m.min = std::min<double>(m.min, x);
    m.max = std::max<double>(m.max, x);
  }
  m.mean = sum / v.size();
  m.stddev = std::sqrt(sum_sq / v.size() - m.mean * m.mean);
  return m;
}

const ps::InitializerConfig::Kind kRandomKinds[] = {
    ps::InitializerConfig::UNIFORM, ps::InitializerConfig::NORMAL,
    ps::InitializerConfig::TRUNCATED_NORMAL, ps::InitializerConfig::GLOROT_UNIFORM};

TEST(InitializeValues, DoesNotDependOnHowTheRangeIsSplit) {
  for (auto kind : kRandomKinds) {
    ps::InitializerConfig init = Init(kind);
    std::vector<float> whole = Values(init, 0, 100);
    std::vector<float> split = Values(init, 0, 37);
    std::vector<float> rest = Values(init, 37, 63);
    split.insert(split.end(), rest.begin(), rest.end());
    ASSERT_EQ(split.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      ASSERT_EQ(Bits(split[i]), Bits(whole[i])) << "kind " << kind << " element " << i;
    }
    // Not a degenerate stream.
    EXPECT_NE(whole[0], whole[1]) << kind;
  }
}

// Computed independently (Python, same generator); freezes the scheme. If this fails,
// existing checkpoints and running clusters would see different initial values.
TEST(InitializeValues, MatchesFrozenUniformValues) {
  std::vector<float> v = Values(Init(ps::InitializerConfig::UNIFORM), 0, 3);
  EXPECT_EQ(Bits(v[0]), 0x3cf9ac9du);
  EXPECT_EQ(Bits(v[1]), 0x3c717667u);
  EXPECT_EQ(Bits(v[2]), 0x3d1e9a53u);
  std::vector<float> row(2);
  InitializeSparseRow(Init(ps::InitializerConfig::UNIFORM), "t", 7, absl::MakeSpan(row));
  EXPECT_EQ(Bits(row[0]), 0xbd045f5bu);
  EXPECT_EQ(Bits(row[1]), 0xbb20ce80u);
}

TEST(InitializeValues, DiffersAcrossTablesAndSeeds) {
  for (auto kind : kRandomKinds) {
    ps::InitializerConfig init = Init(kind);
    std::vector<float> base = Values(init, 0, 64, "t");
    EXPECT_NE(base, Values(init, 0, 64, "u")) << kind;
    EXPECT_NE(base, Values(init, 64, 64, "t")) << kind;
    init.set_seed(2);
    EXPECT_NE(base, Values(init, 0, 64, "t")) << kind;
  }
}

TEST(InitializeValues, ZerosAndConstant) {
  EXPECT_THAT(Values(Init(ps::InitializerConfig::ZEROS), 5, 10), testing::Each(0.0f));
  ps::InitializerConfig init = Init(ps::InitializerConfig::CONSTANT);
  init.set_value(0.25f);
  EXPECT_THAT(Values(init, 5, 10), testing::Each(0.25f));
}

TEST(InitializeValues, NormalHasRequestedMoments) {
  ps::InitializerConfig init = Init(ps::InitializerConfig::NORMAL);
  init.set_mean(0.5f);
  init.set_stddev(2.0f);
  Moments m = Measure(Values(init, 0, 100000));
  EXPECT_NEAR(m.mean, 0.5, 0.03);  // ~5 standard errors.
  EXPECT_NEAR(m.stddev, 2.0, 0.04);
  // Both tails are populated (Box-Muller with 24-bit uniforms reaches ~5.8 sigma).
  EXPECT_LT(m.min, 0.5 - 3 * 2.0);
  EXPECT_GT(m.max, 0.5 + 3 * 2.0);
}

TEST(InitializeValues, TruncatedNormalStaysWithinTwoStddev) {
  ps::InitializerConfig init = Init(ps::InitializerConfig::TRUNCATED_NORMAL);
  init.set_mean(-1.0f);
  init.set_stddev(0.5f);
  Moments m = Measure(Values(init, 0, 100000));
  EXPECT_GE(m.min, -1.0 - 2 * 0.5);
  EXPECT_LE(m.max, -1.0 + 2 * 0.5);
  EXPECT_NEAR(m.mean, -1.0, 0.01);
  // A standard normal truncated at +/-2 has stddev 0.8796.
  EXPECT_NEAR(m.stddev, 0.8796 * 0.5, 0.01);
  EXPECT_LT(m.min, -1.0 - 1.9 * 0.5);  // Reaches near the bounds.
}

TEST(InitializeValues, UniformStaysWithinBounds) {
  ps::InitializerConfig init = Init(ps::InitializerConfig::UNIFORM);
  init.set_low(2.0f);
  init.set_high(3.0f);
  Moments m = Measure(Values(init, 0, 100000));
  EXPECT_GE(m.min, 2.0);
  EXPECT_LT(m.max, 3.0);
  EXPECT_NEAR(m.mean, 2.5, 0.005);
  EXPECT_NEAR(m.stddev, 1.0 / std::sqrt(12.0), 0.005);
  EXPECT_LT(m.min, 2.001);
  EXPECT_GT(m.max, 2.999);
}

TEST(InitializeValues, UniformNeverReturnsHigh) {
  // Adjacent floats: every draw must be `low`.
  ps::InitializerConfig init = Init(ps::InitializerConfig::UNIFORM);
  init.set_low(1.0f);
  init.set_high(std::nextafter(1.0f, 2.0f));
  EXPECT_THAT(Values(init, 0, 1000), testing::Each(1.0f));
}

TEST(InitializeValues, GlorotUsesTheFans) {
  ps::InitializerConfig init = Init(ps::InitializerConfig::GLOROT_UNIFORM);
  const double limit = std::sqrt(6.0 / (784 + 10));
  Moments m = Measure(Values(init, 0, 100000, "t", 784, 10));
  EXPECT_GE(m.min, -limit);
  EXPECT_LT(m.max, limit);
  EXPECT_GT(m.max, 0.99 * limit);
  EXPECT_LT(m.min, -0.99 * limit);
  EXPECT_NEAR(m.stddev, limit / std::sqrt(3.0), 0.01 * limit);
  Moments wide = Measure(Values(init, 0, 10000, "t", 10, 10));
  EXPECT_GT(wide.max, 0.99 * std::sqrt(6.0 / 20));
}

TEST(InitializeSparseRow, IsAPureFunctionOfKeyAndColumn) {
  ps::InitializerConfig init = Init(ps::InitializerConfig::NORMAL);
  std::vector<float> a(8), b(8), other_key(8), other_table(8);
  InitializeSparseRow(init, "emb", 42, absl::MakeSpan(a));
  InitializeSparseRow(init, "emb", 42, absl::MakeSpan(b));
  InitializeSparseRow(init, "emb", 43, absl::MakeSpan(other_key));
  InitializeSparseRow(init, "emb2", 42, absl::MakeSpan(other_table));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other_key);
  EXPECT_NE(a, other_table);
  EXPECT_NE(a[0], a[1]);
  // A wider row starts with the same values: element j depends on j, not on the width.
  std::vector<float> wide(16);
  InitializeSparseRow(init, "emb", 42, absl::MakeSpan(wide));
  EXPECT_TRUE(std::equal(a.begin(), a.end(), wide.begin()));
  init.set_seed(9);
  InitializeSparseRow(init, "emb", 42, absl::MakeSpan(b));
  EXPECT_NE(a, b);
}

TEST(InitializeSparseRow, NormalHasRequestedMomentsAcrossKeys) {
  ps::InitializerConfig init = Init(ps::InitializerConfig::NORMAL);  // stddev 0.01.
  std::vector<float> all;
  std::vector<float> row(10);
  for (uint64_t key = 0; key < 10000; ++key) {
    InitializeSparseRow(init, "emb", key * 1000003, absl::MakeSpan(row));
    all.insert(all.end(), row.begin(), row.end());
  }
  Moments m = Measure(all);
  EXPECT_NEAR(m.mean, 0.0, 0.00015);
  EXPECT_NEAR(m.stddev, 0.01, 0.0002);
}

TEST(ComputeFans, ByShape) {
  Fans f = ComputeFans(Dense({784, 10}));
  EXPECT_EQ(f.in, 784u);
  EXPECT_EQ(f.out, 10u);
  f = ComputeFans(Dense({7}));
  EXPECT_EQ(f.in, 7u);
  EXPECT_EQ(f.out, 7u);
  f = ComputeFans(Dense({3, 4, 5}));
  EXPECT_EQ(f.in, 12u);
  EXPECT_EQ(f.out, 5u);
  ps::TableConfig sparse;
  sparse.set_kind(ps::TABLE_KIND_SPARSE);
  sparse.set_dim(8);
  EXPECT_EQ(ComputeFans(sparse).in, 0u);
}

TEST(ValidateInitializer, AcceptsDefaultsAndValidConfigs) {
  EXPECT_OK(ValidateInitializer(Init(ps::InitializerConfig::ZEROS), Dense({3})));
  EXPECT_OK(ValidateInitializer(Init(ps::InitializerConfig::UNIFORM), Dense({3})));
  EXPECT_OK(ValidateInitializer(Init(ps::InitializerConfig::NORMAL), Dense({3})));
  EXPECT_OK(ValidateInitializer(Init(ps::InitializerConfig::TRUNCATED_NORMAL), Dense({3})));
  EXPECT_OK(ValidateInitializer(Init(ps::InitializerConfig::GLOROT_UNIFORM), Dense({3, 4})));
}

TEST(ValidateInitializer, RejectsBadParameters) {
  ps::InitializerConfig uniform = Init(ps::InitializerConfig::UNIFORM);
  uniform.set_low(1.0f);
  uniform.set_high(1.0f);
  EXPECT_THAT(ValidateInitializer(uniform, Dense({3})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("high: must be > low")));
  uniform.set_low(std::numeric_limits<float>::infinity());
  EXPECT_THAT(ValidateInitializer(uniform, Dense({3})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("low: must be finite")));

  ps::InitializerConfig normal = Init(ps::InitializerConfig::TRUNCATED_NORMAL);
  normal.set_stddev(0.0f);
  EXPECT_THAT(ValidateInitializer(normal, Dense({3})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stddev: must be > 0")));
  normal.set_stddev(std::numeric_limits<float>::quiet_NaN());
  EXPECT_THAT(ValidateInitializer(normal, Dense({3})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stddev")));
  normal.set_stddev(1.0f);
  normal.set_mean(std::numeric_limits<float>::quiet_NaN());
  EXPECT_THAT(ValidateInitializer(normal, Dense({3})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mean")));

  ps::InitializerConfig constant = Init(ps::InitializerConfig::CONSTANT);
  constant.set_value(-std::numeric_limits<float>::infinity());
  EXPECT_THAT(ValidateInitializer(constant, Dense({3})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("value")));
}

TEST(ValidateInitializer, GlorotNeedsADense2DTable) {
  ps::InitializerConfig glorot = Init(ps::InitializerConfig::GLOROT_UNIFORM);
  EXPECT_THAT(ValidateInitializer(glorot, Dense({3})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("GLOROT_UNIFORM")));
  ps::TableConfig sparse;
  sparse.set_kind(ps::TABLE_KIND_SPARSE);
  sparse.set_dim(4);
  EXPECT_THAT(ValidateInitializer(glorot, sparse),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kind")));
}

}  // namespace
}  // namespace ps::common
