// What a worker says when a server does not answer: one line per retry that names the server,
// its address and how long it has been silent, and a clear error when the TLS handshake fails
// (gRPC otherwise reports only UNAVAILABLE or, for calls waiting for the channel to be ready,
// DEADLINE_EXCEEDED, and the reason is lost).
#ifndef PS_WORKER_RPC_UNANSWERED_H_
#define PS_WORKER_RPC_UNANSWERED_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ps::worker {

// Tracks, per server, since when calls have gone unanswered. Thread-safe.
class NotAnsweringLog {
 public:
  // `addresses[i]` is server i's address; `deadline` is the deadline of one attempt.
  NotAnsweringLog(std::vector<std::string> addresses, absl::Duration deadline);

  // Called before a retry of server `server` after `status` (UNAVAILABLE or DEADLINE_EXCEEDED)
  // at `now`. Returns the line to log: "server N (addr) not answering for S s, retrying
  // (attempt k: status)", where S counts from the start of the first unanswered attempt (one
  // deadline before a DEADLINE_EXCEEDED).
  std::string OnRetry(uint32_t server, uint32_t attempt, const absl::Status& status,
                      absl::Time now);
  // Server `server` answered: its silence is over.
  void OnAnswer(uint32_t server);

 private:
  const std::vector<std::string> addresses_;
  const absl::Duration deadline_;
  absl::Mutex mu_;
  std::map<uint32_t, absl::Time> silent_since_ ABSL_GUARDED_BY(mu_);
};

// If `status` (of a call made without waiting for the channel to be ready) says the TLS
// handshake with server `server` at `address` failed, the error to stop with: UNAVAILABLE
// "server N (addr): TLS handshake failed: <gRPC's reason>; check security.ca_cert, cert and
// key against the server's". nullopt otherwise.
std::optional<absl::Status> TlsHandshakeFailure(const absl::Status& status, uint32_t server,
                                                absl::string_view address);

}  // namespace ps::worker

#endif  // PS_WORKER_RPC_UNANSWERED_H_
