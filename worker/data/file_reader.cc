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
#include "common/status_macros.h"

namespace ps::worker {
namespace {

constexpr size_t kInputBytes = 256 << 10;
constexpr size_t kLineBufferBytes = 256 << 10;
// zlib counts in unsigned int.
constexpr size_t kMaxInflate = 1u << 30;

bool IsGzipMagic(const char* p) {
  return static_cast<unsigned char>(p[0]) == 0x1f && static_cast<unsigned char>(p[1]) == 0x8b;
}

}  // namespace

struct FileReader::Inflater {
  z_stream stream{};
  bool initialized = false;
  // True between the end of one gzip member and the start of the next.
  bool member_ended = false;
  ~Inflater() {
    if (initialized) inflateEnd(&stream);
  }
};

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
  auto reader = std::unique_ptr<FileReader>(new FileReader(path, fd));
  // The content decides: a file starting with the gzip magic is gzip, whatever its name.
  while (reader->input_.size() < 2) {
    ASSIGN_OR_RETURN(const bool more, reader->FillInput());
    if (!more) break;
  }
  if (reader->input_.size() >= 2 && IsGzipMagic(reader->input_.data())) {
    reader->compressed_ = true;
    reader->inflater_ = std::make_unique<Inflater>();
    // windowBits 15 + 16: a gzip wrapper only, whose CRC-32 and length inflate checks.
    const int init = inflateInit2(&reader->inflater_->stream, 15 + 16);
    if (init != Z_OK) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": cannot start zlib (", zError(init), ")"));
    }
    reader->inflater_->initialized = true;
  }
  return reader;
}

FileReader::FileReader(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

FileReader::~FileReader() { ::close(fd_); }

absl::Status FileReader::StreamError(absl::string_view what) const {
  return absl::DataLossError(absl::StrCat(path_, ": ", what, " after byte ", file_pos_,
                                          " (compressed byte ", raw_pos_, ")"));
}

absl::StatusOr<bool> FileReader::FillInput() {
  if (input_end_) return false;
  // Keep what is not used yet at the front.
  input_.erase(input_.begin(), input_.begin() + static_cast<std::ptrdiff_t>(input_pos_));
  input_pos_ = 0;
  const size_t kept = input_.size();
  input_.resize(kept + kInputBytes);
  ssize_t got;
  do {
    got = ::read(fd_, input_.data() + kept, kInputBytes);
  } while (got < 0 && errno == EINTR);
  if (got < 0) {
    const int error = errno;
    input_.resize(kept);
    return absl::DataLossError(
        absl::StrCat(path_, ": read error after byte ", file_pos_, ": ", std::strerror(error)));
  }
  input_.resize(kept + static_cast<size_t>(got));
  if (got == 0) input_end_ = true;
  return got > 0;
}

absl::StatusOr<size_t> FileReader::Inflate(char* out, size_t n) {
  z_stream& z = inflater_->stream;
  size_t done = 0;
  while (done < n) {
    if (inflater_->member_ended) {
      // Only another member may follow a member: `cat a.gz b.gz` is one stream.
      while (input_.size() - input_pos_ < 2) {
        ASSIGN_OR_RETURN(const bool more, FillInput());
        if (!more) break;
      }
      const size_t left = input_.size() - input_pos_;
      if (left == 0) break;  // The end of the file.
      if (left < 2 || !IsGzipMagic(input_.data() + input_pos_)) {
        return StreamError("data after the end of the gzip stream that is not another member");
      }
      inflateReset(&z);
      inflater_->member_ended = false;
    }
    if (input_pos_ == input_.size()) {
      ASSIGN_OR_RETURN(const bool more, FillInput());
      if (!more) return StreamError("truncated gzip stream");
    }
    const size_t in_before = input_.size() - input_pos_;
    const size_t out_room = std::min(n - done, kMaxInflate);
    z.next_in = reinterpret_cast<Bytef*>(input_.data() + input_pos_);
    z.avail_in = static_cast<uInt>(std::min(in_before, kMaxInflate));
    z.next_out = reinterpret_cast<Bytef*>(out + done);
    z.avail_out = static_cast<uInt>(out_room);
    const uInt avail_in = z.avail_in;
    const int result = inflate(&z, Z_NO_FLUSH);
    const size_t used = avail_in - z.avail_in;
    const size_t produced = out_room - z.avail_out;
    input_pos_ += used;
    raw_pos_ += used;
    done += produced;
    file_pos_ += produced;
    switch (result) {
      case Z_STREAM_END:
        inflater_->member_ended = true;
        break;
      case Z_OK:
      case Z_BUF_ERROR:  // No progress: more input is needed, which the loop reads.
        break;
      case Z_MEM_ERROR:
        return absl::ResourceExhaustedError(absl::StrCat(path_, ": zlib is out of memory"));
      default:  // Z_DATA_ERROR, Z_NEED_DICT, Z_STREAM_ERROR.
        return StreamError(absl::StrCat(
            "corrupt gzip stream (zlib: ", z.msg == nullptr ? zError(result) : z.msg, ")"));
    }
  }
  return done;
}

absl::StatusOr<size_t> FileReader::ReadFromFile(char* out, size_t n) {
  if (compressed_) return Inflate(out, n);
  size_t done = 0;
  while (done < n) {
    if (input_pos_ == input_.size()) {
      // Past what Open peeked at: read straight into the caller's memory.
      input_.clear();
      input_pos_ = 0;
      if (input_end_) break;
      ssize_t got;
      do {
        got = ::read(fd_, out + done, std::min(n - done, kMaxInflate));
      } while (got < 0 && errno == EINTR);
      if (got < 0) {
        const int error = errno;
        return absl::DataLossError(
            absl::StrCat(path_, ": read error after byte ", file_pos_, ": ", std::strerror(error)));
      }
      if (got == 0) {
        input_end_ = true;
        break;
      }
      done += static_cast<size_t>(got);
      file_pos_ += static_cast<uint64_t>(got);
      continue;
    }
    const size_t take = std::min(n - done, input_.size() - input_pos_);
    std::memcpy(out + done, input_.data() + input_pos_, take);
    input_pos_ += take;
    done += take;
    file_pos_ += take;
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
