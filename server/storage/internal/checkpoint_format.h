// Internal to //server/storage:checkpoint_store: the on-disk format of a CheckpointStore.
//
// On-disk layout (format 1): one RocksDB database with
//
//   column family "default" (meta):  "F"            -> kFormat, written when the store is created
//                                    "N"            -> fixed64 next checkpoint id (high-water mark)
//                                    "C" + be64(id) -> commit record of complete checkpoint `id`
//                                    "S"            -> superseded checkpoints (absent = none)
//   column family "checkpoint-<id>"  user key       -> fixed32 crc + value     (one per checkpoint;
//                                                      <id> is 20 decimal digits)
//
// Superseded record: fixed64 id per checkpoint, strictly increasing | fixed32 CRC-32C of the
//   ids. Older binaries ignore it (they know no "S" key).
//
// Fixed-width integers in values are little-endian; ids in keys are big-endian so they sort.
//
// crc = CRC-32C of be64(id) + key + value. The id is included so that a record can only verify
// in the checkpoint it was written for.
//
// Commit record: fixed32 version (1) | fixed64 id | fixed64 num_records | fixed64 bytes |
//   fixed64 hash | fixed64 unix_micros | fixed32 metadata size | metadata | fixed32 CRC-32C of
//   everything before it.
// hash = sum mod 2^64 over records of Mix64(crc32c(be64(id) + key) << 32 | crc). A sum does not
// depend on the order of Put() calls (the shard streams hash tables in their own order) while the
// reader recomputes it in key order; a missing, extra or replaced record changes it.
#ifndef PS_SERVER_STORAGE_INTERNAL_CHECKPOINT_FORMAT_H_
#define PS_SERVER_STORAGE_INTERNAL_CHECKPOINT_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/storage/checkpoint_store.h"

namespace ps::server::storage::internal {

inline constexpr char kFormat[] = "ps.server.storage.CheckpointStore format 1";
inline constexpr char kFormatKey[] = "F";
inline constexpr char kNextIdKey[] = "N";
inline constexpr char kSupersededKey[] = "S";
inline constexpr char kCommitTag = 'C';
inline constexpr char kCfPrefix[] = "checkpoint-";
inline constexpr uint32_t kCommitVersion = 1;
inline constexpr size_t kIdBytes = 8;
inline constexpr size_t kCrcBytes = 4;

// ---- Fixed-width coding (leveldb util/coding.h style). ----
void PutFixed32(std::string* dst, uint32_t v);
void PutFixed64(std::string* dst, uint64_t v);
void EncodeFixed32(char* dst, uint32_t v);
uint32_t DecodeFixed32(const char* p);
uint64_t DecodeFixed64(const char* p);
std::string BigEndian64(uint64_t v);
uint64_t DecodeBigEndian64(const char* p);
// Read a fixed-width field from the front of `*in`; false if too short.
bool GetFixed32(absl::string_view* in, uint32_t* v);
bool GetFixed64(absl::string_view* in, uint64_t* v);

// ---- Names and keys. ----
std::string CommitKey(uint64_t id);
bool IsCommitKey(absl::string_view key);
std::string CfName(uint64_t id);
// The checkpoint id of a column family name, or nullopt if it is not one of ours.
std::optional<uint64_t> ParseCfName(absl::string_view name);
// A key for error messages: C-escaped, quoted, cut after 64 bytes (keys are binary).
std::string PrintableKey(absl::string_view key);

// ---- Checksums. ----
// CRC-32C of BigEndian64(id): the start of every record CRC of checkpoint `id`.
uint32_t IdCrc(uint64_t id);
// The term a record adds to the commit record's hash.
uint64_t Fingerprint(uint32_t key_crc, uint32_t record_crc);

// ---- Commit record. ----
struct CommitRecord {
  CheckpointInfo info;
  uint64_t hash = 0;
};
std::string EncodeCommitRecord(const CommitRecord& record);
// DATA_LOSS naming checkpoint `id` if `value` is not a well-formed commit record for `id`.
absl::StatusOr<CommitRecord> DecodeCommitRecord(uint64_t id, absl::string_view value);

// ---- Superseded record. ----
// REQUIRES: `ids` strictly increasing.
std::string EncodeSuperseded(const std::vector<uint64_t>& ids);
// DATA_LOSS if `value` is not a well-formed superseded record.
absl::StatusOr<std::vector<uint64_t>> DecodeSuperseded(absl::string_view value);

}  // namespace ps::server::storage::internal

#endif  // PS_SERVER_STORAGE_INTERNAL_CHECKPOINT_FORMAT_H_
