#include "common/rpc/shared_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rpc/grpc_status.h"
#include "glog/logging.h"

namespace ps::common {

// A slot's header. Every field is written by one side and read by the other; the server reads
// each once (the worker may change them at any time).
struct SharedChannel::Slot {
  std::atomic<uint32_t> state;          // kFree, kPosted (worker), kTaken, kAnswered (server)
  std::atomic<uint32_t> request_bytes;  // worker
  std::atomic<uint64_t> timeout_us;     // worker
  std::atomic<uint32_t> answer_bytes;   // server: the frame, or the status message
  std::atomic<int32_t> code;            // server: absl::StatusCode
  std::atomic<uint32_t> flags;          // server: kServerBusy
};

// A side rings a bell by moving it, and wakes the other side only when that side said it
// sleeps (a futex wake is a system call, and the peer is often awake): the sleeper says so,
// then looks at the bell once more before it sleeps, and the ringer moves the bell, then
// looks whether anyone sleeps (both sequentially consistent: one of them sees the other).
struct SharedChannel::Bells {
  alignas(64) std::atomic<uint32_t> server;  // rung by the worker after it posts
  std::atomic<uint32_t> server_sleeping;     // the server's thread waits on `server`
  alignas(64) std::atomic<uint32_t> worker;  // rung by the server after it answers
  std::atomic<uint32_t> worker_sleepers;     // worker threads waiting on `worker`
  std::atomic<uint32_t> closed;              // set by the server: no request is taken now
};

namespace {

enum State : uint32_t { kFree = 0, kPosted = 1, kTaken = 2, kAnswered = 3 };

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Shared futexes (not FUTEX_PRIVATE_FLAG): the word lies in a mapping of two processes.
void Wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

timespec RelativeTimeout(absl::Time deadline) {
  const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
  return absl::ToTimespec(std::min(left, absl::Seconds(3600)));
}

void Wait(const std::atomic<uint32_t>* word, uint32_t seen, absl::Time deadline) {
  const timespec timeout = RelativeTimeout(deadline);
  // EAGAIN (the word moved), EINTR, ETIMEDOUT: the caller looks again either way.
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT, seen, &timeout, nullptr,
          0);
}

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

// The state letter and start time (clock ticks after boot) of process `pid`, from
// /proc/PID/stat; nullopt when it cannot be read, with `*gone` saying whether that is because
// the process does not exist. Not knowing is not gone: a worker out of descriptors for a moment
// (EMFILE) must not take a live server for dead (found in review, 2026-12-06), and give up its
// segment and lent buffers.
struct ProcessFacts {
  char state;
  uint64_t start;
};
std::optional<ProcessFacts> ReadProcess(int pid, bool* gone) {
  *gone = false;
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    // ENOENT: no such process. Any other error (EMFILE, ENFILE, ENOMEM) tells nothing of it;
    // ask the kernel without a descriptor.
    *gone = errno == ENOENT || (kill(pid, 0) != 0 && errno == ESRCH);
    return std::nullopt;
  }
  char buffer[1024];  // the line is a few hundred bytes (comm is at most 64)
  ssize_t n;
  do {
    n = read(fd, buffer, sizeof(buffer));
  } while (n < 0 && errno == EINTR);
  const int read_error = errno;
  close(fd);
  if (n <= 0) {
    *gone = n < 0 && read_error == ESRCH;  // exited between the open and the read
    return std::nullopt;
  }
  std::string stat(buffer, static_cast<size_t>(n));
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the fields after the
  // last ')' are plain. starttime is field 22 of the line, the 20th after comm.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
  ProcessFacts facts{};
  if (fields.size() < 20 || fields[0].size() != 1 || !absl::SimpleAtoi(fields[19], &facts.start)) {
    return std::nullopt;
  }
  facts.state = fields[0][0];
  return facts;
}

}  // namespace

std::optional<int> SharedChannel::PidOfPath(const std::string& path) {
  std::vector<std::string> parts = absl::StrSplit(path, '/');  // "", proc, PID, fd, FD
  int pid = 0;
  if (parts.size() != 5 || !parts[0].empty() || parts[1] != "proc" || parts[3] != "fd" ||
      !absl::SimpleAtoi(parts[2], &pid) || pid <= 0) {
    return std::nullopt;
  }
  return pid;
}

void SharedChannel::WatchServer(int pid) {
  server_pid_ = pid;
  bool gone = false;
  std::optional<ProcessFacts> facts = ReadProcess(pid, &gone);
  server_start_ = facts.has_value() ? facts->start : 0;
}

bool SharedChannel::ServerGone() const {
  if (server_pid_ <= 0) return false;
  bool gone = false;
  std::optional<ProcessFacts> facts = ReadProcess(server_pid_, &gone);
  if (!facts.has_value()) return gone;
  return facts->state == 'Z' || facts->state == 'X' ||
         (server_start_ != 0 && facts->start != server_start_);
}

std::optional<uint64_t> SharedChannel::OffsetFor(size_t bytes) {
  if (bytes < kMinSegmentBytes) return std::nullopt;
  return (bytes - kBytes) & ~uint64_t{63};
}

bool SharedChannel::Fits(uint64_t offset, size_t bytes) {
  return offset % 64 == 0 && offset >= SharedMemory::kReservedBytes && offset <= bytes &&
         bytes - offset >= kBytes;
}

SharedChannel::SharedChannel(std::shared_ptr<SharedMemory> memory, uint64_t offset)
    : memory_(std::move(memory)), offset_(offset) {
  CHECK(Fits(offset_, memory_->size()));
  static_assert(sizeof(Slot) <= kSlotHeaderBytes && sizeof(Bells) <= kBellBytes);
}

SharedChannel::Slot* SharedChannel::slot(uint32_t i) const {
  return reinterpret_cast<Slot*>(memory_->data() + offset_ + kBellBytes + i * kSlotBytes);
}

SharedChannel::Bells* SharedChannel::bells() const {
  return reinterpret_cast<Bells*>(memory_->data() + offset_);
}

// ---- Worker side.

std::optional<uint32_t> SharedChannel::AcquireSlot() {
  absl::MutexLock lock(&mu_);
  for (uint32_t i = 0; i < kSlots; ++i) {
    if (!used_[i]) {
      used_[i] = true;
      return i;
    }
  }
  return std::nullopt;
}

void SharedChannel::Post(uint32_t i, const grpc::ByteBuffer& frame, absl::Duration timeout) {
  Slot* s = slot(i);
  char* at = reinterpret_cast<char*>(s) + kSlotHeaderBytes;
  std::vector<grpc::Slice> slices;
  CHECK(frame.Dump(&slices).ok());
  size_t n = 0;
  for (const grpc::Slice& piece : slices) {
    CHECK_LE(n + piece.size(), kRequestBytes);
    std::memcpy(at + n, piece.begin(), piece.size());
    n += piece.size();
  }
  s->request_bytes.store(static_cast<uint32_t>(n), std::memory_order_relaxed);
  s->timeout_us.store(
      static_cast<uint64_t>(std::max<int64_t>(absl::ToInt64Microseconds(timeout), 0)),
      std::memory_order_relaxed);
  s->state.store(kPosted, std::memory_order_release);
  RingServer();
}

void SharedChannel::PostBytes(uint32_t i, absl::string_view bytes, uint32_t claimed_bytes,
                              uint64_t timeout_us) {
  CHECK_LE(bytes.size(), kRequestBytes);
  Slot* s = slot(i);
  std::memcpy(reinterpret_cast<char*>(s) + kSlotHeaderBytes, bytes.data(), bytes.size());
  s->request_bytes.store(claimed_bytes, std::memory_order_relaxed);
  s->timeout_us.store(timeout_us, std::memory_order_relaxed);
  s->state.store(kPosted, std::memory_order_release);
  RingServer();
}

bool SharedChannel::Unserved(uint32_t i) const {
  return bells()->closed.load(std::memory_order_acquire) != 0 &&
         slot(i)->state.load(std::memory_order_acquire) == kPosted;
}

uint32_t SharedChannel::worker_bell() const {
  return bells()->worker.load(std::memory_order_acquire);
}

std::optional<SharedChannel::Answer> SharedChannel::TakeAnswer(uint32_t i) {
  Slot* s = slot(i);
  if (s->state.load(std::memory_order_acquire) != kAnswered) return std::nullopt;
  const uint32_t n =
      std::min<uint32_t>(s->answer_bytes.load(std::memory_order_relaxed), kAnswerBytes);
  const int32_t code = s->code.load(std::memory_order_relaxed);
  const char* at = reinterpret_cast<const char*>(s) + kSlotHeaderBytes + kRequestBytes;
  Answer answer;
  answer.server_busy = (s->flags.load(std::memory_order_relaxed) & kServerBusy) != 0;
  if (code == 0) {
    grpc::Slice piece(at, n);
    answer.frame = grpc::ByteBuffer(&piece, 1);
  } else if (code > 0 && code <= 16) {
    // Copied out first: the server may rewrite the slot while the message is cleaned, which
    // reads each character twice (found in review, 2026-12-06).
    const std::string message(at, n);
    answer.status = absl::Status(static_cast<absl::StatusCode>(code), PeerMessage(message));
  } else {
    answer.status = absl::InternalError(absl::StrCat("an answer with status code ", code));
  }
  s->state.store(kFree, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  used_[i] = false;
  return answer;
}

void SharedChannel::WaitForAnswers(const std::vector<const SharedChannel*>& channels,
                                   const std::vector<uint32_t>& seen, absl::Time deadline) {
  CHECK_EQ(channels.size(), seen.size());
  for (const SharedChannel* c : channels) c->bells()->worker_sleepers.fetch_add(1);
  absl::Cleanup awake = [&] {
    for (const SharedChannel* c : channels) c->bells()->worker_sleepers.fetch_sub(1);
  };
  for (size_t i = 0; i < channels.size(); ++i) {
    if (channels[i]->bells()->worker.load() != seen[i]) return;
  }
  CHECK(!channels.empty() && channels.size() <= kMaxChannelWaits);
  static_assert(kMaxChannelWaits <= FUTEX_WAITV_MAX);
  if (channels.size() == 1) return Wait(&channels[0]->bells()->worker, seen[0], deadline);
  futex_waitv waiters[kMaxChannelWaits] = {};
  for (size_t i = 0; i < channels.size(); ++i) {
    waiters[i].val = seen[i];
    waiters[i].uaddr = reinterpret_cast<uintptr_t>(&channels[i]->bells()->worker);
    waiters[i].flags = FUTEX_32;
  }
  // futex_waitv takes an absolute CLOCK_MONOTONIC time.
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const absl::Duration left =
      std::min(std::max(deadline - absl::Now(), absl::ZeroDuration()), absl::Seconds(3600));
  const timespec until = absl::ToTimespec(absl::DurationFromTimespec(now) + left);
  if (syscall(SYS_futex_waitv, waiters, channels.size(), 0, &until, CLOCK_MONOTONIC) < 0 &&
      errno == ENOSYS) {
    // A kernel before 5.16: look again soon.
    absl::SleepFor(std::min(left, absl::Microseconds(50)));
  }
}

// ---- Server side.

uint32_t SharedChannel::server_bell() const {
  return bells()->server.load(std::memory_order_acquire);
}

void SharedChannel::WaitForRequests(uint32_t seen, absl::Time deadline) const {
  bells()->server_sleeping.store(1);
  if (bells()->server.load() == seen) Wait(&bells()->server, seen, deadline);
  bells()->server_sleeping.store(0);
}

void SharedChannel::WaitForRequests(const std::vector<const SharedChannel*>& channels,
                                    const std::vector<uint32_t>& seen,
                                    const std::atomic<uint32_t>* control, uint32_t control_seen,
                                    absl::Time deadline) {
  CHECK_EQ(channels.size(), seen.size());
  CHECK_LT(channels.size(), kMaxChannelWaits);
  for (const SharedChannel* c : channels) c->bells()->server_sleeping.store(1);
  absl::Cleanup awake = [&] {
    for (const SharedChannel* c : channels) c->bells()->server_sleeping.store(0);
  };
  if (control->load() != control_seen) return;
  for (size_t i = 0; i < channels.size(); ++i) {
    if (channels[i]->bells()->server.load() != seen[i]) return;
  }
  if (channels.empty()) return Wait(control, control_seen, deadline);
  futex_waitv waiters[kMaxChannelWaits] = {};
  for (size_t i = 0; i < channels.size(); ++i) {
    waiters[i].val = seen[i];
    waiters[i].uaddr = reinterpret_cast<uintptr_t>(&channels[i]->bells()->server);
    waiters[i].flags = FUTEX_32;
  }
  waiters[channels.size()].val = control_seen;
  waiters[channels.size()].uaddr = reinterpret_cast<uintptr_t>(control);
  waiters[channels.size()].flags = FUTEX_32;
  // futex_waitv takes an absolute CLOCK_MONOTONIC time.
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const absl::Duration left =
      std::min(std::max(deadline - absl::Now(), absl::ZeroDuration()), absl::Seconds(3600));
  const timespec until = absl::ToTimespec(absl::DurationFromTimespec(now) + left);
  if (syscall(SYS_futex_waitv, waiters, channels.size() + 1, 0, &until, CLOCK_MONOTONIC) < 0 &&
      errno == ENOSYS) {
    // A kernel before 5.16: look again soon.
    absl::SleepFor(std::min(left, absl::Microseconds(50)));
  }
}

void SharedChannel::RingControl(std::atomic<uint32_t>* control) {
  control->fetch_add(1);
  Wake(control);
}

void SharedChannel::RingServer() {
  bells()->server.fetch_add(1);
  if (bells()->server_sleeping.load() != 0) Wake(&bells()->server);
}

void SharedChannel::RingWorker() {
  bells()->worker.fetch_add(1);
  if (bells()->worker_sleepers.load() != 0) Wake(&bells()->worker);
}

void SharedChannel::Close() {
  bells()->closed.store(1, std::memory_order_release);
  RingWorker();
}

std::optional<SharedChannel::Request> SharedChannel::TakeRequest(uint32_t i) {
  Slot* s = slot(i);
  if (s->state.load(std::memory_order_acquire) != kPosted) return std::nullopt;
  s->state.store(kTaken, std::memory_order_relaxed);
  const uint32_t n = s->request_bytes.load(std::memory_order_relaxed);
  const uint64_t timeout_us = s->timeout_us.load(std::memory_order_relaxed);
  Request request;
  request.timeout = absl::Microseconds(std::min<uint64_t>(timeout_us, uint64_t{1} << 40));
  if (n > kRequestBytes) {
    request.status = absl::InvalidArgumentError(
        absl::StrCat("a request of ", n, " bytes in a channel slot of ", kRequestBytes));
    return request;
  }
  // The one copy: the worker may rewrite the slot while the frame is served.
  grpc::Slice piece(reinterpret_cast<const char*>(s) + kSlotHeaderBytes, n);
  request.frame = grpc::ByteBuffer(&piece, 1);
  return request;
}

void SharedChannel::WriteAnswer(uint32_t i, const absl::Status& status,
                                const grpc::ByteBuffer* frame, bool server_busy) {
  Slot* s = slot(i);
  char* at = reinterpret_cast<char*>(s) + kSlotHeaderBytes + kRequestBytes;
  absl::Status result = status;
  size_t n = 0;
  if (result.ok()) {
    if (frame->Length() <= kAnswerBytes) {
      std::vector<grpc::Slice> slices;
      if (frame->Dump(&slices).ok()) {
        for (const grpc::Slice& piece : slices) {
          std::memcpy(at + n, piece.begin(), piece.size());
          n += piece.size();
        }
      } else {
        result = absl::InternalError("unreadable answer");
      }
    } else {
      result = absl::AbortedError(absl::StrCat("an answer of ", frame->Length(),
                                               " bytes does not fit a channel slot: send the "
                                               "call without shared memory"));
    }
  }
  if (!result.ok()) {
    const absl::string_view message = result.message().substr(0, kAnswerBytes);
    // (An empty message's data() may be null, which memcpy must not be given even for 0 bytes.)
    if (!message.empty()) std::memcpy(at, message.data(), message.size());
    n = message.size();
  }
  s->answer_bytes.store(static_cast<uint32_t>(n), std::memory_order_relaxed);
  s->code.store(static_cast<int32_t>(result.code()), std::memory_order_relaxed);
  s->flags.store(server_busy ? kServerBusy : 0, std::memory_order_relaxed);
  s->state.store(kAnswered, std::memory_order_release);
  RingWorker();
}

}  // namespace ps::common
