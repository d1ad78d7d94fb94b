#include "worker/data/test_files.h"

#include <zlib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gtest/gtest.h"

namespace ps::worker::test_files {

std::string TempPath(absl::string_view name) {
  std::string dir = ::testing::TempDir();
  if (!dir.empty() && dir.back() != '/') dir.push_back('/');
  return absl::StrCat(dir, name);
}

std::string WriteFile(const std::string& path, absl::string_view contents) {
  FILE* f = std::fopen(path.c_str(), "wb");
  CHECK(f != nullptr) << path;
  CHECK_EQ(std::fwrite(contents.data(), 1, contents.size(), f), contents.size()) << path;
  CHECK_EQ(std::fclose(f), 0) << path;
  return path;
}

std::string Gzip(absl::string_view contents) {
  z_stream stream{};
  // windowBits 15 + 16: a gzip (not zlib) wrapper.
  CHECK_EQ(deflateInit2(&stream, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&stream, contents.size()), '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(contents.data()));
  stream.avail_in = static_cast<uInt>(contents.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  CHECK_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

std::string WriteGzipFile(const std::string& path, absl::string_view contents) {
  return WriteFile(path, Gzip(contents));
}

std::string IdxBytes(uint8_t type, const std::vector<uint32_t>& dims, absl::string_view data) {
  std::string out;
  out.push_back(0);
  out.push_back(0);
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(dims.size()));
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(d >> shift));
  }
  out.append(data.data(), data.size());
  return out;
}

}  // namespace ps::worker::test_files
