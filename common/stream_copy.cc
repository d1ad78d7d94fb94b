#include "common/stream_copy.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ps::common {

void StreamCopy(void* to, const void* from, size_t n) {
#if defined(__SSE2__)
  auto* d = static_cast<char*>(to);
  const auto* s = static_cast<const char*>(from);
  // The head up to the destination's first 16-byte boundary, and the tail, as memcpy.
  const size_t head = std::min(n, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, n - i);
  // The streamed stores are weakly ordered: make them visible before whatever publishes the
  // copy (a release store or a system call) runs.
  _mm_sfence();
#else
  std::memcpy(to, from, n);
#endif
}

namespace {

// The size in bytes of a cache as sysfs words it ("32768K"), 0 if it does not parse.
size_t ParseCacheSize(const std::string& text) {
  size_t n = 0, at = 0;
  while (at < text.size() && text[at] >= '0' && text[at] <= '9') {
    if (n > (size_t{1} << 40)) return 0;
    n = n * 10 + static_cast<size_t>(text[at++] - '0');
  }
  if (at == 0) return 0;
  if (at < text.size() && text[at] == 'K') return n << 10;
  if (at < text.size() && text[at] == 'M') return n << 20;
  return n;
}

std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

size_t ChooseLastLevelCacheBytes(size_t sysfs_bytes, size_t sysconf_bytes) {
  if (sysfs_bytes > 0) return sysfs_bytes;
  if (sysconf_bytes > 0) return std::min(sysconf_bytes, kMaxSysconfCacheBytes);
  return kMaxSysconfCacheBytes;
}

size_t LastLevelCacheBytes() {
  static const size_t bytes = [] {
    // The kernel's view first: one instance of the highest level, as the cores of this CPU
    // share it.
    size_t best_level = 0, size = 0;
    for (int i = 0; i < 16; ++i) {
      const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
      const std::string level = ReadLine(dir + "/level");
      if (level.empty()) break;
      if (ReadLine(dir + "/type") == "Instruction") continue;
      const size_t l = ParseCacheSize(level);
      const size_t s = ParseCacheSize(ReadLine(dir + "/size"));
      if (l >= best_level && s > 0) {
        best_level = l;
        size = s;
      }
    }
    size_t sysconf_bytes = 0;
    for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
      const long n = sysconf(name);
      if (n > 0) {
        sysconf_bytes = static_cast<size_t>(n);
        break;
      }
    }
    return ChooseLastLevelCacheBytes(size, sysconf_bytes);
  }();
  return bytes;
}

}  // namespace ps::common
