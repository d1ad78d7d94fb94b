#include "worker/rpc/unanswered.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ps::worker {

NotAnsweringLog::NotAnsweringLog(std::vector<std::string> addresses, absl::Duration deadline)
    : addresses_(std::move(addresses)), deadline_(deadline) {}

std::string NotAnsweringLog::OnRetry(uint32_t server, uint32_t attempt,
                                     const absl::Status& status, absl::Time now) {
  absl::Time since;
  {
    absl::MutexLock lock(&mu_);
    auto [it, first] = silent_since_.emplace(server, now);
    // A DEADLINE_EXCEEDED attempt started one deadline ago.
    if (first && absl::IsDeadlineExceeded(status)) it->second = now - deadline_;
    since = it->second;
  }
  const std::string address = server < addresses_.size() ? addresses_[server] : "?";
  return absl::StrFormat("server %d (%s) not answering for %.0f s, retrying (attempt %d: %s)",
                         server, address, absl::ToDoubleSeconds(now - since), attempt,
                         status.ToString());
}

void NotAnsweringLog::OnAnswer(uint32_t server) {
  absl::MutexLock lock(&mu_);
  silent_since_.erase(server);
}

std::optional<absl::Status> TlsHandshakeFailure(const absl::Status& status, uint32_t server,
                                                absl::string_view address) {
  if (status.ok()) return std::nullopt;
  const std::string message = absl::AsciiStrToLower(status.message());
  // The words gRPC's TLS layer (OpenSSL or BoringSSL) uses in its connect errors.
  bool tls = false;
  for (absl::string_view word : {"handshake", "ssl", "certificate", "tls"}) {
    tls = tls || absl::StrContains(message, word);
  }
  if (!tls) return std::nullopt;
  return absl::UnavailableError(absl::StrCat(
      "server ", server, " (", address, "): TLS handshake failed: ", status.message(),
      "; check security.ca_cert, cert and key against the server's"));
}

}  // namespace ps::worker
