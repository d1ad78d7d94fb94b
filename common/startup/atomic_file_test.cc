#include "common/startup/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {


std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "/atomic_file_XXXXXX";
  return mkdtemp(tmpl.data());
}

TEST(WriteFileAtomically, ReplacesTheFileAndLeavesNoTemporary) {
  const std::string dir = TempDir();
  const std::string path = dir + "/port";
  ASSERT_TRUE(WriteFileAtomically(path, "7000\n").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "7001\n").ok());
  EXPECT_EQ(Read(path), "7001\n");
  EXPECT_NE(access((path + ".tmp").c_str(), F_OK), 0);
}

TEST(WriteFileAtomically, MissingDirectoryIsAnErrorNamingTheFile) {
  const std::string path = TempDir() + "/no/such/dir/port";
  absl::Status s = WriteFileAtomically(path, "1\n");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_NE(s.message().find("no/such/dir/port.tmp"), std::string::npos) << s;
}

TEST(WriteFileAtomically, RenameOntoADirectoryFailsAndRemovesTheTemporary) {
  const std::string dir = TempDir();
  const std::string path = dir + "/taken";
  ASSERT_EQ(mkdir(path.c_str(), 0700), 0);
  ASSERT_EQ(mkdir((path + "/child").c_str(), 0700), 0);
  absl::Status s = WriteFileAtomically(path, "1\n");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot rename"), std::string::npos) << s;
  EXPECT_NE(access((path + ".tmp").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace ps::common
