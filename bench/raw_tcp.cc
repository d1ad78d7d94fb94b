#include "bench/raw_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ps::bench {
namespace {

constexpr char kRequestReply = 'R';
constexpr char kStream = 'S';

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(errno)));
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// Reads exactly n bytes. False on EOF or error (errno set; 0 on EOF).
bool ReadFull(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, data, n);
    if (r == 0) {
      errno = 0;
      return false;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteFull(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The benchmark runs on one machine: host byte order is the wire order on both ends (x86 is
// little-endian, as the header comment says).
bool WriteU64(int fd, uint64_t v) { return WriteFull(fd, reinterpret_cast<char*>(&v), 8); }

// A message: its 8-byte length, then its bytes, in one system call where the kernel takes them
// all (two sends with TCP_NODELAY cost the reference a call and a segment more than a client
// that writes a frame at once).
bool WriteMessage(int fd, const std::string& payload) {
  uint64_t length = payload.size();
  iovec parts[2] = {{&length, sizeof(length)}, {const_cast<char*>(payload.data()), payload.size()}};
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = 2;
  size_t sent = 0;
  const size_t total = sizeof(length) + payload.size();
  while (sent < total) {
    const ssize_t w = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    sent += static_cast<size_t>(w);
    // Step past what went: whole parts, then into the one it stopped in.
    size_t left = static_cast<size_t>(w);
    while (message.msg_iovlen > 0 && left >= message.msg_iov[0].iov_len) {
      left -= message.msg_iov[0].iov_len;
      ++message.msg_iov;
      --message.msg_iovlen;
    }
    if (message.msg_iovlen > 0) {
      message.msg_iov[0].iov_base = static_cast<char*>(message.msg_iov[0].iov_base) + left;
      message.msg_iov[0].iov_len -= left;
    }
  }
  return true;
}
bool ReadU64(int fd, uint64_t* v) { return ReadFull(fd, reinterpret_cast<char*>(v), 8); }

absl::StatusOr<int> ConnectLoopback(int port, char mode) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  sockaddr_in addr = Loopback(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    absl::Status s = Errno(absl::StrCat("connect 127.0.0.1:", port));
    close(fd);
    return s;
  }
  SetNoDelay(fd);
  if (!WriteFull(fd, &mode, 1)) {
    absl::Status s = Errno("send mode byte");
    close(fd);
    return s;
  }
  return fd;
}

}  // namespace

// ---- Server -------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RawTcpServer>> RawTcpServer::Start() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    absl::Status s = absl::InternalError(absl::StrCat("listen on 127.0.0.1: ", strerror(errno)));
    close(fd);
    return s;
  }
  return std::unique_ptr<RawTcpServer>(new RawTcpServer(fd, ntohs(addr.sin_port)));
}

RawTcpServer::RawTcpServer(int listen_fd, int port) : listen_fd_(listen_fd), port_(port) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

RawTcpServer::~RawTcpServer() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // shutdown() wakes threads blocked in accept()/read() on these sockets; close() alone
    // does not.
    shutdown(listen_fd_, SHUT_RDWR);
    for (int fd : connections_) shutdown(fd, SHUT_RDWR);
  }
  accept_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
  close(listen_fd_);
}

void RawTcpServer::AcceptLoop() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      if (fd >= 0) close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    SetNoDelay(fd);
    connections_.push_back(fd);
    threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void RawTcpServer::Serve(int fd) {
  char mode = 0;
  if (ReadFull(fd, &mode, 1)) {
    if (mode == kRequestReply) {
      std::string buffer;
      uint64_t size = 0;
      while (ReadU64(fd, &size)) {
        // Reading into one contiguous buffer is what a server must do with a request it
        // parses; it is also what makes this comparable with gRPC's receive path.
        if (buffer.size() < size) buffer.resize(size);
        if (!ReadFull(fd, buffer.data(), size) || !WriteU64(fd, size)) break;
      }
    } else if (mode == kStream) {
      std::string buffer(4 << 20, '\0');
      uint64_t total = 0;
      while (true) {
        const ssize_t r = read(fd, buffer.data(), buffer.size());
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        total += static_cast<uint64_t>(r);
      }
      WriteU64(fd, total);
    }
  }
  absl::MutexLock lock(&mu_);
  // The destructor may be shutting this socket down; closing under the lock keeps it from
  // touching a reused descriptor number.
  connections_.erase(std::remove(connections_.begin(), connections_.end(), fd),
                     connections_.end());
  close(fd);
}

// ---- Clients ------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RawTcpClient>> RawTcpClient::Connect(int port) {
  absl::StatusOr<int> fd = ConnectLoopback(port, kRequestReply);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<RawTcpClient>(new RawTcpClient(*fd));
}

RawTcpClient::~RawTcpClient() { close(fd_); }

absl::Status RawTcpClient::Call(const std::string& payload) {
  if (!WriteMessage(fd_, payload)) return Errno("raw tcp send");
  uint64_t reply = 0;
  if (!ReadU64(fd_, &reply)) return Errno("raw tcp reply");
  if (reply != payload.size()) {
    return absl::InternalError(
        absl::StrCat("raw tcp reply says ", reply, " bytes, sent ", payload.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> MeasureStreamBandwidth(int port, size_t write_size,
                                              absl::Duration duration) {
  absl::StatusOr<int> fd = ConnectLoopback(port, kStream);
  if (!fd.ok()) return fd.status();
  const std::string chunk(write_size, 'x');
  const absl::Time start = absl::Now();
  absl::Status status;
  while (absl::Now() < start + duration) {
    if (!WriteFull(*fd, chunk.data(), chunk.size())) {
      status = Errno("raw tcp stream send");
      break;
    }
  }
  uint64_t received = 0;
  if (status.ok()) {
    shutdown(*fd, SHUT_WR);
    if (!ReadU64(*fd, &received)) status = Errno("raw tcp stream count");
  }
  const absl::Time end = absl::Now();
  close(*fd);
  if (!status.ok()) return status;
  return static_cast<double>(received) / absl::ToDoubleSeconds(end - start);
}

}  // namespace ps::bench
