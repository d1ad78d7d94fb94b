#include "common/hash.h"

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

// The expected values below were computed independently (a few lines of Python implementing
// splitmix64 and FNV-1a). They are frozen: if one of these tests fails, the hash changed, and
// with it every sparse key's server, every layout fingerprint and every initial value.
TEST(Mix64, MatchesFrozenValues) {
  EXPECT_EQ(Mix64(0), 0u);
  EXPECT_EQ(Mix64(1), 0x5692161d100b05e5ULL);
  EXPECT_EQ(Mix64(2), 0xdbd238973a2b148aULL);
  EXPECT_EQ(Mix64(42), 0xa759ea27d4727622ULL);
  EXPECT_EQ(Mix64(~uint64_t{0}), 0xb4d055fcf2cbbd7bULL);
}

TEST(Fingerprint64, MatchesFrozenValues) {
  EXPECT_EQ(Fingerprint64(""), 0xf52a15e9a9b5e89bULL);
  // FNV-1a 64 of "a" is the published 0xaf63dc4c8601ec8c; then Mix64.
  EXPECT_EQ(Fingerprint64("a"), Mix64(0xaf63dc4c8601ec8cULL));
  EXPECT_EQ(Fingerprint64("a"), 0x02c0bdbf481420f8ULL);
  EXPECT_EQ(Fingerprint64("hello"), 0x16fe05a1c75bcd0fULL);
  EXPECT_EQ(Fingerprint64("mlp/layer0.w"), 0x9275dd87b6799629ULL);
}

TEST(Fingerprint64, UsesEveryByteIncludingNul) {
  const std::string with_nul("a\0b", 3);
  EXPECT_NE(Fingerprint64(with_nul), Fingerprint64("ab"));
  EXPECT_NE(Fingerprint64(with_nul), Fingerprint64("a"));
  // Bytes >= 0x80 are hashed as unsigned.
  EXPECT_NE(Fingerprint64("\xff"), Fingerprint64("\x7f"));
}

TEST(HashCombine, MatchesFrozenValuesAndIsOrderDependent) {
  EXPECT_EQ(HashCombine(0, 0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(HashCombine(1, 2), 0x3706970b052f16b1ULL);
  EXPECT_EQ(HashCombine(2, 1), 0x3fadb6bde9285e98ULL);
}

TEST(Mix64, HasNoCollisionsOnSequentialInputs) {
  absl::flat_hash_set<uint64_t> seen;
  for (uint64_t i = 0; i < 100000; ++i) seen.insert(Mix64(i));
  EXPECT_EQ(seen.size(), 100000u);
}

TEST(Hash, IsUsableAtCompileTime) {
  static_assert(Mix64(0) == 0, "constexpr");
  static_assert(Fingerprint64("") == 0xf52a15e9a9b5e89bULL, "constexpr");
  static_assert(HashCombine(1, 2) == 0x3706970b052f16b1ULL, "constexpr");
}

}  // namespace
}  // namespace ps::common
