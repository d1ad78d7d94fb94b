#include "common/rpc/shared_memory.h"

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

TEST(SharedMemory, AnOpenedSegmentSharesTheCreatorsBytes) {
  auto made = SharedMemory::Create(1 << 20);
  ASSERT_TRUE(made.ok()) << made.status();
  auto opened = SharedMemory::Open((*made)->id(), (*made)->path(), 1 << 20, SharedMemory::BootId());
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::memcpy((*opened)->data() + 4096, "gradient", 8);
  EXPECT_EQ(std::string((*made)->data() + 4096, 8), "gradient");
  EXPECT_NE((*made)->data(), (*opened)->data());  // two mappings of one file
}

TEST(SharedMemory, RefusesAnotherHostAnotherIdOrAnotherSize) {
  auto made = SharedMemory::Create(1 << 16);
  ASSERT_TRUE(made.ok()) << made.status();
  const SharedMemory& m = **made;
  EXPECT_EQ(SharedMemory::Open(m.id(), m.path(), 1 << 16, "another-boot").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      SharedMemory::Open(m.id() + 1, m.path(), 1 << 16, SharedMemory::BootId()).status().code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SharedMemory::Open(m.id(), m.path(), 1 << 15, SharedMemory::BootId()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SharedMemory::Open(m.id(), "/proc/self/fd/999999", 1 << 16, SharedMemory::BootId())
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  // A plain file of the right size is not a sealed segment.
  char name[] = "/tmp/shared_memory_test_XXXXXX";
  const int fd = mkstemp(name);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 16), 0);
  std::vector<char> head(8);
  const uint64_t id = m.id();
  std::memcpy(head.data(), &id, 8);
  ASSERT_EQ(pwrite(fd, head.data(), 8, 0), 8);
  EXPECT_EQ(SharedMemory::Open(m.id(), name, 1 << 16, SharedMemory::BootId()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  close(fd);
  unlink(name);
}

// Only a process's descriptor of a memory file is opened: not the segment by another name
// (a link to it), not a FIFO or a device behind a descriptor (opening one may block or act).
TEST(SharedMemory, OpensOnlyADescriptorOfARegularFile) {
  auto made = SharedMemory::Create(1 << 16);
  ASSERT_TRUE(made.ok()) << made.status();
  const SharedMemory& m = **made;
  const std::string link = absl::StrCat(testing::TempDir(), "/segment_link");
  unlink(link.c_str());
  ASSERT_EQ(symlink(m.path().c_str(), link.c_str()), 0);
  absl::Status linked = SharedMemory::Open(m.id(), link, 1 << 16, SharedMemory::BootId()).status();
  EXPECT_EQ(linked.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(linked.message()), testing::HasSubstr("not a segment's path"));
  unlink(link.c_str());
  for (const char* bad : {"/proc/self/fd/3", "/proc/1/fd/", "/proc/12/fd/3/x", "/dev/null"}) {
    EXPECT_EQ(SharedMemory::Open(m.id(), bad, 1 << 16, SharedMemory::BootId()).status().code(),
              absl::StatusCode::kFailedPrecondition)
        << bad;
  }
  int fifo[2];
  ASSERT_EQ(pipe(fifo), 0);
  const int device = open("/dev/null", O_RDONLY);
  ASSERT_GE(device, 0);
  for (int fd : {fifo[0], device}) {
    const std::string path = absl::StrCat("/proc/", getpid(), "/fd/", fd);
    absl::Status s = SharedMemory::Open(m.id(), path, 1 << 16, SharedMemory::BootId()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << path;
    EXPECT_THAT(std::string(s.message()), testing::HasSubstr("not a shared-memory file")) << path;
  }
  close(fifo[0]);
  close(fifo[1]);
  close(device);
  // The segment by its own name still opens.
  EXPECT_TRUE(SharedMemory::Open(m.id(), m.path(), 1 << 16, SharedMemory::BootId()).ok());
}

// A regular file behind a descriptor is refused before it is opened or stat'ed: on a FUSE
// mount its server runs, or a hung NFS mount, either would hold the worker's thread. Before,
// it was opened read-write and refused only for its seals.
TEST(SharedMemory, AFileThatIsNoMemoryFileIsNeverOpened) {
  const std::string name = absl::StrCat(testing::TempDir(), "/not_a_segment");
  const int fd = open(name.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 16), 0);
  const int watch = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(watch, 0);
  ASSERT_GE(inotify_add_watch(watch, name.c_str(), IN_OPEN | IN_ATTRIB), 0);
  absl::Status s = SharedMemory::Open(1, absl::StrCat("/proc/", getpid(), "/fd/", fd), 1 << 16,
                                      SharedMemory::BootId())
                       .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("not a shared-memory file"));
  char events[4096];
  EXPECT_EQ(read(watch, events, sizeof(events)), -1);  // nothing opened it
  EXPECT_EQ(errno, EAGAIN);
  close(watch);
  close(fd);
  unlink(name.c_str());
}

// A huge-page memory file is refused: its peer can punch holes in it, sealed or not, and a
// page faulted in again from an empty pool is a SIGBUS in this process.
TEST(SharedMemory, AHugePageMemoryFileIsRefused) {
  const int fd = memfd_create("ps-shared", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
  if (fd < 0) GTEST_SKIP() << "no huge-page memory files here: " << std::strerror(errno);
  constexpr size_t kBytes = size_t{2} << 20;
  if (ftruncate(fd, kBytes) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    close(fd);
    GTEST_SKIP() << "cannot size and seal a huge-page memory file: " << std::strerror(errno);
  }
  absl::Status s = SharedMemory::Open(1, absl::StrCat("/proc/", getpid(), "/fd/", fd), kBytes,
                                      SharedMemory::BootId())
                       .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("not a sealed segment"));
  close(fd);
}

TEST(SharedMemory, APeerCannotShrinkOrGrowTheSegment) {
  auto made = SharedMemory::Create(1 << 16);
  ASSERT_TRUE(made.ok()) << made.status();
  const int fd = open((*made)->path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(ftruncate(fd, 1 << 20), -1);
  EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);  // no seal can be added or removed
  close(fd);
  (*made)->data()[(1 << 16) - 1] = 1;  // still mapped, whole
}

TEST(SharedMemory, HoldsChecksRangesWithoutOverflow) {
  auto made = SharedMemory::Create(4096);
  ASSERT_TRUE(made.ok());
  const SharedMemory& m = **made;
  EXPECT_TRUE(m.Holds(64, 4096 - 64));
  EXPECT_TRUE(m.Holds(4096, 0));
  EXPECT_FALSE(m.Holds(0, 8));  // the id
  EXPECT_FALSE(m.Holds(64, 4096 - 63));
  EXPECT_FALSE(m.Holds(4097, 0));
  EXPECT_FALSE(m.Holds(128, ~uint64_t{0} - 64));
  EXPECT_FALSE(m.Holds(~uint64_t{0}, 2));
}

TEST(SharedArena, AllocatesAlignedDisjointRegionsAndCoalescesFreedOnes) {
  auto made = SharedMemory::Create(64 + 64 * 10);
  ASSERT_TRUE(made.ok());
  auto arena = std::make_shared<SharedArena>(*made);
  EXPECT_EQ(arena->free_bytes(), 640u);
  auto a = SharedArena::Allocate(arena, 100);  // 128
  auto b = SharedArena::Allocate(arena, 64);
  auto c = SharedArena::Allocate(arena, 1);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->offset(), 64u);
  EXPECT_EQ(b->offset(), 192u);
  EXPECT_EQ(c->offset(), 256u);
  EXPECT_EQ(a->size(), 128u);
  EXPECT_FALSE(SharedArena::Allocate(arena, 449).has_value());  // 384 left
  a->Reset();
  b->Reset();
  // a and b merged: 192 bytes at 64.
  auto d = SharedArena::Allocate(arena, 192);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->offset(), 64u);
  d->Reset();
  c->Reset();
  EXPECT_EQ(arena->free_bytes(), 640u);
  auto whole = SharedArena::Allocate(arena, 640);
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->offset(), 64u);
}

TEST(SharedArena, ARegionKeepsTheMappingAliveAfterTheArenaIsDropped) {
  auto made = SharedMemory::Create(1 << 16);
  ASSERT_TRUE(made.ok());
  auto arena = std::make_shared<SharedArena>(*made);
  std::optional<SharedArena::Region> r = SharedArena::Allocate(arena, 1000);
  made->reset();
  arena.reset();
  ASSERT_TRUE(r && r->valid());
  std::memset(r->data(), 7, r->size());
  r->Reset();
  EXPECT_FALSE(r->valid());
}

}  // namespace
}  // namespace ps::common
