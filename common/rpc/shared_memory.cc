#include "common/rpc/shared_memory.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ps::common {
namespace {

// RESOURCE_EXHAUSTED where the process or the host ran out of something that comes back
// (descriptors, memory, address space): worth asking again later. FAILED_PRECONDITION for the
// rest, which asking again does not change.
absl::Status Errno(absl::string_view what) {
  const int e = errno;
  std::string message = absl::StrCat(what, ": ", std::strerror(e));
  if (e == EMFILE || e == ENFILE || e == ENOMEM || e == EAGAIN) {
    return absl::ResourceExhaustedError(std::move(message));
  }
  return absl::FailedPreconditionError(std::move(message));
}

constexpr uint64_t kAlign = 64;

// "/proc/PID/fd/FD", as Create names a segment.
bool IsDescriptorPath(absl::string_view path) {
  auto number = [](absl::string_view* rest) {
    size_t n = 0;
    while (n < rest->size() && n < 10 && absl::ascii_isdigit((*rest)[n])) ++n;
    if (n == 0) return false;
    rest->remove_prefix(n);
    return true;
  };
  return absl::ConsumePrefix(&path, "/proc/") && number(&path) &&
         absl::ConsumePrefix(&path, "/fd/") && number(&path) && path.empty();
}

uint64_t RoundUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

const std::string& SharedMemory::BootId() {
  static const std::string* id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string s;
    std::getline(in, s);
    return new std::string(absl::StripAsciiWhitespace(s));
  }();
  return *id;
}

absl::StatusOr<std::shared_ptr<SharedMemory>> SharedMemory::Create(size_t bytes) {
  if (bytes <= kReservedBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a segment of ", bytes, " bytes"));
  }
  const int fd = memfd_create("ps-shared", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    absl::Status s = Errno("sizing and sealing a memfd");
    close(fd);
    return s;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    absl::Status s = Errno("mmap");
    close(fd);
    return s;
  }
  std::random_device random;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{random()} << 32) | random();
  std::memcpy(p, &id, sizeof(id));
  return std::shared_ptr<SharedMemory>(new SharedMemory(
      fd, static_cast<char*>(p), bytes, id, absl::StrCat("/proc/", getpid(), "/fd/", fd)));
}

absl::StatusOr<std::shared_ptr<SharedMemory>> SharedMemory::Open(uint64_t id,
                                                                 const std::string& path,
                                                                 size_t bytes,
                                                                 const std::string& boot_id) {
  if (boot_id.empty() || boot_id != BootId()) {
    return absl::FailedPreconditionError("the segment is on another host");
  }
  if (bytes <= kReservedBytes) {
    return absl::FailedPreconditionError(absl::StrCat("a segment of ", bytes, " bytes"));
  }
  // Only what Create names (another process's descriptor of its memory file), and only a
  // regular file: a lying peer must not make this process open a device or a FIFO, whose
  // opening alone may act or block (and opening does not wait, whatever it is).
  if (!IsDescriptorPath(path)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a segment's path"));
  }
  // The file is looked at through an O_PATH descriptor (which opens nothing) and then opened
  // through that descriptor, not by name again: the peer cannot swap a device in between.
  const int path_fd = open(path.c_str(), O_PATH | O_CLOEXEC);
  if (path_fd < 0) return Errno(absl::StrCat("looking up ", path));
  // A memory file (memfd_create's, "/memfd:NAME (deleted)") and nothing else, as the kernel
  // alone says, before anything that asks the file's filesystem (a stat, an open): a file on
  // a FUSE mount its server runs, or on a hung NFS mount, would hold this thread there past
  // any call's deadline (found in review, 2026-12-06).
  char target[64];
  const ssize_t named =
      readlink(absl::StrCat("/proc/self/fd/", path_fd).c_str(), target, sizeof(target));
  if (named <= 0 || !absl::StartsWith(absl::string_view(target, named), "/memfd:")) {
    close(path_fd);
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a shared-memory file"));
  }
  struct stat before;
  if (fstat(path_fd, &before) != 0 || !S_ISREG(before.st_mode)) {
    close(path_fd);
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  const int fd = open(absl::StrCat("/proc/self/fd/", path_fd).c_str(),
                      O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  const int open_error = errno;
  close(path_fd);
  if (fd < 0) {
    errno = open_error;
    return Errno(absl::StrCat("opening ", path));
  }
  struct stat st;
  struct statfs fs;
  // On tmpfs, not hugetlbfs: a huge-page memory file whose pool runs dry faults with SIGBUS
  // where this process touches a page (its peer can punch holes in it, seals or not). The
  // seals before the size: once sealed it can no longer shrink, so the size read after holds,
  // where a size read first could be shrunk before the seals were set (a SIGBUS at the first
  // touch; found in review, 2026-12-06).
  if (fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC ||
      fcntl(fd, F_GET_SEALS) != (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ||
      fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a sealed segment of ", bytes, " bytes"));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    absl::Status s = Errno("mmap");
    close(fd);
    return s;
  }
  uint64_t found;
  std::memcpy(&found, p, sizeof(found));
  if (found != id) {
    munmap(p, bytes);
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, " holds another segment"));
  }
  return std::shared_ptr<SharedMemory>(
      new SharedMemory(fd, static_cast<char*>(p), bytes, id, std::string()));
}

SharedMemory::~SharedMemory() {
  munmap(data_, size_);
  close(fd_);
}

SharedArena::SharedArena(std::shared_ptr<SharedMemory> memory, uint64_t limit)
    : memory_(std::move(memory)) {
  const uint64_t begin = RoundUp(SharedMemory::kReservedBytes);
  const uint64_t end = limit == 0 ? memory_->size() : std::min<uint64_t>(limit, memory_->size());
  if (end > begin) {
    free_.emplace(begin, end - begin);
    begin_ = begin;
    end_ = end;
  }
}

std::optional<SharedArena::Region> SharedArena::Allocate(const std::shared_ptr<SharedArena>& arena,
                                                         size_t n) {
  const uint64_t want = RoundUp(std::max<uint64_t>(n, 1));
  absl::MutexLock lock(&arena->mu_);
  for (auto it = arena->free_.begin(); it != arena->free_.end(); ++it) {
    if (it->second < want) continue;
    Region r;
    r.arena_ = arena;
    r.offset_ = it->first;
    r.size_ = want;
    const uint64_t rest = it->second - want;
    const uint64_t after = it->first + want;
    arena->free_.erase(it);
    if (rest > 0) arena->free_.emplace(after, rest);
    return r;
  }
  return std::nullopt;
}

void SharedArena::Free(uint64_t offset, uint64_t size) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = free_.emplace(offset, size);
  if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

size_t SharedArena::free_bytes() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [offset, size] : free_) n += size;
  return n;
}

SharedArena::Region& SharedArena::Region::operator=(Region&& other) noexcept {
  if (this != &other) {
    Reset();
    arena_ = std::move(other.arena_);
    offset_ = other.offset_;
    size_ = other.size_;
    other.arena_ = nullptr;
  }
  return *this;
}

char* SharedArena::Region::data() const { return arena_->memory()->data() + offset_; }

const std::shared_ptr<SharedMemory>& SharedArena::Region::memory() const {
  return arena_->memory();
}

void SharedArena::Region::Reset() {
  if (arena_ == nullptr) return;
  arena_->Free(offset_, size_);
  arena_ = nullptr;
}

}  // namespace ps::common
