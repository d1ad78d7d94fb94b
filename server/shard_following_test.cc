// Pushes whose payload follows their call (PushView::following, common/rpc/following_payload.h):
// the check reads each run of the payload only once the worker's count covers it, the update
// lands as that of a payload that was all there, and a payload that does not come in time is
// refused with nothing changed.
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/following_payload.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "server/shard_testing.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using shard_testing::AllBlocks;
using shard_testing::FirstWorkerPush;
using shard_testing::MakeConfig;
using shard_testing::MakeShard;
using shard_testing::ReadBlocks;
using shard_testing::Rejections;
using shard_testing::WholeTable;
using ::testing::HasSubstr;

// "w" of 2^17 values (512 KB: 8 runs of kFollowingChunkBytes), SGD; more values than the one
// pass takes, so the finite check reads the payload before the update.
constexpr int kValues = 1 << 17;

std::vector<float> Gradient() {
  std::vector<float> g(kValues);
  for (int i = 0; i < kValues; ++i) g[i] = 0.001f * static_cast<float>(i % 97) - 0.04f;
  return g;
}

// The payload region as a worker's segment would hold it before the copy: NaNs, which a check
// that read ahead of the count would refuse.
std::vector<float> Unwritten() {
  std::vector<float> region(kValues);
  std::memset(region.data(), 0xff, region.size() * sizeof(float));
  return region;
}

// A shard whose large pushes are checked and applied on two threads (ShardOptions), or not.
std::unique_ptr<Shard> ShardOf(const JobConfig& config, bool parallel) {
  if (!parallel) return MakeShard(config);
  ShardOptions options;
  options.apply_threads = 2;
  options.parallel_apply_values = 1024;
  auto shard = Shard::Create(config, options);
  CHECK_OK(shard.status());
  return *std::move(shard);
}

// A push of every block of "w" from `region`, its payload following as the service makes one
// (PushTable::payload_may_change), the count in `written`, waited for `wait` at most. Neither
// copied nor moved: the push's views point into it.
struct FollowingPush {
  FollowingPush(const Shard& shard, std::vector<float>& region, std::atomic<uint64_t>* written,
                absl::Duration wait)
      : following(written, reinterpret_cast<const char*>(region.data()),
                  region.size() * sizeof(float), absl::Now() + wait),
        table(WholeTable(shard, region)) {
    table.payload_may_change = true;
    push = FirstWorkerPush(shard, &table);
    push.following = &following;
  }
  FollowingPush(const FollowingPush&) = delete;
  FollowingPush& operator=(const FollowingPush&) = delete;

  common::FollowingPayload following;
  PushTable table;
  PushView push;
};

// With helper threads the push would be checked in parallel were it all there: a following
// payload still being written is counted as it comes on the calling thread instead.
class ShardFollowingTest : public ::testing::TestWithParam<bool> {};

TEST_P(ShardFollowingTest, TheCheckReadsEachRunOnlyOnceItIsWrittenAndTheUpdateMatches) {
  static_assert(kValues > kOnePassMaxValues);
  auto shard = ShardOf(MakeConfig("kind: SGD learning_rate: 0.5", 1, kValues), GetParam());
  auto reference = MakeShard(MakeConfig("kind: SGD learning_rate: 0.5", 1, kValues));
  const std::vector<float> grad = Gradient();
  std::vector<float> region = Unwritten();
  std::atomic<uint64_t> written{0};
  FollowingPush f(*shard, region, &written, absl::Seconds(60));
  // The worker: one run at a time, a pause before each count.
  std::thread worker([&] {
    const size_t bytes = grad.size() * sizeof(float);
    for (size_t at = 0; at < bytes; at += common::kFollowingChunkBytes) {
      absl::SleepFor(absl::Milliseconds(1));
      const size_t n = std::min(common::kFollowingChunkBytes, bytes - at);
      std::memcpy(reinterpret_cast<char*>(region.data()) + at,
                  reinterpret_cast<const char*>(grad.data()) + at, n);
      written.store(at + n, std::memory_order_release);
    }
  });
  const absl::Status status = shard->Push(f.push).status();
  worker.join();
  ASSERT_THAT(status, IsOk());
  EXPECT_TRUE(f.following.complete());
  const PushTable whole = WholeTable(*reference, grad);
  ASSERT_THAT(reference->Push(FirstWorkerPush(*reference, &whole)).status(), IsOk());
  EXPECT_EQ(ReadBlocks(*shard, "w", AllBlocks(*shard)),
            ReadBlocks(*reference, "w", AllBlocks(*reference)));
  EXPECT_EQ(Rejections(*shard), "");
}

TEST(ShardFollowing, APayloadThatDoesNotComeInTimeIsRefusedAndChangesNothing) {
  auto shard = MakeShard(MakeConfig("kind: SGD learning_rate: 0.5", 1, kValues));
  const std::vector<float> before = ReadBlocks(*shard, "w", AllBlocks(*shard));
  const std::vector<float> grad = Gradient();
  std::vector<float> region = grad;  // all of it written, three runs of it counted
  std::atomic<uint64_t> written{3 * common::kFollowingChunkBytes};
  FollowingPush f(*shard, region, &written, absl::Milliseconds(30));
  EXPECT_THAT(shard->Push(f.push).status(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                                     HasSubstr("196608 of 524288 bytes there")));
  EXPECT_EQ(Rejections(*shard), "payload_late=1 ");
  EXPECT_EQ(ReadBlocks(*shard, "w", AllBlocks(*shard)), before);
  EXPECT_EQ(shard->updates_applied(), 0u);
}

INSTANTIATE_TEST_SUITE_P(OneThreadAndTwo, ShardFollowingTest, ::testing::Bool());

// Payloads the check does not read in place (16-bit values, decoded first; a clip_norm
// table's, gathered to be summed; the one pass of a small push) are waited for whole before
// they are read.
TEST(ShardFollowing, PayloadsReadBeforeTheCheckAreWaitedForWhole) {
  struct Case {
    int values;
    const char* optimizer;
  };
  for (const Case& c : {Case{kValues, "kind: SGD learning_rate: 0.5"},
                        Case{kValues, "kind: SGD learning_rate: 0.5 clip_norm: 1"},
                        Case{64, "kind: SGD learning_rate: 0.5"}}) {
    const int values = c.values;
    SCOPED_TRACE(absl::StrCat(values, " values, ", c.optimizer));
    auto shard = MakeShard(MakeConfig(c.optimizer, 1, values));
    const std::vector<float> before = ReadBlocks(*shard, "w", AllBlocks(*shard));
    std::vector<float> grad(values, 0.25f);
    std::vector<uint16_t> half(values);  // bf16 of 0.25: 0x3e80
    for (uint16_t& h : half) h = 0x3e80;
    const bool bf16 =
        values == kValues && absl::string_view(c.optimizer).find("clip") == absl::string_view::npos;
    std::atomic<uint64_t> written{0};
    const char* begin = bf16 ? reinterpret_cast<const char*>(half.data())
                             : reinterpret_cast<const char*>(grad.data());
    const size_t bytes = bf16 ? half.size() * 2 : grad.size() * 4;
    common::FollowingPayload following(&written, begin, bytes,
                                       absl::Now() + absl::Milliseconds(30));
    PushTable table = WholeTable(*shard, grad);
    if (bf16) {
      table.encoding = ENCODING_BF16;
      table.blocks.clear();
      const common::TableInfo& info = *shard->partitioner().FindTable("w");
      for (uint32_t blk = 0; blk < info.num_blocks; ++blk) {
        auto [b, e] = shard->partitioner().BlockRange(info, blk);
        table.blocks.push_back({blk, absl::string_view(begin + 2 * b, 2 * (e - b))});
      }
    }
    table.payload_may_change = true;
    PushView push = FirstWorkerPush(*shard, &table);
    push.following = &following;
    EXPECT_THAT(shard->Push(push).status(), StatusIs(absl::StatusCode::kDeadlineExceeded));
    EXPECT_EQ(ReadBlocks(*shard, "w", AllBlocks(*shard)), before);
  }
}

}  // namespace
}  // namespace ps::server
