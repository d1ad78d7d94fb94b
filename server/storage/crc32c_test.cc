#include "server/storage/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace ps::server::storage::crc32c {
namespace {

TEST(Crc32c, MatchesKnownVectors) {
  EXPECT_EQ(Value(""), 0u);
  EXPECT_EQ(Value("123456789"), 0xE3069283u);
  // RFC 3720 B.4: 32 bytes of zeros / of 0xFF.
  EXPECT_EQ(Value(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Value(std::string(32, '\xFF')), 0x62A8AB43u);
}

TEST(Crc32c, ExtendEqualsValueOfConcatenation) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 31 + 7));
  for (size_t split : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    absl::string_view view(data);
    EXPECT_EQ(Extend(Value(view.substr(0, split)), view.substr(split)), Value(data)) << split;
  }
}

TEST(Crc32c, DetectsSingleBitFlip) {
  std::string data(4096, 'x');
  const uint32_t clean = Value(data);
  data[1234] ^= 0x10;
  EXPECT_NE(Value(data), clean);
}

}  // namespace
}  // namespace ps::server::storage::crc32c
