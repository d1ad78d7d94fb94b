// Test-only helpers that write data files (plain or gzip) under the test's temporary
// directory, and build IDX file contents.
#ifndef PS_WORKER_DATA_TEST_FILES_H_
#define PS_WORKER_DATA_TEST_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ps::worker::test_files {

// A path named `name` in the test's temporary directory (TEST_TMPDIR under Bazel).
std::string TempPath(absl::string_view name);

// Writes `contents` to `path` (CHECK-fails on error). Returns path.
std::string WriteFile(const std::string& path, absl::string_view contents);
// Writes `contents` gzip-compressed to `path`. Returns path.
std::string WriteGzipFile(const std::string& path, absl::string_view contents);
// `contents` gzip-compressed, as bytes.
std::string Gzip(absl::string_view contents);

// The bytes of an IDX file: magic (0, 0, type, dims.size()), big-endian dims, then `data`.
std::string IdxBytes(uint8_t type, const std::vector<uint32_t>& dims, absl::string_view data);

}  // namespace ps::worker::test_files

#endif  // PS_WORKER_DATA_TEST_FILES_H_
