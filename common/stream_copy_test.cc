#include "common/stream_copy.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace ps::common {
namespace {

// Every length around the 64-byte loop and every alignment of both ends: the bytes copied are
// the source's, and not one byte around the destination range changes.
TEST(StreamCopy, CopiesExactlyTheRangeAtEveryAlignmentAndLength) {
  std::vector<unsigned char> source(512);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<unsigned char>(i * 7 + 1);
  for (size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 200, 300}) {
    for (size_t to_at = 0; to_at < 16; ++to_at) {
      for (size_t from_at = 0; from_at < 16; from_at += 5) {
        std::vector<unsigned char> dest(n + 64, 0xab);
        StreamCopy(dest.data() + 16 + to_at, source.data() + from_at, n);
        for (size_t i = 0; i < dest.size(); ++i) {
          const bool inside = i >= 16 + to_at && i < 16 + to_at + n;
          const unsigned char want = inside ? source[from_at + i - 16 - to_at] : 0xab;
          ASSERT_EQ(dest[i], want)
              << "n=" << n << " to_at=" << to_at << " from_at=" << from_at << " byte " << i;
        }
      }
    }
  }
}

TEST(StreamCopy, CopiesMegabytes) {
  const size_t n = (size_t{3} << 20) + 13;
  std::vector<uint32_t> source(n / 4 + 1), dest(n / 4 + 1, 0);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint32_t>(i * 2654435761u);
  StreamCopy(reinterpret_cast<char*>(dest.data()) + 1, reinterpret_cast<char*>(source.data()) + 3,
             n - 4);
  const auto* s = reinterpret_cast<const unsigned char*>(source.data()) + 3;
  const auto* d = reinterpret_cast<const unsigned char*>(dest.data()) + 1;
  for (size_t i = 0; i < n - 4; ++i) ASSERT_EQ(d[i], s[i]) << "byte " << i;
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(dest.data())[0], 0);
}

TEST(StreamCopy, KnowsTheCacheSize) {
  EXPECT_GE(LastLevelCacheBytes(), size_t{64} << 10);
  EXPECT_LE(LastLevelCacheBytes(), size_t{4} << 30);
  EXPECT_EQ(LastLevelCacheBytes(), LastLevelCacheBytes());
}

TEST(StreamCopy, TakesSysfsAndCapsWhatTheCLibrarySays) {
  // sysfs names one instance: taken as it is, however large.
  EXPECT_EQ(ChooseLastLevelCacheBytes(size_t{96} << 20, size_t{508} << 20), size_t{96} << 20);
  EXPECT_EQ(ChooseLastLevelCacheBytes(size_t{1} << 20, 0), size_t{1} << 20);
  // Without it, sysconf's figure may be a whole package's (508 MB on a VM that hides the
  // topology): capped.
  EXPECT_EQ(ChooseLastLevelCacheBytes(0, size_t{508} << 20), kMaxSysconfCacheBytes);
  EXPECT_EQ(ChooseLastLevelCacheBytes(0, size_t{8} << 20), size_t{8} << 20);
  EXPECT_EQ(ChooseLastLevelCacheBytes(0, 0), kMaxSysconfCacheBytes);
}

}  // namespace
}  // namespace ps::common
