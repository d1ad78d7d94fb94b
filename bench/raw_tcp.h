// The raw-TCP baseline of ps_bench: what plain sockets do over the same loopback, so the gRPC
// numbers have something to be compared with.
//
// Wire protocol (both ends in this file): a connection starts with one mode byte.
//   'R' request/reply: repeatedly the client sends an 8-byte little-endian length L and L
//       bytes; the server reads all of them into one buffer, then answers with 8 bytes (L).
//   'S' stream: the client writes until it shuts down its sending side; the server reads and
//       discards, and at EOF answers with 8 bytes: the number of bytes it received.
// Both ends set TCP_NODELAY, as gRPC does.
#ifndef PS_BENCH_RAW_TCP_H_
#define PS_BENCH_RAW_TCP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ps::bench {

// A server on 127.0.0.1 in a thread of this process (plus one thread per connection).
// Thread-safe. STARTED (Start) -> STOPPED (destructor: closes every socket, joins threads).
class RawTcpServer {
 public:
  // Listens on 127.0.0.1:0. INTERNAL naming the failing system call.
  static absl::StatusOr<std::unique_ptr<RawTcpServer>> Start();
  ~RawTcpServer();
  RawTcpServer(const RawTcpServer&) = delete;
  RawTcpServer& operator=(const RawTcpServer&) = delete;

  int port() const { return port_; }

 private:
  RawTcpServer(int listen_fd, int port);
  void AcceptLoop();
  void Serve(int fd);

  // Constant after construction.
  const int listen_fd_;
  const int port_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> connections_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::thread accept_thread_;
};

// One request/reply connection. Thread-compatible: one call at a time.
class RawTcpClient {
 public:
  // Connects to 127.0.0.1:port in request/reply mode. UNAVAILABLE if the connect fails.
  static absl::StatusOr<std::unique_ptr<RawTcpClient>> Connect(int port);
  ~RawTcpClient();
  RawTcpClient(const RawTcpClient&) = delete;
  RawTcpClient& operator=(const RawTcpClient&) = delete;

  // Sends `payload` and waits for the server's reply. UNAVAILABLE on a socket error or a
  // closed connection; INTERNAL if the reply is not the expected length.
  absl::Status Call(const std::string& payload);

 private:
  explicit RawTcpClient(int fd) : fd_(fd) {}
  const int fd_;
};

// Streams `write_size`-byte writes to 127.0.0.1:port for `duration`, then waits until the
// server has received everything. Returns the bandwidth in bytes per second, measured from
// the first write to the server's count arriving. UNAVAILABLE on socket errors.
absl::StatusOr<double> MeasureStreamBandwidth(int port, size_t write_size,
                                              absl::Duration duration);

}  // namespace ps::bench

#endif  // PS_BENCH_RAW_TCP_H_
