// Shared memory for the data path between a worker and a server on one host.
//
// A server makes one segment per worker that asks (PushPullRequest.want_shared_bytes): a
// memfd sealed against shrinking and growing, so that nothing the worker does to the file can
// make the server's mapping fault (a plain shared file truncated by a peer raises SIGBUS in
// every process that maps it). The worker opens it through /proc/PID/fd/FD, which works only
// for a process of the same user on the same kernel; it checks the boot id and the segment's
// id (its first 8 bytes) before it trusts the mapping, and falls back to the socket otherwise.
//
// The worker then writes a push's payload into a region of the segment and sends only the
// frame's header (PushPullRequest.shared); the server uses the payload where it lies (the
// worker can still write the region, so what is read twice is guarded or copied first:
// docs/design.md), and writes a pull's answer straight into the region the worker named.
// Every range is checked against the segment. The frame itself goes through the segment's
// channel when it has one (common/rpc/shared_channel.h), else by the socket.
#ifndef PS_COMMON_RPC_SHARED_MEMORY_H_
#define PS_COMMON_RPC_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ps::common {

// A mapped segment. Thread-safe (immutable after creation; the bytes are the users' concern).
class SharedMemory {
 public:
  // Bytes at the start of a segment that hold its id; regions start after them.
  static constexpr size_t kReservedBytes = 64;

  // A new sealed segment of `bytes` (> kReservedBytes) with a random id written at its start.
  static absl::StatusOr<std::shared_ptr<SharedMemory>> Create(size_t bytes);
  // Maps the segment a server offered: FAILED_PRECONDITION when it is not on this host (other
  // boot id), its path is not a process's descriptor ("/proc/PID/fd/FD", as Create names it)
  // of a memory file on tmpfs (memfd_create's; nothing else is opened or even stat'ed), it
  // cannot be opened, or it is not that segment (size, seals or id differ); RESOURCE_EXHAUSTED
  // when this process or host is out of descriptors or memory for now (EMFILE, ENFILE, ENOMEM,
  // EAGAIN), which may pass.
  static absl::StatusOr<std::shared_ptr<SharedMemory>> Open(uint64_t id, const std::string& path,
                                                            size_t bytes,
                                                            const std::string& boot_id);
  // This kernel's boot id (/proc/sys/kernel/random/boot_id), "" if unreadable.
  static const std::string& BootId();

  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  uint64_t id() const { return id_; }
  size_t size() const { return size_; }
  char* data() const { return data_; }
  // Where another process of this host opens it ("" for a segment opened with Open).
  const std::string& path() const { return path_; }
  // Whether [offset, offset + n) lies in the usable part of the segment (overflow-safe).
  bool Holds(uint64_t offset, uint64_t n) const {
    return offset >= kReservedBytes && offset <= size_ && n <= size_ - offset;
  }

 private:
  SharedMemory(int fd, char* data, size_t size, uint64_t id, std::string path)
      : fd_(fd), data_(data), size_(size), id_(id), path_(std::move(path)) {}

  const int fd_;
  char* const data_;
  const size_t size_;
  const uint64_t id_;
  const std::string path_;
};

// Regions of a segment for calls in flight: first fit, 64-byte aligned. Thread-safe.
class SharedArena {
 public:
  // Regions of `memory` below `limit` (0: its whole size).
  explicit SharedArena(std::shared_ptr<SharedMemory> memory, uint64_t limit = 0);

  // A region of the segment, given back to the arena when destroyed.
  class Region {
   public:
    Region() = default;
    Region(Region&& other) noexcept { *this = std::move(other); }
    Region& operator=(Region&& other) noexcept;
    ~Region() { Reset(); }

    bool valid() const { return arena_ != nullptr; }
    uint64_t offset() const { return offset_; }
    uint64_t size() const { return size_; }
    char* data() const;
    const std::shared_ptr<SharedMemory>& memory() const;
    void Reset();

   private:
    friend class SharedArena;
    std::shared_ptr<SharedArena> arena_;
    uint64_t offset_ = 0;
    uint64_t size_ = 0;
  };

  // A region of at least `n` bytes, or nullopt when none is free that large.
  static std::optional<Region> Allocate(const std::shared_ptr<SharedArena>& arena, size_t n);

  const std::shared_ptr<SharedMemory>& memory() const { return memory_; }
  size_t free_bytes() const;
  // Bytes the arena hands out regions from, free or not.
  uint64_t capacity() const { return end_ - begin_; }
  // Whether [offset, offset + n) lies in the part of the segment regions come from
  // (overflow-safe).
  bool Holds(uint64_t offset, uint64_t n) const {
    return offset >= begin_ && offset <= end_ && n <= end_ - offset;
  }

 private:
  void Free(uint64_t offset, uint64_t size);

  const std::shared_ptr<SharedMemory> memory_;
  uint64_t begin_ = 0;
  uint64_t end_ = 0;  // begin_ <= end_
  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> bytes, coalesced
};

}  // namespace ps::common

#endif  // PS_COMMON_RPC_SHARED_MEMORY_H_
