#include "common/rpc/grpc_status.h"

#include <string>

#include "gtest/gtest.h"

namespace ps::common {
namespace {

TEST(PeerMessage, KeepsValidTextAndReplacesWhatIsNot) {
  EXPECT_EQ(PeerMessage("no table 'emb\xc3\xa9' here"), "no table 'emb\xc3\xa9' here");
  EXPECT_EQ(PeerMessage("line\nnext\tcol\x7f"), "line next col ");
  // A stray continuation byte, a lead byte cut short, an overlong '/', a surrogate, a code
  // point past U+10FFFF: each invalid byte becomes '?'.
  EXPECT_EQ(PeerMessage("a\x80" "b"), "a?b");
  EXPECT_EQ(PeerMessage("a\xe2\x82"), "a??");
  EXPECT_EQ(PeerMessage("\xc0\xaf"), "??");
  EXPECT_EQ(PeerMessage("\xed\xa0\x80"), "???");
  EXPECT_EQ(PeerMessage("\xf4\x90\x80\x80"), "????");
  EXPECT_EQ(PeerMessage("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
}

TEST(PeerMessage, IsCappedAtACharacterAndSaysHowLongItWas) {
  std::string long_message = "\xff\xfe" + std::string(60000, 'x');
  std::string safe = PeerMessage(long_message);
  EXPECT_LE(safe.size(), kMaxPeerMessageBytes + 40);
  EXPECT_EQ(safe.substr(0, 3), "??x");
  EXPECT_NE(safe.find("(60002 bytes in all)"), std::string::npos);
  // A character is never cut in two: 3-byte characters up to the cap.
  std::string euros;
  for (int i = 0; i < 500; ++i) euros += "\xe2\x82\xac";
  safe = PeerMessage(euros);
  const size_t kept = safe.find(" ... (");
  ASSERT_NE(kept, std::string::npos);
  EXPECT_EQ(kept % 3, 0u);
  EXPECT_LE(kept, kMaxPeerMessageBytes);
}

TEST(PeerMessage, FromGrpcStatusMakesAPeersMessageSafe) {
  absl::Status s = FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down\xff\n"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "down? ");
}

}  // namespace
}  // namespace ps::common
