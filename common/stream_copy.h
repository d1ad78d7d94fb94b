// Copying a large buffer without reading its destination first: non-temporal stores. A plain
// copy's stores read each destination line into the cache before writing it, and then evict
// lines the reader of the destination will not find there anyway when the copy is larger than
// the cache. For copies of many megabytes (a large push into its shared-memory region) that is
// a third of the memory traffic of the copy. glibc's memcpy switches to such stores only from
// a threshold set by the cache size (hundreds of megabytes on some hosts), per call.
#ifndef PS_COMMON_STREAM_COPY_H_
#define PS_COMMON_STREAM_COPY_H_

#include <cstddef>

namespace ps::common {

// memcpy(to, from, n) with non-temporal stores where the CPU has them (SSE2 on x86-64); a
// plain memcpy elsewhere. The buffers must not overlap. For copies much larger than the
// cache: the destination is left out of the cache.
void StreamCopy(void* to, const void* from, size_t n);

// The size of one instance of this host's last-level cache (sysfs, else the C library's
// sysconf), 32 MiB when neither knows it. Read once per process.
size_t LastLevelCacheBytes();

}  // namespace ps::common

#endif  // PS_COMMON_STREAM_COPY_H_
