#include "common/metrics/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace ps::common::metrics {
namespace {

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// After the answer, how long and how much the server reads of what the client still sends
// before closing (so that the close does not reset the connection under the answer).
constexpr absl::Duration kLingerTime = absl::Milliseconds(500);
constexpr size_t kLingerBytes = 1 << 16;
// Connections served at once; beyond it, a new one displaces the one nearest its deadline.
constexpr size_t kMaxConnections = 64;
// How long the listening socket goes unwatched after accept() failed for want of descriptors
// or memory: the connection stays in the backlog and the socket stays readable, so watching it
// at once again would spin the thread until something else frees a descriptor.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);

std::string Answer(int code, absl::string_view reason, absl::string_view content_type,
                   absl::string_view body, bool head_only, absl::string_view extra = "") {
  std::string out =
      absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n", extra, "\r\n");
  if (!head_only) out.append(body.data(), body.size());
  return out;
}

std::string Error(int code, absl::string_view reason, bool head_only = false,
                  absl::string_view extra = "") {
  return Answer(code, reason, "text/plain; charset=utf-8", absl::StrCat(code, " ", reason, "\n"),
                head_only, extra);
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (absl::ascii_iscntrl(static_cast<unsigned char>(c)) || c == ' ' || c == '\t' ||
        absl::StrContains("()<>@,;:\\\"/[]?={}", c)) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const HttpServerOptions& options, const Registry* registry) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port ", options.port, " is out of range [0, 65535]"));
  }
  if (options.max_request_bytes == 0 || options.io_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "metrics endpoint: max_request_bytes and io_timeout must be > 0");
  }
  if (options.min_render_interval < absl::ZeroDuration() ||
      options.min_render_interval >= options.io_timeout) {
    return absl::InvalidArgumentError(
        "metrics endpoint: min_render_interval must be >= 0 and below io_timeout");
  }
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  const std::string port = absl::StrCat(options.port);
  // "[::1]", as gRPC's addresses write IPv6, is "::1" to getaddrinfo.
  std::string host = options.host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const int gai =
      getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &addresses);
  if (gai != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics host '", options.host, "': ", gai_strerror(gai)));
  }
  int fd = -1;
  std::string error = "no address";
  for (addrinfo* a = addresses; a != nullptr && fd < 0; a = a->ai_next) {
    // Non-blocking: the loop accepts until none is pending.
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      error = strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      error = strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(addresses);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("metrics endpoint: cannot listen on ", options.host,
                                               ":", options.port, ": ", error));
  }
  sockaddr_storage bound;
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const std::string e = strerror(errno);
    close(fd);
    return absl::InternalError(absl::StrCat("metrics endpoint: pipe: ", e));
  }
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(options, registry, fd, bound_port, wake[0], wake[1]));
}

MetricsHttpServer::MetricsHttpServer(const HttpServerOptions& options, const Registry* registry,
                                     int listen_fd, int port, int wake_read, int wake_write)
    : options_(options),
      registry_(registry),
      listen_fd_(listen_fd),
      port_(port),
      wake_read_(wake_read),
      wake_write_(wake_write) {
  thread_ = std::thread([this] { Loop(); });
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  const char byte = 0;
  while (write(wake_write_, &byte, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  close(listen_fd_);
  close(wake_read_);
  close(wake_write_);
}

// One client connection, advanced by the loop as its socket becomes ready; never blocks.
struct MetricsHttpServer::Connection {
  // kRendering: a complete /metrics request, waiting for the next render.
  enum class Phase { kReading, kRendering, kWriting, kLingering };
  int fd = -1;
  Phase phase = Phase::kReading;
  std::string in;        // The request head read so far.
  std::string out;       // The answer.
  size_t sent = 0;       // Bytes of `out` sent.
  size_t drained = 0;    // Bytes read and dropped while lingering.
  absl::Time deadline;   // For the whole exchange (io_timeout), or the end of lingering.
  bool head_only = false;  // A HEAD request (kRendering).
  bool done = false;     // To be closed.
};

void MetricsHttpServer::Loop() {
  std::vector<Connection> conns;
  while (true) {
    const bool accept_paused = absl::Now() < accept_resume_;
    std::vector<pollfd> fds = {{listen_fd_, static_cast<short>(accept_paused ? 0 : POLLIN), 0},
                               {wake_read_, POLLIN, 0}};
    absl::Time next = accept_paused ? accept_resume_ : absl::InfiniteFuture();
    for (const Connection& c : conns) {
      // A connection waiting for a render is watched for errors and hang-ups only.
      const short events = c.phase == Connection::Phase::kWriting     ? POLLOUT
                           : c.phase == Connection::Phase::kRendering ? 0
                                                                      : POLLIN;
      fds.push_back({c.fd, events, 0});
      next = std::min(next, c.deadline);
      if (c.phase == Connection::Phase::kRendering) {
        next = std::min(next, last_render_ + options_.min_render_interval);
      }
    }
    const int timeout_ms =
        next == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::max<int64_t>(
                  0, absl::ToInt64Milliseconds(next - absl::Now()) + 1));
    const int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      LOG(ERROR) << "metrics endpoint: poll: " << strerror(errno) << "; stopping";
      break;
    }
    if (n > 0 && (fds[1].revents & POLLIN) != 0) break;
    for (size_t i = 0; n > 0 && i < conns.size(); ++i) {
      if (fds[i + 2].revents != 0) Advance(&conns[i]);
    }
    RenderForWaiting(&conns);
    const absl::Time now = absl::Now();
    for (Connection& c : conns) {
      if (!c.done && now >= c.deadline) Expire(&c);
    }
    CloseDone(&conns);
    if (n > 0 && (fds[0].revents & POLLIN) != 0) Accept(&conns);
  }
  for (Connection& c : conns) close(c.fd);
}

void MetricsHttpServer::Accept(std::vector<Connection>* conns) {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // EAGAIN: none left; ECONNABORTED and the like: that client gave up already.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        LOG_EVERY_T(WARNING, 10) << "metrics endpoint: accept: " << strerror(errno)
                                 << "; not accepting for " << kAcceptPause;
        accept_resume_ = absl::Now() + kAcceptPause;
      }
      return;
    }
    if (conns->size() >= kMaxConnections) {
      // Full: one that has sent nothing goes first, then one with half a request, then one
      // being answered (before 2026-12-05 the oldest went, so a stream of connections that
      // send nothing displaced every scrape in progress); the one nearest its deadline among
      // them.
      auto rank = [](const Connection& c) {
        if (c.phase != Connection::Phase::kReading) return 2;
        return c.in.empty() ? 0 : 1;
      };
      auto victim = std::min_element(conns->begin(), conns->end(),
                                     [&](const Connection& a, const Connection& b) {
                                       if (rank(a) != rank(b)) return rank(a) < rank(b);
                                       return a.deadline < b.deadline;
                                     });
      close(victim->fd);
      conns->erase(victim);
    }
    Connection c;
    c.fd = fd;
    c.deadline = absl::Now() + options_.io_timeout;
    conns->push_back(std::move(c));
  }
}

void MetricsHttpServer::CloseDone(std::vector<Connection>* conns) {
  auto done = std::remove_if(conns->begin(), conns->end(), [](const Connection& c) {
    if (c.done) close(c.fd);
    return c.done;
  });
  conns->erase(done, conns->end());
}

void MetricsHttpServer::RenderForWaiting(std::vector<Connection>* conns) {
  const absl::Time now = absl::Now();
  if (now < last_render_ + options_.min_render_interval) return;
  std::string body;
  bool rendered = false;
  for (Connection& c : *conns) {
    if (c.done || c.phase != Connection::Phase::kRendering) continue;
    if (!rendered) {
      body = registry_->Render();
      last_render_ = now;
      rendered = true;
    }
    StartAnswer(&c, Answer(200, "OK", kMetricsContentType, body, c.head_only));
  }
}

void MetricsHttpServer::Expire(Connection* c) {
  if (c->phase == Connection::Phase::kReading && !c->in.empty()) {
    StartAnswer(c, Error(408, "Request Timeout"));
    c->deadline = absl::Now() + kLingerTime;  // A short grace to take the 408.
    return;
  }
  c->done = true;  // Idle, a client that does not read its answer, or lingering is over.
}

void MetricsHttpServer::StartAnswer(Connection* c, std::string answer) {
  c->out = std::move(answer);
  c->sent = 0;
  c->phase = Connection::Phase::kWriting;
  Advance(c);
}

void MetricsHttpServer::Advance(Connection* c) {
  char buf[4096];
  switch (c->phase) {
    case Connection::Phase::kReading: {
      const ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        // Closed (or reset) without a request; or the head ended early.
        if (c->in.empty()) {
          c->done = true;
        } else {
          StartAnswer(c, Error(400, "Bad Request"));
        }
        return;
      }
      // Search from a few bytes before the new data: the terminator may straddle reads.
      const size_t from = c->in.size() >= 3 ? c->in.size() - 3 : 0;
      c->in.append(buf, n);
      size_t head_end = c->in.find("\r\n\r\n", from);
      if (head_end == std::string::npos) head_end = c->in.find("\n\n", from);
      if (head_end == std::string::npos) {
        if (c->in.size() > options_.max_request_bytes) {
          StartAnswer(c, Error(431, "Request Header Fields Too Large"));
        }
        return;
      }
      if (head_end > options_.max_request_bytes) {
        StartAnswer(c, Error(431, "Request Header Fields Too Large"));
        return;
      }
      std::string answer = Respond(absl::string_view(c->in).substr(0, head_end), &c->head_only);
      if (answer.empty()) {
        // Answered by RenderForWaiting within min_render_interval: the connection's own
        // deadline (from its accept) must not close it first, unanswered.
        c->phase = Connection::Phase::kRendering;
        c->deadline =
            std::max(c->deadline, absl::Now() + options_.min_render_interval + kLingerTime);
        return;
      }
      StartAnswer(c, std::move(answer));
      return;
    }
    case Connection::Phase::kRendering: {
      c->done = true;  // an error or a hang-up: nobody to answer
      return;
    }
    case Connection::Phase::kWriting: {
      while (c->sent < c->out.size()) {
        const ssize_t n =
            send(c->fd, c->out.data() + c->sent, c->out.size() - c->sent, MSG_NOSIGNAL);
        if (n > 0) {
          c->sent += n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
          return;
        } else {
          c->done = true;  // the client went away
          return;
        }
      }
      // Graceful close: no more from us, then read (and drop) until the client closes.
      shutdown(c->fd, SHUT_WR);
      c->phase = Connection::Phase::kLingering;
      c->deadline = std::min(c->deadline, absl::Now() + kLingerTime);
      return;
    }
    case Connection::Phase::kLingering: {
      const ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        c->done = true;
        return;
      }
      c->drained += n;
      if (c->drained >= kLingerBytes) c->done = true;
      return;
    }
  }
}

std::string MetricsHttpServer::Respond(absl::string_view head, bool* head_only_out) const {
  // Lines end in CRLF; a bare LF is accepted too (RFC 9112 section 2.2).
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  for (absl::string_view& line : lines) absl::ConsumeSuffix(&line, "\r");
  // Request line: method SP request-target SP HTTP-version.
  const std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3 || !IsToken(parts[0]) || !absl::StartsWith(parts[1], "/") ||
      (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0")) {
    return Error(400, "Bad Request");
  }
  const absl::string_view method = parts[0];
  const bool head_only = method == "HEAD";
  *head_only_out = head_only;
  bool has_host = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos || !IsToken(lines[i].substr(0, colon))) {
      return Error(400, "Bad Request", head_only);
    }
    if (absl::EqualsIgnoreCase(lines[i].substr(0, colon), "host")) has_host = true;
  }
  if (parts[2] == "HTTP/1.1" && !has_host) return Error(400, "Bad Request", head_only);
  if (method != "GET" && !head_only) {
    return Error(405, "Method Not Allowed", false, "Allow: GET, HEAD\r\n");
  }
  absl::string_view path = parts[1];
  path = path.substr(0, path.find('?'));
  if (path == "/metrics") return "";  // rendered for every request waiting at once
  if (path == "/healthz") {
    return Answer(200, "OK", "text/plain; charset=utf-8", "ok\n", head_only);
  }
  return Error(404, "Not Found", head_only);
}

}  // namespace ps::common::metrics
