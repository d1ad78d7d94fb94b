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

// Waits until `fd` is ready for `events`, the deadline passes (false) or Stop() is called
// (false).
bool WaitFor(int fd, short events, int wake_fd, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    const int n = poll(fds, 2, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || (fds[1].revents & POLLIN) != 0) return false;
    if (n > 0 && fds[0].revents != 0) return true;
  }
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
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  const std::string port = absl::StrCat(options.port);
  const int gai = getaddrinfo(options.host.empty() ? nullptr : options.host.c_str(), port.c_str(),
                              &hints, &addresses);
  if (gai != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics host '", options.host, "': ", gai_strerror(gai)));
  }
  int fd = -1;
  std::string error = "no address";
  for (addrinfo* a = addresses; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
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

void MetricsHttpServer::Loop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    const int n = poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "metrics endpoint: poll: " << strerror(errno) << "; stopping";
      return;
    }
    if ((fds[1].revents & POLLIN) != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // the client gave up already, or out of descriptors for now
    Serve(fd);
    close(fd);
  }
}

void MetricsHttpServer::Serve(int fd) {
  const absl::Time deadline = absl::Now() + options_.io_timeout;
  // Read the request head: up to the empty line that ends the headers.
  std::string request;
  std::string answer;
  size_t head_end = std::string::npos;
  char buf[4096];
  while (head_end == std::string::npos) {
    if (request.size() > options_.max_request_bytes) {
      answer = Error(431, "Request Header Fields Too Large");
      break;
    }
    if (!WaitFor(fd, POLLIN, wake_read_, deadline)) {
      if (request.empty()) return;  // an idle connection: nothing to answer
      answer = Error(408, "Request Timeout");
      break;
    }
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) {
      if (request.empty()) return;         // closed (or reset) without a request
      answer = Error(400, "Bad Request");  // the head ended early
      break;
    }
    // Search from a few bytes before the new data: the terminator may straddle reads.
    const size_t from = request.size() >= 3 ? request.size() - 3 : 0;
    request.append(buf, n);
    head_end = request.find("\r\n\r\n", from);
    if (head_end == std::string::npos) head_end = request.find("\n\n", from);
  }
  if (answer.empty()) {
    answer = head_end > options_.max_request_bytes
                 ? Error(431, "Request Header Fields Too Large")
                 : Respond(absl::string_view(request).substr(0, head_end));
  }
  // Send it all.
  size_t sent = 0;
  while (sent < answer.size()) {
    const ssize_t n = send(fd, answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!WaitFor(fd, POLLOUT, wake_read_, deadline)) return;
    } else {
      return;  // the client went away
    }
  }
  // Graceful close: no more from us, then read (and drop) until the client closes.
  shutdown(fd, SHUT_WR);
  const absl::Time linger_end = std::min(deadline, absl::Now() + kLingerTime);
  size_t drained = 0;
  while (drained < kLingerBytes && WaitFor(fd, POLLIN, wake_read_, linger_end)) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) break;
    drained += n;
  }
}

std::string MetricsHttpServer::Respond(absl::string_view head) const {
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
  if (path == "/metrics") {
    return Answer(200, "OK", kMetricsContentType, registry_->Render(), head_only);
  }
  if (path == "/healthz") {
    return Answer(200, "OK", "text/plain; charset=utf-8", "ok\n", head_only);
  }
  return Error(404, "Not Found", head_only);
}

}  // namespace ps::common::metrics
