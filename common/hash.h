// Deterministic, process-independent 64-bit hashing.
//
// Unlike absl::Hash (seeded per process on purpose), every function here returns the same
// value in every process, on every host and in every build. The values are part of the
// on-disk and wire contract: the Partitioner maps sparse keys to servers with Mix64, the
// layout fingerprint that servers and workers compare is built from Fingerprint64 and
// HashCombine, and table initialization (common/initializer.h) draws its random numbers from
// them. Changing any constant or step below silently re-shards every sparse table, changes
// every layout fingerprint and every initial value, and makes existing checkpoints unreadable.
// NEVER CHANGE THESE FUNCTIONS; add a new function (e.g. Fingerprint64V2) instead.
//
// None of these are cryptographic; do not use them where an adversary picks the input to
// cause collisions.
#ifndef PS_COMMON_HASH_H_
#define PS_COMMON_HASH_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace ps::common {

// The splitmix64 finalizer (Steele, Lea, Flood 2014; constants by Stafford, "Mix13"):
// a bijection on uint64_t with full avalanche. Mix64(0) == 0.
constexpr uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// 64-bit FNV-1a over the bytes of `data`, followed by Mix64 to spread FNV's weak low bits.
// Fingerprint64("") == 0xf52a15e9a9b5e89b.
constexpr uint64_t Fingerprint64(absl::string_view data) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64 offset basis.
  for (char c : data) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;  // FNV-1a 64 prime.
  }
  return Mix64(h);
}

// Combines a running hash `seed` with `value`; order-dependent (HashCombine(a, b) differs
// from HashCombine(b, a)), so a sequence hashes as a fold: h = HashCombine(h, v_i).
constexpr uint64_t HashCombine(uint64_t seed, uint64_t value) {
  return Mix64(seed ^ (value + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2)));
}

}  // namespace ps::common

#endif  // PS_COMMON_HASH_H_
