// MetricsHttpServer: the HTTP endpoint Prometheus scrapes. Plain sockets, one thread.
//
//   GET /metrics  200, the registry in the text format 0.0.4
//                 (Content-Type: text/plain; version=0.0.4; charset=utf-8)
//   GET /healthz  200, "ok"
//   HEAD          as GET, without the body
//   other paths   404; other methods 405 (with Allow: GET, HEAD)
//   malformed     400 (request line, header lines, version other than HTTP/1.0 or 1.1,
//                 HTTP/1.1 without Host); a request head over max_request_bytes gets 431;
//                 a head not complete within io_timeout gets 408 (or nothing, if the
//                 client sent nothing)
//
// Every answer carries Content-Length and "Connection: close", and the connection is then
// closed gracefully: the server stops sending (shutdown), reads what the client still sends
// (a body it did not need) until the client closes or a short time passes, then closes, so
// that the client sees the whole answer and no reset.
//
// One thread serves every connection with non-blocking sockets and poll(): idle or slow
// clients never delay a scrape (each connection is closed at its own io_timeout), and at most
// 64 are kept open: a new one displaces one that has sent nothing yet, else one with half a
// request, else one being answered; the one nearest its deadline among them.
//
// The registry is rendered at most once per min_render_interval: a /metrics request that
// comes sooner waits for the next render, which answers every request waiting then. Each
// answer is rendered after its request arrived (never an older one), and a client that
// scrapes in a loop makes the server render (and read the stats of the process, whose
// locks the data path takes too) at most 1 / min_render_interval times a second.
#ifndef PS_COMMON_METRICS_HTTP_SERVER_H_
#define PS_COMMON_METRICS_HTTP_SERVER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"

namespace ps::common::metrics {

struct HttpServerOptions {
  // Address to listen on: an IPv4 or IPv6 address or a host name; "0.0.0.0" = every IPv4
  // interface, "::" = every interface.
  std::string host = "0.0.0.0";
  // Port; 0 picks a free one (see port()). REQUIRES: 0..65535.
  int port = 0;
  // Longest request head (request line and headers, bytes) served; longer gets 431.
  // REQUIRES: > 0.
  size_t max_request_bytes = 8192;
  // Time one connection gets to send its request and take its answer. REQUIRES: > 0.
  absl::Duration io_timeout = absl::Seconds(5);
  // Least time between two renders of the registry (see above); zero = none.
  // REQUIRES: >= 0 and < io_timeout.
  absl::Duration min_render_interval = absl::Milliseconds(100);
};

// Thread-safe. STARTED by Start(), STOPPED by Stop() or the destructor.
class MetricsHttpServer {
 public:
  // Binds, listens and starts the serving thread. `registry` is not owned and must outlive
  // the server. INVALID_ARGUMENT for a bad option or a host that does not resolve;
  // UNAVAILABLE when the address cannot be bound (in use, not local).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const HttpServerOptions& options,
                                                                  const Registry* registry);
  ~MetricsHttpServer();

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The port it listens on (the chosen one when options.port was 0).
  int port() const { return port_; }
  // Closes the listening socket and joins the thread; a connection being served is cut.
  // Idempotent.
  void Stop();

 private:
  MetricsHttpServer(const HttpServerOptions& options, const Registry* registry, int listen_fd,
                    int port, int wake_read, int wake_write);
  struct Connection;
  void Loop();
  void Accept(std::vector<Connection>* conns);
  static void CloseDone(std::vector<Connection>* conns);
  // Reads or writes what `c`'s socket is ready for, without blocking.
  void Advance(Connection* c);
  void StartAnswer(Connection* c, std::string answer);
  void Expire(Connection* c);
  // The answer to a complete request head; empty for a /metrics request, which waits for
  // the next render (`head_only` for a HEAD request).
  std::string Respond(absl::string_view head, bool* head_only) const;
  // Answers the /metrics requests waiting, with one render, if the interval allows it now.
  void RenderForWaiting(std::vector<Connection>* conns);

  // Constant after construction.
  const HttpServerOptions options_;
  const Registry* const registry_;  // Not owned.
  const int listen_fd_;
  const int port_;
  const int wake_read_;  // Stop() writes to wake_write_ to end the loop
  const int wake_write_;

  // The serving thread's.
  absl::Time last_render_ = absl::InfinitePast();
  // Until then the listening socket is not watched (accept() ran out of descriptors).
  absl::Time accept_resume_ = absl::InfinitePast();

  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps::common::metrics

#endif  // PS_COMMON_METRICS_HTTP_SERVER_H_
