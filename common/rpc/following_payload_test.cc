#include "common/rpc/following_payload.h"

#include <sched.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

using ::testing::HasSubstr;

// A payload of `n` bytes, each its index's low byte plus `salt`.
std::string Bytes(size_t n, int salt) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i + salt);
  return s;
}

TEST(CopyFollowingTest, CopiesEveryPieceInOrderAndCountsTheWhole) {
  // Pieces that do not end on chunk boundaries, plain and streamed.
  const std::vector<std::string> pieces = {Bytes(100'000, 1), Bytes(7, 2), Bytes(70'001, 3)};
  const std::vector<absl::string_view> views(pieces.begin(), pieces.end());
  for (const bool stream : {false, true}) {
    std::string to(170'008, '\xff');
    std::atomic<uint64_t> written{0};
    CopyFollowing(views, to.data(), stream, &written);
    EXPECT_EQ(written.load(), 170'008u);
    EXPECT_EQ(to, pieces[0] + pieces[1] + pieces[2]) << "stream " << stream;
  }
}

TEST(CopyFollowingTest, RaisesTheCountChunkByChunk) {
  // A reader that sees a count sees every byte below it: it checks them as they come.
  const std::string from = Bytes(10 * kFollowingChunkBytes + 123, 5);
  std::string to(from.size(), '\0');
  std::atomic<uint64_t> written{0};
  std::atomic<bool> wrong{false};
  std::vector<uint64_t> counts;
  std::thread reader([&] {
    uint64_t seen = 0;
    while (seen < from.size()) {
      const uint64_t now = written.load(std::memory_order_acquire);
      if (now == seen) continue;
      if (std::memcmp(to.data(), from.data(), now) != 0) wrong = true;
      counts.push_back(now);
      seen = now;
    }
  });
  const absl::string_view piece(from);
  CopyFollowing(absl::MakeConstSpan(&piece, 1), to.data(), /*stream=*/false, &written);
  reader.join();
  EXPECT_FALSE(wrong.load());
  ASSERT_FALSE(counts.empty());
  EXPECT_EQ(counts.back(), from.size());
  for (size_t i = 0; i + 1 < counts.size(); ++i) {
    EXPECT_EQ(counts[i] % kFollowingChunkBytes, 0u) << counts[i];
  }
}

TEST(FollowingPayloadTest, WaitsForTheBytesItNeedsOnly) {
  std::string payload(1 << 20, '\0');
  std::atomic<uint64_t> written{0};
  FollowingPayload f(&written, payload.data(), payload.size(), absl::Now() + absl::Seconds(60));
  EXPECT_TRUE(f.Holds(payload.data(), payload.size()));
  EXPECT_TRUE(f.Holds(payload.data() + payload.size(), 0));
  EXPECT_FALSE(f.Holds(payload.data() + 1, payload.size()));
  EXPECT_FALSE(f.Holds(payload.data() - 4, 4));
  EXPECT_TRUE(f.WaitUntil(payload.data()).ok());  // nothing needed
  EXPECT_FALSE(f.complete());
  written.store(4096);
  EXPECT_TRUE(f.WaitUntil(payload.data() + 4096).ok());
  // The rest comes from another thread, later.
  const absl::Time start = absl::Now();
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(5));
    written.store(payload.size(), std::memory_order_release);
  });
  EXPECT_TRUE(f.WaitAll().ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(5));
  EXPECT_TRUE(f.complete());
  EXPECT_GT(f.waited(), absl::ZeroDuration());
  EXPECT_LE(f.waited(), absl::Now() - start);
  writer.join();
}

// What the waits cost the waiting thread (waited_cpu, taken out of what a server says serving
// a call cost): on a core of its own about their time; on a core it shares with a busy thread,
// which its yields hand the core to, far less.
TEST(FollowingPayloadTest, CountsTheCpuItsWaitsTook) {
  std::string payload(1 << 20, '\0');
  for (const bool shared_core : {false, true}) {
    SCOPED_TRACE(shared_core ? "a core shared with a busy thread" : "a core of its own");
    std::atomic<uint64_t> written{0};
    std::atomic<bool> stop{false};
    cpu_set_t one, all;
    ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &all)) {
        CPU_SET(c, &one);
        break;
      }
    }
    std::thread busy;
    if (shared_core) {
      ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
      busy = std::thread([&] {
        sched_setaffinity(0, sizeof(one), &one);
        while (!stop.load(std::memory_order_relaxed)) {
        }
      });
    }
    FollowingPayload f(&written, payload.data(), payload.size(), absl::Now() + absl::Seconds(60));
    // The writer's 40 ms start once this thread is about to wait, however late it gets there.
    std::atomic<bool> waiting{false};
    std::thread writer([&] {
      while (!waiting.load()) absl::SleepFor(absl::Microseconds(100));
      absl::SleepFor(absl::Milliseconds(40));
      written.store(payload.size(), std::memory_order_release);
    });
    waiting.store(true);
    EXPECT_TRUE(f.WaitAll().ok());
    writer.join();
    stop.store(true);
    if (busy.joinable()) busy.join();
    ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
    EXPECT_GE(f.waited(), absl::Milliseconds(20));
    EXPECT_GT(f.waited_cpu(), absl::ZeroDuration());
    EXPECT_LE(f.waited_cpu(), f.waited() + absl::Milliseconds(1));
    if (shared_core) {
      EXPECT_LT(f.waited_cpu(), f.waited() / 2);
    }
  }
}

TEST(FollowingPayloadTest, GivesUpOnACountThatNeverComes) {
  std::string payload(1 << 20, '\0');
  std::atomic<uint64_t> written{65536};
  const absl::Time start = absl::Now();
  FollowingPayload f(&written, payload.data(), payload.size(), start + absl::Milliseconds(30));
  const absl::Status s = f.WaitAll();
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("65536 of 1048576 bytes there"));
  EXPECT_GE(took, absl::Milliseconds(30));
  EXPECT_FALSE(f.complete());
  // What was there is still there.
  EXPECT_TRUE(f.WaitUntil(payload.data() + 65536).ok());
}

TEST(FollowingPayloadTest, ACountPastTheEndMeansComplete) {
  std::string payload(1000, '\0');
  std::atomic<uint64_t> written{~uint64_t{0}};
  FollowingPayload f(&written, payload.data(), payload.size(), absl::Now());
  EXPECT_TRUE(f.WaitAll().ok());
  EXPECT_TRUE(f.complete());
}

TEST(FollowingPayloadTest, MaxWaitGrowsWithTheBytes) {
  EXPECT_EQ(FollowingPayload::MaxWait(0), absl::Milliseconds(100));
  EXPECT_EQ(FollowingPayload::MaxWait(kMaxFollowingBytes),
            absl::Milliseconds(100) + absl::Microseconds(209715));
}

}  // namespace
}  // namespace ps::common
