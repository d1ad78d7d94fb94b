// CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected; the checksum of iSCSI, ext4, leveldb and
// RocksDB). Uses the SSE4.2 crc32 instruction when the build targets it (our .bazelrc builds for
// x86-64-v2, which has it) and a table otherwise. Both give identical results.
#ifndef PS_SERVER_STORAGE_CRC32C_H_
#define PS_SERVER_STORAGE_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace ps::server::storage::crc32c {

// Returns the CRC-32C of `prefix + data` given `crc` == Value(prefix);
// Extend(0, data) == Value(data).
uint32_t Extend(uint32_t crc, absl::string_view data);

// Returns the CRC-32C of `data`. Value("123456789") == 0xE3069283.
inline uint32_t Value(absl::string_view data) { return Extend(0, data); }

}  // namespace ps::server::storage::crc32c

#endif  // PS_SERVER_STORAGE_CRC32C_H_
