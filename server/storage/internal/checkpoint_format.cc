#include "server/storage/internal/checkpoint_format.h"

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "server/storage/crc32c.h"

namespace ps::server::storage::internal {
namespace {

constexpr size_t kMaxKeyInMessage = 64;

// splitmix64's finalizer: a bijection that spreads every input bit over the output.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

// ---- Fixed-width coding (leveldb util/coding.h style). ----

void PutFixed32(std::string* dst, uint32_t v) {
  for (int i = 0; i < 4; ++i) dst->push_back(static_cast<char>(v >> (8 * i)));
}
void PutFixed64(std::string* dst, uint64_t v) {
  for (int i = 0; i < 8; ++i) dst->push_back(static_cast<char>(v >> (8 * i)));
}
void EncodeFixed32(char* dst, uint32_t v) {
  for (int i = 0; i < 4; ++i) dst[i] = static_cast<char>(v >> (8 * i));
}
uint32_t DecodeFixed32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t DecodeFixed64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
std::string BigEndian64(uint64_t v) {
  std::string out;
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}
uint64_t DecodeBigEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

bool GetFixed32(absl::string_view* in, uint32_t* v) {
  if (in->size() < 4) return false;
  *v = DecodeFixed32(in->data());
  in->remove_prefix(4);
  return true;
}
bool GetFixed64(absl::string_view* in, uint64_t* v) {
  if (in->size() < 8) return false;
  *v = DecodeFixed64(in->data());
  in->remove_prefix(8);
  return true;
}

// ---- Names and keys. ----

std::string CommitKey(uint64_t id) {
  return absl::StrCat(std::string(1, kCommitTag), BigEndian64(id));
}

bool IsCommitKey(absl::string_view key) {
  return key.size() == 1 + kIdBytes && key[0] == kCommitTag;
}

std::string CfName(uint64_t id) { return absl::StrFormat("%s%020d", kCfPrefix, id); }

std::optional<uint64_t> ParseCfName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kCfPrefix) || name.size() != 20) return std::nullopt;
  uint64_t id = 0;
  if (!absl::SimpleAtoi(name, &id)) return std::nullopt;
  return id;
}

std::string PrintableKey(absl::string_view key) {
  std::string out = absl::StrCat("\"", absl::CHexEscape(key.substr(0, kMaxKeyInMessage)), "\"");
  if (key.size() > kMaxKeyInMessage) absl::StrAppend(&out, "... (", key.size(), " bytes)");
  return out;
}

// ---- Checksums. ----

uint32_t IdCrc(uint64_t id) { return crc32c::Value(BigEndian64(id)); }

uint64_t Fingerprint(uint32_t key_crc, uint32_t record_crc) {
  return Mix64((uint64_t{key_crc} << 32) | record_crc);
}

// ---- Commit record. ----

std::string EncodeCommitRecord(const CommitRecord& record) {
  std::string out;
  PutFixed32(&out, kCommitVersion);
  PutFixed64(&out, record.info.id);
  PutFixed64(&out, record.info.num_records);
  PutFixed64(&out, record.info.bytes);
  PutFixed64(&out, record.hash);
  PutFixed64(&out, static_cast<uint64_t>(record.info.unix_micros));
  PutFixed32(&out, static_cast<uint32_t>(record.info.metadata.size()));
  out.append(record.info.metadata);
  PutFixed32(&out, crc32c::Value(out));
  return out;
}

absl::StatusOr<CommitRecord> DecodeCommitRecord(uint64_t id, absl::string_view value) {
  auto corrupt = [id](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", id, ": commit record is corrupt: ", why));
  };
  if (value.size() < kCrcBytes) return corrupt("too short");
  absl::string_view body = value.substr(0, value.size() - kCrcBytes);
  if (crc32c::Value(body) != DecodeFixed32(value.data() + body.size())) {
    return corrupt("checksum mismatch");
  }
  CommitRecord record;
  uint32_t version = 0, metadata_size = 0;
  uint64_t micros = 0;
  if (!GetFixed32(&body, &version)) return corrupt("truncated");
  if (version != kCommitVersion) return corrupt(absl::StrCat("unknown version ", version));
  if (!GetFixed64(&body, &record.info.id) || !GetFixed64(&body, &record.info.num_records) ||
      !GetFixed64(&body, &record.info.bytes) || !GetFixed64(&body, &record.hash) ||
      !GetFixed64(&body, &micros) || !GetFixed32(&body, &metadata_size)) {
    return corrupt("truncated");
  }
  if (body.size() != metadata_size) return corrupt("metadata size mismatch");
  if (record.info.id != id) return corrupt(absl::StrCat("holds id ", record.info.id));
  record.info.unix_micros = static_cast<int64_t>(micros);
  record.info.metadata = std::string(body);
  return record;
}

std::string EncodeSuperseded(const std::vector<uint64_t>& ids) {
  std::string out;
  out.reserve(ids.size() * kIdBytes + kCrcBytes);
  for (uint64_t id : ids) PutFixed64(&out, id);
  PutFixed32(&out, crc32c::Value(out));
  return out;
}

absl::StatusOr<std::vector<uint64_t>> DecodeSuperseded(absl::string_view value) {
  auto corrupt = [](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("the record of superseded checkpoints is corrupt: ", why));
  };
  if (value.size() < kCrcBytes || (value.size() - kCrcBytes) % kIdBytes != 0) {
    return corrupt(absl::StrCat("size ", value.size()));
  }
  const absl::string_view ids = value.substr(0, value.size() - kCrcBytes);
  if (crc32c::Value(ids) != DecodeFixed32(value.data() + ids.size())) {
    return corrupt("checksum mismatch");
  }
  std::vector<uint64_t> out;
  out.reserve(ids.size() / kIdBytes);
  for (size_t at = 0; at < ids.size(); at += kIdBytes) {
    const uint64_t id = DecodeFixed64(ids.data() + at);
    if (!out.empty() && id <= out.back()) return corrupt("ids out of order");
    out.push_back(id);
  }
  return out;
}

}  // namespace ps::server::storage::internal
