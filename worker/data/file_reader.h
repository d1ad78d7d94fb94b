// FileReader: a sequential reader of a local file that is either plain or gzip-compressed
// (detected from the content, not the name), with byte-offset tracking for error messages.
// It is the one place in worker/data that talks to zlib; the IDX and LIBSVM readers use it.
// A gzip file may hold several members one after the other (`cat a.gz b.gz`), read as one
// stream; anything else after a member is DATA_LOSS, not ignored as zlib's gzread does, so a
// file whose later part is damaged is never read as a shorter one.
#ifndef PS_WORKER_DATA_FILE_READER_H_
#define PS_WORKER_DATA_FILE_READER_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps::worker {

// Thread-compatible: callers synchronize. Owns its file handle (closed in the destructor).
//
// Offsets count bytes of the decompressed content, so for a .gz file they are positions in
// the uncompressed stream, which is what a format error refers to.
//
// Error codes: NOT_FOUND (no such file), PERMISSION_DENIED, INVALID_ARGUMENT (a directory),
// DATA_LOSS (corrupt or truncated gzip stream, bytes after it that are not another gzip
// member, or an I/O error while reading), RESOURCE_EXHAUSTED (zlib's memory), and other
// errno-derived codes from open(2). Every message starts with the path.
class FileReader {
 public:
  // Opens `path` for reading.
  static absl::StatusOr<std::unique_ptr<FileReader>> Open(const std::string& path);

  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  // Reads up to `n` bytes into `out`; returns the number read, which is less than `n` only
  // at the end of the file (0 once the end has been reached).
  [[nodiscard]] absl::StatusOr<size_t> Read(char* out, size_t n);

  // Reads the next line into `*line`, without its '\n' (a '\r' before it is kept; the
  // caller decides). Returns false, leaving `*line` empty, at the end of the file. A last
  // line without '\n' is still returned. A line longer than `max_bytes` is
  // RESOURCE_EXHAUSTED, naming where it starts, once that much of it was read.
  [[nodiscard]] absl::StatusOr<bool> ReadLine(
      std::string* line, size_t max_bytes = std::numeric_limits<size_t>::max());

  // Bytes consumed so far (decompressed).
  uint64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }
  // True if the file is gzip-compressed.
  bool compressed() const { return compressed_; }

 private:
  struct Inflater;  // zlib's stream state, kept in file_reader.cc so that zlib.h stays there.

  FileReader(std::string path, int fd);

  // Moves up to `n` bytes from the file into `out` (bypassing buffer_).
  absl::StatusOr<size_t> ReadFromFile(char* out, size_t n);
  absl::StatusOr<size_t> Inflate(char* out, size_t n);
  // Reads more of the raw file into input_; returns false at its end.
  absl::StatusOr<bool> FillInput();
  // Refills buffer_ when it is empty; returns false at the end of the file.
  absl::StatusOr<bool> FillBuffer();
  absl::Status StreamError(absl::string_view what) const;

  // Constant after construction.
  const std::string path_;
  const int fd_;
  bool compressed_ = false;

  // Raw bytes read from fd_: [input_pos_, input_.size()) not yet used.
  std::vector<char> input_;
  size_t input_pos_ = 0;
  bool input_end_ = false;
  // Raw bytes of the file used so far: where a gzip error is.
  uint64_t raw_pos_ = 0;
  std::unique_ptr<Inflater> inflater_;  // Set for a compressed file.

  // Read-ahead for ReadLine: bytes [buffer_pos_, buffer_.size()) are not consumed yet.
  std::vector<char> buffer_;
  size_t buffer_pos_ = 0;
  // Bytes consumed by the caller.
  uint64_t offset_ = 0;
  // Bytes decompressed (offset_ plus the unconsumed read-ahead); where errors happen.
  uint64_t file_pos_ = 0;
};

}  // namespace ps::worker

#endif  // PS_WORKER_DATA_FILE_READER_H_
