#include "common/rpc/grpc_status.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace ps::common {
namespace {

// The length of the valid UTF-8 character at the start of `s`, 0 if none starts there
// (overlong forms, surrogates and code points past U+10FFFF are not valid).
size_t CharLength(absl::string_view s) {
  const auto byte = [&s](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b = byte(0);
  if (b < 0x80) return 1;
  size_t n;
  uint8_t low = 0x80, high = 0xBF;  // the second byte's range
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) low = 0xA0;
    if (b == 0xED) high = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) low = 0x90;
    if (b == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n || byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

std::string PeerMessage(absl::string_view message) {
  std::string out;
  out.reserve(std::min(message.size(), kMaxPeerMessageBytes));
  size_t at = 0;
  while (at < message.size()) {
    const size_t n = CharLength(message.substr(at));
    if (out.size() + std::max<size_t>(n, 1) > kMaxPeerMessageBytes) {
      absl::StrAppend(&out, " ... (", message.size(), " bytes in all)");
      break;
    }
    const uint8_t b = static_cast<uint8_t>(message[at]);
    if (n == 0) {
      out.push_back('?');
      ++at;
    } else if (n == 1 && (b < 0x20 || b == 0x7F)) {
      out.push_back(' ');
      ++at;
    } else {
      out.append(message.data() + at, n);
      at += n;
    }
  }
  return out;
}

}  // namespace ps::common
