// Who is calling, from the connection, never from the request: the peer's certificate (mutual
// TLS) names a role and an index, and the bearer token the call carried names a role too.
//
// Certificates. The role is read from a subjectAltName URI of the form
//   ps://<job>/worker/<i>    a worker process, index i in [0, cluster.num_workers)
//   ps://<job>/server[/<i>]  a parameter server
//   ps://<job>/operator      an operator (psctl): admin calls
// or, when the certificate has no such URI, from its common name written the same way.
// tools/make_certs.sh issues one certificate per process this way. A certificate naming no
// role (or two different ones) is a peer of unknown role: it may read (pulls as a tool,
// Stats, ServerInfo) but never push, pull as a worker, heartbeat or administer.
//
// Tokens. Servers accept the worker role's token (security.token_file) and, when
// security.operator_token_file is set, the operator role's; common/rpc/credentials.cc checks
// the token and records which role it belongs to in the call's AuthContext
// (common::kTokenRoleProperty). Admin calls then need the operator token as well as the
// operator certificate.
//
// Plaintext. Without TLS there is no identity to check: every call is a peer of role
// kUnchecked, which the rules let through (the server warns at start that identities are not
// checked). Validation of the request itself (worker ranges, incarnations, sequences) still
// applies.
#ifndef PS_SERVER_RPC_AUTH_H_
#define PS_SERVER_RPC_AUTH_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace ps::server {

enum class PeerRole {
  kUnchecked,  // plaintext server: identities are not checked
  kUnknown,    // authenticated, but its certificate names no (single) role
  kWorker,
  kServer,
  kOperator,
};

struct PeerIdentity {
  PeerRole role = PeerRole::kUnknown;
  // Workers and servers: the index the certificate names; -1 otherwise.
  int32_t index = -1;
  // TLS verified the peer's certificate (always, on a TLS server).
  bool authenticated = false;
  // The call carried the operator role's bearer token.
  bool operator_token = false;
  // For logs and errors, e.g. "worker 3 (ps://job/worker/3) at ipv4:10.0.0.7:51234".
  std::string name;
  // A worker's shared-memory channel: the incarnation of the process its segment was offered
  // to, which every frame through it must carry (nullopt: not a channel).
  std::optional<uint64_t> channel_incarnation;
};

// The role and index named by `uri` ("ps://<job>/worker/3", ...), or nullopt when it names
// none (another scheme, an unknown role, an index that is not a non-negative int32).
struct NamedRole {
  PeerRole role;
  int32_t index;
};
std::optional<NamedRole> ParseRoleUri(absl::string_view uri);

struct AuthOptions {
  // False only for a plaintext server (security.plaintext): every peer is then kUnchecked.
  // True: a peer that is not TLS-authenticated gets PERMISSION_DENIED for everything but
  // reads.
  bool check_identities = true;
  // Admin calls need the operator role's token too (security.operator_token_file is set).
  bool operator_token_required = false;
};

// Thread-safe (immutable).
class PeerAuthorizer {
 public:
  explicit PeerAuthorizer(const AuthOptions& options) : options_(options) {}

  // The identity of the peer of a call, from its AuthContext (nullptr = none) and its
  // address (grpc::ServerContext::peer(), for the name only).
  PeerIdentity Identify(const grpc::AuthContext* context, absl::string_view address) const;
  PeerIdentity Identify(const grpc::CallbackServerContext& context) const;

  // A call that acts as worker `worker_id` (pushes, heartbeats, and pulls with
  // worker_id >= 0, which count in the consistency bound). OK when the peer is that worker,
  // or unchecked; PERMISSION_DENIED naming the peer otherwise. A negative worker_id is a tool
  // reading, allowed to every authenticated peer (pushes with one are refused by the shard's
  // validation, INVALID_ARGUMENT).
  absl::Status CheckWorker(const PeerIdentity& peer, int32_t worker_id,
                           absl::string_view method) const;
  // Admin calls (Shutdown, Checkpoint): OK for an operator (with the operator token when
  // options.operator_token_required) or an unchecked peer; PERMISSION_DENIED otherwise.
  absl::Status CheckOperator(const PeerIdentity& peer, absl::string_view method) const;

 private:
  const AuthOptions options_;
};

}  // namespace ps::server

#endif  // PS_SERVER_RPC_AUTH_H_
