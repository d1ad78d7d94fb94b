#include "common/startup/restart.h"

#include <limits.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ps::common {
namespace {

absl::Status ErrnoError(absl::string_view what, int error) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, ": ", std::strerror(error)));
}

// The path of this program's file when it still lies there (the same file), else
// /proc/self/exe, which opens the running file even when it is gone from the file system.
std::string ProgramFile() {
  constexpr const char* kSelf = "/proc/self/exe";
  char buf[PATH_MAX];
  const ssize_t n = readlink(kSelf, buf, sizeof(buf) - 1);
  if (n <= 0) return kSelf;
  const std::string path(buf, static_cast<size_t>(n));
  struct stat running, on_disk;
  if (absl::EndsWith(path, " (deleted)") || stat(kSelf, &running) != 0 ||
      stat(path.c_str(), &on_disk) != 0 || running.st_dev != on_disk.st_dev ||
      running.st_ino != on_disk.st_ino) {
    return kSelf;
  }
  return path;
}

}  // namespace

absl::Status RestartWithEnvironment(char** argv, const char* name, absl::string_view value) {
  if (argv == nullptr || argv[0] == nullptr) {
    return absl::FailedPreconditionError("no argv[0] to start the program again with");
  }
  // AT_BASE is where the kernel loaded the program's interpreter: 0 when the interpreter is
  // the program, i.e. the loader was started with this program as its argument.
  if (getauxval(AT_BASE) == 0) {
    return absl::FailedPreconditionError(
        "started through the dynamic loader (or statically linked): not started again");
  }
  if (setenv(name, std::string(value).c_str(), 1) != 0) return ErrnoError("setenv", errno);
  const std::string file = ProgramFile();
  execv(file.c_str(), argv);
  return ErrnoError(absl::StrCat("exec ", file), errno);
}

}  // namespace ps::common
