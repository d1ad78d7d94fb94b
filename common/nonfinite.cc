#include "common/nonfinite.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace ps::common {
namespace {

// Exponent bits of a float32: all set <=> NaN or +/-inf.
constexpr uint32_t kFloatInf = 0x7f800000u;

// The vector loops below count 16 (SSE2) or 32 (AVX2) values per iteration into four
// independent lane counters: one counter would chain every iteration on the previous one's
// add (one iteration per cycle), while four let the core issue two loads per cycle. Each
// chunk of at most 2^20 values is summed before a lane (a 32-bit counter) could overflow.
constexpr size_t kCountChunk = size_t{1} << 20;

// The AVX2 loop asks for the two cache lines 4 KB ahead of the ones it reads, while they lie
// inside the payload. A pushed
// gradient usually lies in lines that another core has just written (the worker's, through a
// shared-memory segment, or the gRPC thread's), and the hardware prefetchers stop at each 4 KB
// page; the loop alone then waits on one transfer after another. On the 2-vCPU development VM
// of docs/lab/2026-12-05-prefetch-check.md a 1 MB gradient written by the other core was
// counted in 47-48 us with the prefetches against 55-58 us without.
constexpr size_t kPrefetchAheadFloats = 1024;

#if defined(__SSE2__)
// Counts the non-finite values of data[0, *done) and sets *done (a multiple of 16).
uint64_t CountNonFiniteSse2(const unsigned char* data, size_t n, size_t* done) {
  const __m128i mask = _mm_set1_epi32(static_cast<int>(kFloatInf));
  auto hits = [&mask](const unsigned char* p) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm_cmpeq_epi32(_mm_and_si128(bits, mask), mask);  // -1 per non-finite lane
  };
  uint64_t count = 0;
  size_t i = 0;
  while (n - i >= 16) {
    const size_t end = i + std::min((n - i) & ~size_t{15}, kCountChunk);
    __m128i c0 = _mm_setzero_si128(), c1 = c0, c2 = c0, c3 = c0;
    for (; i < end; i += 16) {
      c0 = _mm_sub_epi32(c0, hits(data + 4 * i));
      c1 = _mm_sub_epi32(c1, hits(data + 4 * (i + 4)));
      c2 = _mm_sub_epi32(c2, hits(data + 4 * (i + 8)));
      c3 = _mm_sub_epi32(c3, hits(data + 4 * (i + 12)));
    }
    alignas(16) uint32_t lanes[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes),
                    _mm_add_epi32(_mm_add_epi32(c0, c1), _mm_add_epi32(c2, c3)));
    count += uint64_t{lanes[0]} + lanes[1] + lanes[2] + lanes[3];
  }
  *done = i;
  return count;
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
// As CountNonFiniteSse2 with 256-bit lanes (*done a multiple of 32); only called where the
// CPU has AVX2 (picked at run time: the build targets x86-64-v2). Plain integer compares, so
// the count is the same on either path.
__attribute__((target("avx2"))) uint64_t CountNonFiniteAvx2(const unsigned char* data, size_t n,
                                                            size_t* done) {
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(kFloatInf));
#define PS_HITS_AVX2(p) \
  _mm256_cmpeq_epi32(   \
      _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), mask), mask)
  uint64_t count = 0;
  size_t i = 0;
  // Below this value of i, both lines asked for (32 values from kPrefetchAheadFloats ahead)
  // lie inside the payload; from it on, the loop asks for none.
  const size_t prefetch_until = n > kPrefetchAheadFloats + 32 ? n - kPrefetchAheadFloats - 32 : 0;
  while (n - i >= 32) {
    const size_t end = i + std::min((n - i) & ~size_t{31}, kCountChunk);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
    for (; i < end; i += 32) {
      if (i < prefetch_until) {
        const char* ahead = reinterpret_cast<const char*>(data + 4 * (i + kPrefetchAheadFloats));
        _mm_prefetch(ahead, _MM_HINT_T0);
        _mm_prefetch(ahead + 64, _MM_HINT_T0);
      }
      c0 = _mm256_sub_epi32(c0, PS_HITS_AVX2(data + 4 * i));
      c1 = _mm256_sub_epi32(c1, PS_HITS_AVX2(data + 4 * (i + 8)));
      c2 = _mm256_sub_epi32(c2, PS_HITS_AVX2(data + 4 * (i + 16)));
      c3 = _mm256_sub_epi32(c3, PS_HITS_AVX2(data + 4 * (i + 24)));
    }
    alignas(32) uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                       _mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)));
    for (uint32_t lane : lanes) count += lane;
  }
#undef PS_HITS_AVX2
  *done = i;
  return count;
}

bool HasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
#endif

}  // namespace

size_t CountNonFinite(absl::Span<const float> values) {
  return CountNonFinite(values.data(), values.size());
}

size_t CountNonFinite(const void* bytes, size_t n) {
  // Exponent all ones <=> NaN or inf. GCC's -O2 does not vectorize the scalar loop, and
  // servers run this over every pushed gradient before applying any of it (a 1 MB push: 8% of
  // the server's CPU with a one-counter SSE2 loop), so x86 gets explicit vector loops. Every
  // load is unaligned: the values may lie where a network buffer put them.
  const auto* data = static_cast<const unsigned char*>(bytes);
  size_t i = 0;
  uint64_t count = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = HasAvx2();
  if (avx2) count = CountNonFiniteAvx2(data, n, &i);
#endif
#if defined(__SSE2__)
  size_t done = 0;
  count += CountNonFiniteSse2(data + 4 * i, n - i, &done);
  i += done;
#endif
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + 4 * i, sizeof(bits));
    count += (bits & kFloatInf) == kFloatInf;
  }
  return static_cast<size_t>(count);
}

}  // namespace ps::common
