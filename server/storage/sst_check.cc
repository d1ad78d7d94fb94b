#include "server/storage/sst_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/storage/crc32c.h"

namespace ps::server::storage {
namespace {

// The block-based table format (RocksDB table/format.h, format_version 1..5):
//   footer (53 bytes) = checksum type (1) | metaindex handle | index handle | zero padding to
//   41 bytes | format_version (fixed32) | magic (fixed64)
//   block = contents | compression type (1) | checksum (fixed32) over contents + type byte
//   handle = offset (varint64) | size (varint64), size excluding the 5-byte trailer
constexpr size_t kFooterSize = 53;
constexpr uint64_t kBlockBasedTableMagic = 0x88e241b785f4cff7ull;
constexpr size_t kBlockTrailerSize = 5;
constexpr char kChecksumCrc32c = 0x1;
constexpr uint32_t kCrcMaskDelta = 0xa282ead8u;

struct Handle {
  uint64_t offset = 0;
  uint64_t size = 0;
};

uint32_t DecodeFixed32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));  // Little-endian, as the format (x86-64 only here).
  return v;
}

uint64_t DecodeFixed64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Reads a varint at *p (< end); advances *p. nullopt if truncated or longer than `max_bits`.
std::optional<uint64_t> ReadVarint(const char** p, const char* end, int max_bits) {
  uint64_t v = 0;
  for (int shift = 0; shift < max_bits && *p < end; shift += 7) {
    const uint8_t byte = static_cast<uint8_t>(*(*p)++);
    v |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) return v;
  }
  return std::nullopt;
}

std::optional<Handle> ReadHandle(const char** p, const char* end) {
  std::optional<uint64_t> offset = ReadVarint(p, end, 64);
  if (!offset.has_value()) return std::nullopt;
  std::optional<uint64_t> size = ReadVarint(p, end, 64);
  if (!size.has_value()) return std::nullopt;
  return Handle{*offset, *size};
}

// Reads `size` bytes at `offset` of the file (both within it).
using ReadFn = std::function<absl::StatusOr<std::string>(uint64_t offset, uint64_t size)>;

class Checker {
 public:
  Checker(absl::string_view name, uint64_t file_size, ReadFn read)
      : name_(name), file_size_(file_size), read_(std::move(read)) {}

  absl::StatusOr<SstCheck> Run() {
    if (file_size_ < kFooterSize) return Damage("shorter than a table footer");
    absl::StatusOr<std::string> footer_bytes = read_(file_size_ - kFooterSize, kFooterSize);
    if (!footer_bytes.ok()) return footer_bytes.status();
    const char* footer = footer_bytes->data();
    if (DecodeFixed64(footer + kFooterSize - 8) != kBlockBasedTableMagic) {
      return Damage("bad table magic number");
    }
    const uint32_t format_version = DecodeFixed32(footer + kFooterSize - 12);
    if (format_version < 1 || format_version > 5) return SstCheck::kUnchecked;
    if (footer[0] != kChecksumCrc32c) return SstCheck::kUnchecked;
    const char* p = footer + 1;
    const char* handles_end = footer + kFooterSize - 12;
    std::optional<Handle> metaindex = ReadHandle(&p, handles_end);
    std::optional<Handle> index = ReadHandle(&p, handles_end);
    if (!metaindex.has_value() || !index.has_value()) return Damage("malformed footer");
    for (; p < handles_end; ++p) {
      if (*p != 0) return Damage("malformed footer (padding)");
    }
    absl::StatusOr<std::string> metaindex_block = Block(*metaindex, "metaindex");
    if (!metaindex_block.ok()) return metaindex_block.status();
    absl::StatusOr<std::string> index_block = Block(*index, "index");
    if (!index_block.ok()) return index_block.status();
    return CheckMetaBlocks(*metaindex_block);
  }

 private:
  absl::Status Damage(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("SST file ", name_, ": ", what));
  }

  // The block's contents after verifying its place and checksum.
  absl::StatusOr<std::string> Block(const Handle& h, absl::string_view what) const {
    const uint64_t limit = file_size_ - kFooterSize;
    if (h.offset > limit || h.size > limit - h.offset ||
        kBlockTrailerSize > limit - h.offset - h.size) {
      return Damage(absl::StrFormat("%s block handle (offset %d, size %d) outside the file", what,
                                    h.offset, h.size));
    }
    absl::StatusOr<std::string> block = read_(h.offset, h.size + kBlockTrailerSize);
    if (!block.ok()) return block.status();
    const absl::string_view contents(block->data(), h.size);
    const char* trailer = block->data() + h.size;
    const uint32_t computed =
        crc32c::Extend(crc32c::Value(contents), absl::string_view(trailer, 1));
    const uint32_t masked = ((computed >> 15) | (computed << 17)) + kCrcMaskDelta;
    const uint32_t stored = DecodeFixed32(trailer + 1);
    if (masked != stored) {
      return Damage(
          absl::StrFormat("%s block at offset %d: checksum mismatch (stored %08x, "
                          "computed %08x)",
                          what, h.offset, stored, masked));
    }
    block->resize(h.size);
    return block;
  }

  // Metaindex entries: shared | non_shared | value_length (varint32 each), key delta, value
  // (a block handle); then restart offsets (fixed32 each) and their count (fixed32).
  absl::StatusOr<SstCheck> CheckMetaBlocks(absl::string_view block) const {
    if (block.size() < 4) return Damage("metaindex block too short");
    const uint32_t num_restarts = DecodeFixed32(block.data() + block.size() - 4);
    if (num_restarts > (block.size() - 4) / 4) return Damage("malformed metaindex block");
    const char* p = block.data();
    const char* end = block.data() + block.size() - 4 * (uint64_t{num_restarts} + 1);
    std::string key;
    while (p < end) {
      std::optional<uint64_t> shared = ReadVarint(&p, end, 32);
      std::optional<uint64_t> non_shared = ReadVarint(&p, end, 32);
      std::optional<uint64_t> value_length = ReadVarint(&p, end, 32);
      if (!shared || !non_shared || !value_length || *shared > key.size() ||
          *non_shared > static_cast<uint64_t>(end - p) ||
          *value_length > static_cast<uint64_t>(end - p) - *non_shared) {
        return Damage("malformed metaindex block entry");
      }
      key.resize(*shared);
      key.append(p, *non_shared);
      p += *non_shared;
      const char* value = p;
      p += *value_length;
      std::optional<Handle> handle = ReadHandle(&value, p);
      if (!handle.has_value()) return Damage("malformed metaindex block entry");
      absl::StatusOr<std::string> meta = Block(*handle, absl::StrCat("meta (", key, ")"));
      if (!meta.ok()) return meta.status();
    }
    return SstCheck::kGood;
  }

  const std::string name_;
  const uint64_t file_size_;
  const ReadFn read_;
};

}  // namespace

absl::StatusOr<SstCheck> CheckSstBytes(absl::string_view name, absl::string_view bytes) {
  return Checker(name, bytes.size(),
                 [bytes](uint64_t offset, uint64_t size) {
                   return std::string(bytes.substr(offset, size));
                 })
      .Run();
}

absl::StatusOr<SstCheck> CheckSstFile(const std::string& path) {
  auto unavailable = [&path](absl::string_view what) {
    return absl::UnavailableError(
        absl::StrCat("SST file ", path, ": ", what, ": ", std::strerror(errno)));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return unavailable("open");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status status = unavailable("stat");
    ::close(fd);
    return status;
  }
  // Only the footer and the blocks it leads to are read: a few KB, plus the index block.
  absl::StatusOr<SstCheck> result =
      Checker(path, static_cast<uint64_t>(st.st_size),
              [&](uint64_t offset, uint64_t size) -> absl::StatusOr<std::string> {
                std::string buffer(size, '\0');
                uint64_t done = 0;
                while (done < size) {
                  const ssize_t n = ::pread(fd, buffer.data() + done, size - done,
                                            static_cast<off_t>(offset + done));
                  if (n < 0 && errno == EINTR) continue;
                  if (n < 0) return unavailable("read");
                  if (n == 0)
                    return absl::DataLossError(absl::StrCat("SST file ", path, ": truncated"));
                  done += static_cast<uint64_t>(n);
                }
                return buffer;
              })
          .Run();
  ::close(fd);
  return result;
}

}  // namespace ps::server::storage
