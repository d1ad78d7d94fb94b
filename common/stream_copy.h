// Copying a large buffer without reading its destination first: non-temporal stores. A plain
// copy's stores read each destination line into the cache before writing it, and then evict
// lines the reader of the destination will not find there anyway when the copy is larger than
// the cache. For copies of many megabytes (a large push into its shared-memory region) that is
// a third of the memory traffic of the copy. glibc's memcpy switches to such stores only from
// a threshold set by the cache size (hundreds of megabytes on some hosts), per call.
//
// They also pay, from far smaller sizes, for bytes written for another process to read next
// (a push's payload in shared memory, a pull's answer there): plain stores leave the lines
// modified in the writer's core, and the reader then takes each one from that core, while the
// writer of the next call must first take back every line the reader holds. Where the two
// cores do not share a cache (two dies of a server CPU; a VM's vCPUs placed on them by the
// host), that traffic is slower than memory itself. A 1 MB buffer handed between two threads
// on the 2-vCPU development VM took 135-200 us a round with plain stores while its vCPUs
// shared a cache and 470-640 us while they did not; 70-90 us with non-temporal stores either
// way (docs/lab/2026-12-03-cross-core-handoff.md).
#ifndef PS_COMMON_STREAM_COPY_H_
#define PS_COMMON_STREAM_COPY_H_

#include <cstddef>

namespace ps::common {

// memcpy(to, from, n) with non-temporal stores where the CPU has them (SSE2 on x86-64); a
// plain memcpy elsewhere. The buffers must not overlap. For copies much larger than the
// cache: the destination is left out of the cache.
void StreamCopy(void* to, const void* from, size_t n);

// The size of one instance of this host's last-level cache, read once per process: sysfs's,
// else the C library's (sysconf) up to kMaxSysconfCacheBytes, else kMaxSysconfCacheBytes.
size_t LastLevelCacheBytes();

// The most LastLevelCacheBytes takes from sysconf. The C library reads CPUID, which gives one
// instance's size only with the cache topology (AMD's leaf 0x8000001D, Intel's leaf 4); where
// a hypervisor hides it, as where sysfs has no cache directory, the size CPUID reports is the
// package's: 320 MB on one development VM (EPYC, 32 MB per core complex in sysfs), 508 MB on
// another (EPYC family 26, no sysfs cache directory). Taken at face value it meant that no copy
// ever streamed there. 32 MB is one core complex's L3 on AMD's server parts since Zen 3; a
// host whose one cache is larger and that hides it streams some copies that would have fit.
inline constexpr size_t kMaxSysconfCacheBytes = size_t{32} << 20;

// LastLevelCacheBytes's choice from what sysfs and sysconf said (0: nothing).
size_t ChooseLastLevelCacheBytes(size_t sysfs_bytes, size_t sysconf_bytes);

// A buffer of more than this many bytes written for another process to read next may be
// streamed (common/rpc/handoff_chooser.h, GrpcStoreOptions::handoff). Up to 16 KB,
// plain stores were as fast or faster on the development VM either way.
inline constexpr size_t kHandoffStreamBytes = size_t{32} << 10;

}  // namespace ps::common

#endif  // PS_COMMON_STREAM_COPY_H_
