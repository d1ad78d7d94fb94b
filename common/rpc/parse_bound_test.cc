#include "common/rpc/parse_bound.h"

#include <cstdint>
#include <memory>
#include <string>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"

namespace ps::common {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::testing::HasSubstr;

// An honest push: the values are bytes, so parsed it takes about its wire size.
TEST(ParseBound, AnHonestPushTakesAboutItsWireSize) {
  PushRequest push;
  push.mutable_header()->set_worker_id(1);
  TableValues* t = push.add_tables();
  t->set_table("emb");
  for (uint64_t k = 0; k < 4; ++k) t->add_keys(k);
  t->set_rows(std::string(1 << 20, 'x'));
  const std::string bytes = push.SerializeAsString();
  absl::StatusOr<size_t> parsed = ParsedBytes(bytes, *PushRequest::descriptor());
  ASSERT_THAT(parsed.status(), IsOk());
  EXPECT_GE(*parsed, bytes.size());
  EXPECT_LT(*parsed, bytes.size() + 4096);
  PushRequest back;
  ASSERT_THAT(ParseWithin(bytes, 2 << 20, &back), IsOk());
  EXPECT_EQ(back.tables(0).rows().size(), 1u << 20);
  EXPECT_GE(*parsed, back.SpaceUsedLong() * 9 / 10);  // the estimate is what the parse took
}

// Empty repeated entries: two bytes each on the wire, an object each parsed. The estimate sees
// that from the wire form, and ParseWithin refuses before making any.
TEST(ParseBound, EmptyEntriesAreCountedAsTheObjectsTheyBecome) {
  std::string bytes;
  for (int i = 0; i < 100000; ++i) bytes += std::string("\x12\x00", 2);  // tables {}
  absl::StatusOr<size_t> parsed = ParsedBytes(bytes, *PullRequest::descriptor());
  ASSERT_THAT(parsed.status(), IsOk());
  PullRequest whole;
  ASSERT_TRUE(whole.ParseFromString(bytes));
  EXPECT_GE(*parsed, whole.SpaceUsedLong() * 9 / 10);
  EXPECT_GT(*parsed, 20 * bytes.size());
  PullRequest request;
  EXPECT_THAT(ParseWithin(bytes, 10 * bytes.size(), &request),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("bytes parsed")));
  EXPECT_EQ(request.tables_size(), 0);
  EXPECT_THAT(ParseWithin(bytes, *parsed, &request), IsOk());
  EXPECT_EQ(request.tables_size(), 100000);
}

// Packed varints: counted by element, as the RepeatedField they fill; unknown fields too.
TEST(ParseBound, PackedVarintsAndUnknownFieldsAreCounted) {
  PullRequest pull;
  TablePullRequest* t = pull.add_tables();
  t->set_table("w");
  for (uint32_t b = 0; b < 100000; ++b) t->add_block_ids(b % 100);  // a byte each on the wire
  const std::string bytes = pull.SerializeAsString();
  absl::StatusOr<size_t> parsed = ParsedBytes(bytes, *PullRequest::descriptor());
  ASSERT_THAT(parsed.status(), IsOk());
  EXPECT_GE(*parsed, 4 * 100000u);
  PullRequest whole;
  ASSERT_TRUE(whole.ParseFromString(bytes));
  EXPECT_GE(*parsed, whole.SpaceUsedLong() * 9 / 10);
  // Field 999, varint: unknown to PullRequest, kept as an unknown field each.
  std::string unknown;
  for (int i = 0; i < 10000; ++i) unknown += std::string("\xb8\x3e\x01", 3);
  absl::StatusOr<size_t> kept = ParsedBytes(unknown, *PullRequest::descriptor());
  ASSERT_THAT(kept.status(), IsOk());
  EXPECT_GT(*kept, 5 * unknown.size());
}

// A field sent with another wire type than its own is kept as an unknown field by the parser:
// counted as one. Read from pieces, the same.
TEST(ParseBound, FieldsOfTheWrongWireTypeAreCountedAsUnknownFields) {
  std::string bytes;
  for (int i = 0; i < 100000; ++i) bytes.append("\x08\x00", 2);  // header (a message) = 0
  PullRequest whole;
  ASSERT_TRUE(whole.ParseFromString(bytes));
  absl::StatusOr<size_t> parsed = ParsedBytes(bytes, *PullRequest::descriptor());
  ASSERT_THAT(parsed.status(), IsOk());
  EXPECT_GE(*parsed, whole.SpaceUsedLong() * 9 / 10);
  PullRequest request;
  auto pieces = [&bytes] {
    // 1 KB pieces, as a message's slices come.
    return std::make_unique<google::protobuf::io::ArrayInputStream>(
        bytes.data(), static_cast<int>(bytes.size()), 1024);
  };
  EXPECT_THAT(ParseWithin(pieces, bytes.size(), 5 * bytes.size(), &request),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(ParseWithin(pieces, bytes.size(), *parsed, &request), IsOk());
  EXPECT_EQ(request.SpaceUsedLong(), whole.SpaceUsedLong());
}

TEST(ParseBound, BytesThatAreNoMessageAreRefused) {
  PullRequest request;
  // A length past the end; a tag of field 0; a group.
  EXPECT_THAT(ParseWithin(std::string("\x12\x05\x00", 3), 1 << 20, &request),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseWithin(std::string("\x00\x00", 2), 1 << 20, &request),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // (A group the walk refuses; small enough to need no walk, it goes to protobuf's parser,
  // which keeps it as an unknown field.)
  EXPECT_THAT(ParsedBytes(std::string("\x13\x14", 2), *PullRequest::descriptor()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseWithin("", 1 << 20, &request), IsOk());
}

}  // namespace
}  // namespace ps::common
