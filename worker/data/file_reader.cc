#include "worker/data/file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ps::worker {
namespace {

constexpr size_t kZlibBufferBytes = 256 << 10;
constexpr size_t kLineBufferBytes = 256 << 10;
// gzread takes an unsigned int length and returns an int.
constexpr size_t kMaxGzRead = 1u << 30;

gzFile Gz(void* p) { return static_cast<gzFile>(p); }

}  // namespace

absl::StatusOr<std::unique_ptr<FileReader>> FileReader::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat(path, ": cannot open"));
  }
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory"));
  }
  // gzdopen takes over fd (gzclose closes it), also when reading a plain file: zlib passes
  // bytes through unchanged when the content does not start with the gzip magic.
  gzFile gz = gzdopen(fd, "rb");
  if (gz == nullptr) {
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(path, ": gzdopen failed"));
  }
  gzbuffer(gz, kZlibBufferBytes);
  // gzdirect is only meaningful after the first read has looked at the header, so peek one
  // byte and push it back.
  const int first = gzgetc(gz);
  if (first >= 0) gzungetc(first, gz);
  const bool compressed = gzdirect(gz) == 0;
  auto reader = std::unique_ptr<FileReader>(new FileReader(path, gz, compressed));
  if (first < 0) {
    int errnum = Z_OK;
    const char* message = gzerror(gz, &errnum);
    if (errnum != Z_OK) return reader->StreamError(errnum, message);
  }
  return reader;
}

FileReader::FileReader(std::string path, void* gz_file, bool compressed)
    : path_(std::move(path)), gz_file_(gz_file), compressed_(compressed) {}

FileReader::~FileReader() { gzclose(Gz(gz_file_)); }

absl::Status FileReader::StreamError(int gz_errnum, const char* gz_message) const {
  if (gz_errnum == Z_ERRNO) {
    return absl::DataLossError(
        absl::StrCat(path_, ": read error after byte ", file_pos_, ": ", std::strerror(errno)));
  }
  // Z_BUF_ERROR here is zlib's "unexpected end of file": the gzip stream stops mid-way.
  const absl::string_view what =
      gz_errnum == Z_BUF_ERROR ? "truncated gzip stream" : "corrupt gzip stream";
  return absl::DataLossError(absl::StrCat(path_, ": ", what, " after byte ", file_pos_, " (zlib: ",
                                          gz_message == nullptr ? "?" : gz_message, ")"));
}

absl::StatusOr<size_t> FileReader::ReadFromFile(char* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min(n - done, kMaxGzRead));
    const int got = gzread(Gz(gz_file_), out + done, chunk);
    if (got > 0) {
      done += static_cast<size_t>(got);
      file_pos_ += static_cast<uint64_t>(got);
    }
    if (got < static_cast<int>(chunk)) {
      // A short read is either the end of the file or an error. zlib reports a truncated
      // gzip member as a short read with Z_BUF_ERROR set, so always ask.
      int errnum = Z_OK;
      const char* message = gzerror(Gz(gz_file_), &errnum);
      if (errnum != Z_OK) return StreamError(errnum, message);
      break;
    }
  }
  return done;
}

absl::StatusOr<size_t> FileReader::Read(char* out, size_t n) {
  // Serve what ReadLine read ahead first.
  const size_t buffered = std::min(n, buffer_.size() - buffer_pos_);
  std::memcpy(out, buffer_.data() + buffer_pos_, buffered);
  buffer_pos_ += buffered;
  offset_ += buffered;
  if (buffered == n) return n;
  absl::StatusOr<size_t> got = ReadFromFile(out + buffered, n - buffered);
  if (!got.ok()) return got.status();
  offset_ += *got;
  return buffered + *got;
}

absl::StatusOr<bool> FileReader::FillBuffer() {
  if (buffer_pos_ < buffer_.size()) return true;
  buffer_.resize(kLineBufferBytes);
  buffer_pos_ = 0;
  absl::StatusOr<size_t> got = ReadFromFile(buffer_.data(), buffer_.size());
  if (!got.ok()) {
    buffer_.clear();
    return got.status();
  }
  buffer_.resize(*got);
  return *got > 0;
}

absl::StatusOr<bool> FileReader::ReadLine(std::string* line, size_t max_bytes) {
  line->clear();
  bool any = false;
  const uint64_t start = offset_;
  while (true) {
    absl::StatusOr<bool> more = FillBuffer();
    if (!more.ok()) return more.status();
    if (!*more) return any;
    any = true;
    const char* begin = buffer_.data() + buffer_pos_;
    const size_t available = buffer_.size() - buffer_pos_;
    const void* newline = std::memchr(begin, '\n', available);
    const size_t len = newline == nullptr ? available : static_cast<const char*>(newline) - begin;
    if (len > max_bytes - line->size()) {
      line->clear();
      return absl::ResourceExhaustedError(
          absl::StrCat(path_, ": byte ", start, ": a line longer than ", max_bytes, " bytes"));
    }
    line->append(begin, len);
    const size_t consumed = newline == nullptr ? len : len + 1;
    buffer_pos_ += consumed;
    offset_ += consumed;
    if (newline != nullptr) return true;
  }
}

}  // namespace ps::worker
