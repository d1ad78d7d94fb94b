#include "server/row_index.h"

#include <cstdint>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

TEST(RowIndexTest, EmptyFindsNothing) {
  RowIndex index;
  EXPECT_EQ(index.Find(0), RowIndex::kAbsent);
  EXPECT_EQ(index.Find(~uint64_t{0}), RowIndex::kAbsent);
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.capacity(), 0u);
  index.Prefetch(7);  // no entries yet: must not touch memory
}

TEST(RowIndexTest, ExtremeKeysAndSlots) {
  RowIndex index;
  index.Insert(0, 0);
  index.Insert(~uint64_t{0}, RowIndex::kAbsent - 1);
  EXPECT_EQ(index.Find(0), 0u);
  EXPECT_EQ(index.Find(~uint64_t{0}), RowIndex::kAbsent - 1);
  EXPECT_EQ(index.Find(1), RowIndex::kAbsent);
  index.Update(0, 5);
  EXPECT_EQ(index.Find(0), 5u);
  index.Erase(~uint64_t{0});
  EXPECT_FALSE(index.Contains(~uint64_t{0}));
  EXPECT_TRUE(index.Contains(0));
  EXPECT_EQ(index.size(), 1u);
}

TEST(RowIndexTest, LoadStaysAtMostFiveEighths) {
  RowIndex index;
  for (uint32_t i = 0; i < 100000; ++i) {
    index.Insert(uint64_t{i} * 1000003, i);
    ASSERT_LE(index.size() * 8, index.capacity() * 5) << "after " << i + 1 << " inserts";
  }
  for (uint32_t i = 0; i < 100000; ++i) ASSERT_EQ(index.Find(uint64_t{i} * 1000003), i);
}

// After a spike (a large push's rows, then evicted) the entries shrink back, to at most about
// twice what the keys left need, and every key left is still found.
TEST(RowIndexTest, ShrinksWhenMostKeysAreErased) {
  RowIndex index;
  for (uint32_t i = 0; i < 100000; ++i) index.Insert(uint64_t{i} * 1000003, i);
  const size_t peak = index.capacity();
  for (uint32_t i = 100; i < 100000; ++i) index.Erase(uint64_t{i} * 1000003);
  EXPECT_EQ(index.size(), 100u);
  EXPECT_LE(index.capacity(), 2 * RowIndex::CapacityFor(100));
  EXPECT_LT(index.capacity() * 100, peak);
  for (uint32_t i = 0; i < 100; ++i) ASSERT_EQ(index.Find(uint64_t{i} * 1000003), i);
  for (uint32_t i = 100; i < 1000; ++i) ASSERT_FALSE(index.Contains(uint64_t{i} * 1000003));
  // Grown again, the same.
  for (uint32_t i = 100; i < 5000; ++i) index.Insert(uint64_t{i} * 1000003, i);
  for (uint32_t i = 0; i < 5000; ++i) ASSERT_EQ(index.Find(uint64_t{i} * 1000003), i);
  EXPECT_LE(index.size() * 8, index.capacity() * 5);
}

// Random inserts, updates and erases (the eviction path erases a lot) against a reference
// map: every key present is found with its slot, every key erased is gone. Dense keys from a
// small range make long probe runs and many backward shifts.
TEST(RowIndexTest, MatchesAReferenceMapUnderChurn) {
  for (uint64_t range : {uint64_t{64}, uint64_t{5000}, uint64_t{1} << 40}) {
    RowIndex index;
    absl::flat_hash_map<uint64_t, uint32_t> ref;
    std::mt19937_64 rng(range);
    std::vector<uint64_t> present;
    for (int op = 0; op < 200000; ++op) {
      const int what = static_cast<int>(rng() % 3);
      if (what == 0 || present.empty()) {
        const uint64_t key = rng() % range;
        if (ref.contains(key)) continue;
        const uint32_t slot = static_cast<uint32_t>(rng() % 1000000);
        index.Insert(key, slot);
        ref[key] = slot;
        present.push_back(key);
      } else if (what == 1) {
        const uint64_t key = present[rng() % present.size()];
        const uint32_t slot = static_cast<uint32_t>(rng() % 1000000);
        index.Update(key, slot);
        ref[key] = slot;
      } else {
        const size_t at = rng() % present.size();
        const uint64_t key = present[at];
        present[at] = present.back();
        present.pop_back();
        index.Erase(key);
        ref.erase(key);
        ASSERT_EQ(index.Find(key), RowIndex::kAbsent) << "erased key " << key;
      }
      ASSERT_EQ(index.size(), ref.size());
    }
    for (const auto& [key, slot] : ref) ASSERT_EQ(index.Find(key), slot) << "key " << key;
    for (uint64_t k = 0; k < std::min<uint64_t>(range, 10000); ++k) {
      ASSERT_EQ(index.Contains(k), ref.contains(k)) << "key " << k;
    }
  }
}

}  // namespace
}  // namespace ps::server
