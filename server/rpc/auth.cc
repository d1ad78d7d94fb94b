#include "server/rpc/auth.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/rpc/credentials.h"
#include "grpc/grpc_security_constants.h"

namespace ps::server {
namespace {

std::vector<std::string> Values(const grpc::AuthContext& context, const char* property) {
  std::vector<std::string> out;
  for (const grpc::string_ref& v : context.FindPropertyValues(property)) {
    out.emplace_back(v.data(), v.size());
  }
  return out;
}

const char* RoleName(PeerRole role) {
  switch (role) {
    case PeerRole::kUnchecked:
      return "unchecked peer";
    case PeerRole::kUnknown:
      return "peer of no role";
    case PeerRole::kWorker:
      return "worker";
    case PeerRole::kServer:
      return "server";
    case PeerRole::kOperator:
      return "operator";
  }
  return "peer";
}

// The single role named by the ps:// entries among `uris`: nullopt when none names one, or
// when two name different ones (a certificate must not be two processes at once).
std::optional<NamedRole> SingleRole(const std::vector<std::string>& uris, std::string* source,
                                    bool* conflict) {
  std::optional<NamedRole> found;
  for (const std::string& uri : uris) {
    std::optional<NamedRole> r = ParseRoleUri(uri);
    if (!r.has_value()) continue;
    if (found.has_value() && (found->role != r->role || found->index != r->index)) {
      *conflict = true;
      return std::nullopt;
    }
    found = r;
    *source = uri;
  }
  return found;
}

}  // namespace

std::optional<NamedRole> ParseRoleUri(absl::string_view uri) {
  if (!absl::ConsumePrefix(&uri, "ps://")) return std::nullopt;
  std::vector<absl::string_view> parts = absl::StrSplit(uri, '/');
  // <job>/operator, <job>/server or <job>/<role>/<index>; the job part is the CA's business, not
  // ours.
  if (parts.size() == 2 && parts[1] == "operator") return NamedRole{PeerRole::kOperator, -1};
  // One certificate may serve every server of a job (it names their hosts, not an index).
  if (parts.size() == 2 && parts[1] == "server") return NamedRole{PeerRole::kServer, -1};
  if (parts.size() != 3) return std::nullopt;
  int32_t index = -1;
  if (parts[2].empty() || !absl::SimpleAtoi(parts[2], &index) || index < 0 ||
      parts[2].find_first_not_of("0123456789") != absl::string_view::npos) {
    return std::nullopt;
  }
  if (parts[1] == "worker") return NamedRole{PeerRole::kWorker, index};
  if (parts[1] == "server") return NamedRole{PeerRole::kServer, index};
  return std::nullopt;
}

PeerIdentity PeerAuthorizer::Identify(const grpc::AuthContext* context,
                                      absl::string_view address) const {
  PeerIdentity peer;
  if (!options_.check_identities) {
    peer.role = PeerRole::kUnchecked;
    peer.name = absl::StrCat("unchecked peer (plaintext) at ", address);
    return peer;
  }
  if (context == nullptr || !context->IsPeerAuthenticated()) {
    peer.name = absl::StrCat("unauthenticated peer at ", address);
    return peer;
  }
  peer.authenticated = true;
  for (const std::string& role : Values(*context, common::kTokenRoleProperty)) {
    if (role == common::kOperatorTokenRole) peer.operator_token = true;
  }
  // SAN URIs first (gRPC lists them under peer_uri; older versions only in the SAN list),
  // the common name only when the certificate has no ps:// URI at all.
  std::vector<std::string> uris = Values(*context, GRPC_PEER_URI_PROPERTY_NAME);
  for (std::string& san : Values(*context, GRPC_X509_SAN_PROPERTY_NAME)) {
    uris.push_back(std::move(san));
  }
  std::string source;
  bool conflict = false;
  std::optional<NamedRole> role = SingleRole(uris, &source, &conflict);
  if (!role.has_value() && !conflict) {
    role = SingleRole(Values(*context, GRPC_X509_CN_PROPERTY_NAME), &source, &conflict);
  }
  if (role.has_value()) {
    peer.role = role->role;
    peer.index = role->index;
  }
  std::string what = RoleName(peer.role);
  if (peer.index >= 0) absl::StrAppend(&what, " ", peer.index);
  if (conflict) absl::StrAppend(&what, " (certificate names several roles)");
  if (!source.empty()) absl::StrAppend(&what, " (", source, ")");
  peer.name = absl::StrCat(what, " at ", address);
  return peer;
}

PeerIdentity PeerAuthorizer::Identify(const grpc::CallbackServerContext& context) const {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return Identify(auth.get(), context.peer());
}

absl::Status PeerAuthorizer::CheckWorker(const PeerIdentity& peer, int32_t worker_id,
                                         absl::string_view method) const {
  if (peer.role == PeerRole::kUnchecked) return absl::OkStatus();
  if (worker_id < 0) {
    // A tool reading; an unauthenticated peer cannot exist on a TLS server, but if it did it
    // would get nothing.
    if (peer.authenticated) return absl::OkStatus();
  } else if (peer.role == PeerRole::kWorker && peer.index == worker_id) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat(method, " as worker ", worker_id, " refused: the caller is ", peer.name,
                   "; a worker may only act as the worker its certificate names"));
}

absl::Status PeerAuthorizer::CheckOperator(const PeerIdentity& peer,
                                           absl::string_view method) const {
  if (peer.role == PeerRole::kUnchecked) return absl::OkStatus();
  if (peer.role != PeerRole::kOperator) {
    return absl::PermissionDeniedError(
        absl::StrCat(method,
                     " needs the operator role (a certificate naming ps://<job>/operator); the "
                     "caller is ",
                     peer.name));
  }
  if (options_.operator_token_required && !peer.operator_token) {
    return absl::PermissionDeniedError(
        absl::StrCat(method, " needs the operator role's token (security.operator_token_file); ",
                     peer.name, " sent the worker token"));
  }
  return absl::OkStatus();
}

}  // namespace ps::server
