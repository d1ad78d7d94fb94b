#include "worker/data/idx.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/data/file_reader.h"
#include "worker/data/in_memory_dataset.h"
#include "worker/data/memory_limit.h"

namespace ps::worker {
namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;
// Data is converted in chunks so that a header claiming more data than the file holds
// fails with DATA_LOSS when the bytes run out, instead of allocating for the claim first.
constexpr size_t kChunkBytes = 1 << 20;
// 1 GiB of floats; Fashion-MNIST's training set is 47M.
constexpr uint64_t kMaxReserveFloats = uint64_t{1} << 28;

struct IdxHeader {
  std::vector<uint32_t> dims;
  uint64_t count = 0;         // dims[0]
  uint64_t element_size = 0;  // product of dims[1..]; 1 for a 1-D file
  uint64_t data_offset = 0;   // where the elements start
};

const char* TypeName(uint8_t code) {
  switch (code) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "unknown";
  }
}

absl::Status ReadExactly(FileReader& file, char* out, size_t n, absl::string_view what) {
  const uint64_t at = file.offset();
  ASSIGN_OR_RETURN(size_t got, file.Read(out, n));
  if (got < n) {
    return absl::DataLossError(absl::StrCat(file.path(), ": byte ", at, ": truncated ", what,
                                            ": want ", n, " bytes, the file ends at byte ",
                                            at + got));
  }
  return absl::OkStatus();
}

// Reads the magic and dimensions. `min_dims`/`max_dims` bound the rank.
absl::StatusOr<IdxHeader> ReadHeader(FileReader& file, int min_dims, int max_dims) {
  std::array<unsigned char, 4> magic;
  RETURN_IF_ERROR(
      ReadExactly(file, reinterpret_cast<char*>(magic.data()), magic.size(), "IDX magic"));
  const uint32_t magic_value = (uint32_t{magic[0]} << 24) | (uint32_t{magic[1]} << 16) |
                               (uint32_t{magic[2]} << 8) | magic[3];
  if (magic[0] != 0 || magic[1] != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: byte 0: bad magic 0x%08x, want 0x0000TTDD (not an IDX file?)",
                        file.path(), magic_value));
  }
  if (magic[2] != kTypeUnsignedByte) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: byte 2: element type 0x%02x (%s) is not supported, want 0x08 (unsigned byte)",
        file.path(), magic[2], TypeName(magic[2])));
  }
  const int rank = magic[3];
  if (rank < min_dims || rank > max_dims) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": byte 3: ", rank, " dimensions, want ",
        min_dims == max_dims ? absl::StrCat(min_dims) : absl::StrCat(min_dims, " to ", max_dims)));
  }
  IdxHeader header;
  header.dims.resize(rank);
  std::vector<unsigned char> raw(4 * rank);
  RETURN_IF_ERROR(
      ReadExactly(file, reinterpret_cast<char*>(raw.data()), raw.size(), "IDX dimensions"));
  for (int d = 0; d < rank; ++d) {
    const unsigned char* p = &raw[4 * d];
    header.dims[d] = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
  }
  header.count = header.dims[0];
  header.element_size = 1;
  for (int d = 1; d < rank; ++d) {
    const uint64_t dim = header.dims[d];
    if (dim == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": byte ", 4 + 4 * d, ": dimension ", d, " is 0"));
    }
    // Keep count * element_size below 2^62: no product below can overflow.
    if (header.element_size > (uint64_t{1} << 30) / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": byte ", 4 + 4 * d, ": examples of more than 2^30 elements"));
    }
    header.element_size *= dim;
  }
  header.data_offset = file.offset();
  return header;
}

// After the declared data the file must end: trailing bytes mean the header and the data
// disagree, e.g. a file concatenated with another.
absl::Status ExpectEnd(FileReader& file) {
  char extra;
  const uint64_t at = file.offset();
  ASSIGN_OR_RETURN(size_t got, file.Read(&extra, 1));
  if (got != 0) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": byte ", at,
                                                   ": unexpected data after the ", at,
                                                   " bytes the header declares"));
  }
  return absl::OkStatus();
}

// Reads the labels; validates them against num_classes when it is > 0.
absl::StatusOr<std::vector<int32_t>> ReadLabels(const std::string& path, int num_classes,
                                                uint64_t memory_limit) {
  ASSIGN_OR_RETURN(std::unique_ptr<FileReader> file, FileReader::Open(path));
  ASSIGN_OR_RETURN(IdxHeader header, ReadHeader(*file, 1, 1));
  // What the header declares is what the data would take (the file must end after it), so a
  // count beyond memory is refused before a byte is read: a small gzip file can decompress
  // to any count.
  RETURN_IF_ERROR(CheckDatasetFits(
      static_cast<double>(header.count) * sizeof(int32_t), memory_limit,
      absl::StrCat(path, ": byte 4: the ", header.count, " labels its header declares")));
  std::vector<int32_t> labels;
  std::vector<unsigned char> chunk;
  uint64_t left = header.count;
  while (left > 0) {
    chunk.resize(std::min<uint64_t>(left, kChunkBytes));
    const uint64_t at = file->offset();
    RETURN_IF_ERROR(ReadExactly(*file, reinterpret_cast<char*>(chunk.data()), chunk.size(),
                                absl::StrCat("labels (", header.count, " declared)")));
    for (size_t i = 0; i < chunk.size(); ++i) {
      if (num_classes > 0 && chunk[i] >= num_classes) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": byte ", at + i, ": label ",
                                                       chunk[i], " is out of range [0, ",
                                                       num_classes, ")"));
      }
      labels.push_back(chunk[i]);
    }
    left -= chunk.size();
  }
  RETURN_IF_ERROR(ExpectEnd(*file));
  return labels;
}

absl::StatusOr<std::vector<float>> ReadImages(FileReader& file, const IdxHeader& header,
                                              float pixel_scale) {
  // A table keeps the conversion exact (byte / scale, correctly rounded) and cheap.
  std::array<float, 256> value;
  for (int b = 0; b < 256; ++b) value[b] = static_cast<float>(b) / pixel_scale;
  const uint64_t total = header.count * header.element_size;
  std::vector<float> features;
  // The header is untrusted: reserve at most kMaxReserveFloats up front (address space
  // only; pages are committed as they are written); beyond that resize() grows
  // geometrically as the data actually arrives.
  features.reserve(std::min(total, kMaxReserveFloats));
  std::vector<unsigned char> chunk;
  uint64_t left = total;
  while (left > 0) {
    chunk.resize(std::min<uint64_t>(left, kChunkBytes));
    RETURN_IF_ERROR(ReadExactly(file, reinterpret_cast<char*>(chunk.data()), chunk.size(),
                                absl::StrCat("pixels (", total, " declared)")));
    const size_t base = features.size();
    features.resize(base + chunk.size());
    float* out = features.data() + base;
    for (size_t i = 0; i < chunk.size(); ++i) out[i] = value[chunk[i]];
    left -= chunk.size();
  }
  RETURN_IF_ERROR(ExpectEnd(file));
  return features;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> LoadIdxDataset(const std::string& images,
                                                        const std::string& labels,
                                                        float pixel_scale, int num_classes,
                                                        uint64_t max_memory_bytes) {
  // (255 / pixel_scale must be a float too: a tiny scale made every lit pixel infinite.)
  if (!std::isfinite(pixel_scale) || pixel_scale <= 0 || !std::isfinite(255.0f / pixel_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pixel_scale must be finite and > 0, with 255 / pixel_scale finite; got ", pixel_scale));
  }
  if (num_classes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_classes must be >= 0, got ", num_classes));
  }
  // Labels first: they are small, and their count lets a mismatched pair fail right after
  // the image header instead of after reading every pixel.
  const uint64_t limit = DatasetMemoryLimit(max_memory_bytes);
  ASSIGN_OR_RETURN(std::vector<int32_t> label_values, ReadLabels(labels, num_classes, limit));
  ASSIGN_OR_RETURN(std::unique_ptr<FileReader> file, FileReader::Open(images));
  ASSIGN_OR_RETURN(IdxHeader header, ReadHeader(*file, 2, 255));
  if (header.count != label_values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(images, ": byte 4: ", header.count,
                                                   " images, but ", labels, " has ",
                                                   label_values.size(), " labels"));
  }
  // Each example's pixels as floats, and its label (read already).
  const double bytes = static_cast<double>(header.count) *
                       (static_cast<double>(header.element_size) + 1.0) * sizeof(float);
  RETURN_IF_ERROR(CheckDatasetFits(
      bytes, limit,
      absl::StrCat(images, ": byte 4: the ", header.count, " images of ", header.element_size,
                   " pixels its header declares (as floats, with their labels)")));
  ASSIGN_OR_RETURN(std::vector<float> features, ReadImages(*file, header, pixel_scale));
  if (num_classes == 0) {
    int32_t max_label = 0;
    for (int32_t l : label_values) max_label = std::max(max_label, l);
    num_classes = max_label + 1;
  }
  return std::unique_ptr<Dataset>(new DenseDataset(static_cast<int64_t>(header.element_size),
                                                   num_classes, std::move(features),
                                                   std::move(label_values)));
}

}  // namespace ps::worker
