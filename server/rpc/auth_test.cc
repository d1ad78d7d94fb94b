// Identities from certificate properties and tokens, and what each role may do, without
// sockets: a fake AuthContext holds the properties gRPC would have read from the peer's
// certificate.
#include "server/rpc/auth.h"

#include <map>
#include <string>
#include <vector>

#include "common/rpc/credentials.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::testing::HasSubstr;

// begin()/end() are never called by the code under test.
class NoProperties : public grpc::AuthPropertyIterator {};

class FakeAuthContext : public grpc::AuthContext {
 public:
  explicit FakeAuthContext(bool authenticated) : authenticated_(authenticated) {}
  bool IsPeerAuthenticated() const override { return authenticated_; }
  std::vector<grpc::string_ref> GetPeerIdentity() const override { return {}; }
  std::string GetPeerIdentityPropertyName() const override { return ""; }
  std::vector<grpc::string_ref> FindPropertyValues(const std::string& name) const override {
    std::vector<grpc::string_ref> out;
    auto range = properties_.equal_range(name);
    for (auto it = range.first; it != range.second; ++it) out.emplace_back(it->second);
    return out;
  }
  grpc::AuthPropertyIterator begin() const override { return NoProperties(); }
  grpc::AuthPropertyIterator end() const override { return NoProperties(); }
  void AddProperty(const std::string& key, const grpc::string_ref& value) override {
    properties_.emplace(key, std::string(value.data(), value.size()));
  }
  bool SetPeerIdentityPropertyName(const std::string&) override { return false; }

 private:
  const bool authenticated_;
  std::multimap<std::string, std::string> properties_;
};

// A TLS peer whose certificate has `uri` as a SAN URI and `cn` as common name.
FakeAuthContext Tls(const std::string& uri, const std::string& cn = "ps client") {
  FakeAuthContext c(true);
  if (!uri.empty()) {
    c.AddProperty("peer_uri", uri);
    c.AddProperty("x509_subject_alternative_name", uri);
  }
  c.AddProperty("x509_common_name", cn);
  return c;
}

TEST(ParseRoleUri, NamesWorkersServersAndOperators) {
  auto w = ParseRoleUri("ps://job/worker/3");
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->role, PeerRole::kWorker);
  EXPECT_EQ(w->index, 3);
  auto s = ParseRoleUri("ps://job/server/0");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->role, PeerRole::kServer);
  auto o = ParseRoleUri("ps://job/operator");
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->role, PeerRole::kOperator);
}

TEST(ParseRoleUri, RefusesAnythingElse) {
  for (const char* uri :
       {"", "ps://job", "ps://job/worker", "ps://job/worker/-1", "ps://job/worker/+1",
        "ps://job/worker/1x", "ps://job/worker/99999999999", "ps://job/admin/1",
        "https://job/worker/1", "ps://job/operator/1", "spiffe://job/worker/1", "localhost"}) {
    EXPECT_FALSE(ParseRoleUri(uri).has_value()) << uri;
  }
}

TEST(PeerAuthorizer, WorkerMayActOnlyAsItself) {
  PeerAuthorizer auth(AuthOptions{});
  FakeAuthContext c = Tls("ps://job/worker/1");
  const PeerIdentity peer = auth.Identify(&c, "ipv4:127.0.0.1:5");
  EXPECT_EQ(peer.role, PeerRole::kWorker);
  EXPECT_EQ(peer.index, 1);
  EXPECT_THAT(auth.CheckWorker(peer, 1, "push"), IsOk());
  EXPECT_THAT(auth.CheckWorker(peer, 0, "push"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("worker 1 (ps://job/worker/1) at ipv4:127.0.0.1:5")));
  // Reading as a tool is fine; administering is not.
  EXPECT_THAT(auth.CheckWorker(peer, -1, "pull"), IsOk());
  EXPECT_THAT(auth.CheckOperator(peer, "shutdown"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("operator")));
}

TEST(PeerAuthorizer, CertificateWithoutRoleMayOnlyRead) {
  // The client-only certificate of older make_certs.sh runs: CN "ps client", no URI.
  PeerAuthorizer auth(AuthOptions{});
  FakeAuthContext c = Tls("");
  const PeerIdentity peer = auth.Identify(&c, "a");
  EXPECT_EQ(peer.role, PeerRole::kUnknown);
  EXPECT_THAT(auth.CheckWorker(peer, -1, "pull"), IsOk());
  EXPECT_THAT(auth.CheckWorker(peer, 0, "push"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(auth.CheckOperator(peer, "shutdown"), StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST(PeerAuthorizer, CommonNameNamesTheRoleWhenThereIsNoUri) {
  PeerAuthorizer auth(AuthOptions{});
  FakeAuthContext c = Tls("", "ps://job/worker/2");
  const PeerIdentity peer = auth.Identify(&c, "a");
  EXPECT_EQ(peer.role, PeerRole::kWorker);
  EXPECT_EQ(peer.index, 2);
}

TEST(PeerAuthorizer, UriWinsOverCommonName) {
  PeerAuthorizer auth(AuthOptions{});
  FakeAuthContext c = Tls("ps://job/worker/2", "ps://job/operator");
  const PeerIdentity peer = auth.Identify(&c, "a");
  EXPECT_EQ(peer.role, PeerRole::kWorker);
  EXPECT_THAT(auth.CheckOperator(peer, "shutdown"), StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST(PeerAuthorizer, CertificateNamingTwoRolesHasNone) {
  PeerAuthorizer auth(AuthOptions{});
  FakeAuthContext c = Tls("ps://job/worker/2");
  c.AddProperty("peer_uri", "ps://job/operator");
  const PeerIdentity peer = auth.Identify(&c, "a");
  EXPECT_EQ(peer.role, PeerRole::kUnknown);
  EXPECT_THAT(auth.CheckWorker(peer, 2, "push"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(auth.CheckOperator(peer, "shutdown"), StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST(PeerAuthorizer, OperatorNeedsItsTokenWhenTheServerHasOne) {
  AuthOptions options;
  options.operator_token_required = true;
  PeerAuthorizer auth(options);
  FakeAuthContext worker_token = Tls("ps://job/operator");
  worker_token.AddProperty(common::kTokenRoleProperty, common::kWorkerTokenRole);
  EXPECT_THAT(auth.CheckOperator(auth.Identify(&worker_token, "a"), "checkpoint"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("token")));
  FakeAuthContext operator_token = Tls("ps://job/operator");
  operator_token.AddProperty(common::kTokenRoleProperty, common::kOperatorTokenRole);
  EXPECT_THAT(auth.CheckOperator(auth.Identify(&operator_token, "a"), "checkpoint"), IsOk());
  // The operator token on a worker's certificate does not make it an operator.
  FakeAuthContext worker_cert = Tls("ps://job/worker/0");
  worker_cert.AddProperty(common::kTokenRoleProperty, common::kOperatorTokenRole);
  EXPECT_THAT(auth.CheckOperator(auth.Identify(&worker_cert, "a"), "checkpoint"),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST(PeerAuthorizer, UnauthenticatedPeerGetsNothingWhenIdentitiesAreChecked) {
  PeerAuthorizer auth(AuthOptions{});
  FakeAuthContext c(false);
  const PeerIdentity peer = auth.Identify(&c, "a");
  EXPECT_THAT(auth.CheckWorker(peer, -1, "pull"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(auth.CheckWorker(peer, 0, "push"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(auth.CheckOperator(peer, "shutdown"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(auth.CheckWorker(auth.Identify(nullptr, "a"), 0, "push"),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST(PeerAuthorizer, PlaintextChecksNothing) {
  AuthOptions options;
  options.check_identities = false;
  PeerAuthorizer auth(options);
  const PeerIdentity peer = auth.Identify(nullptr, "ipv4:1.2.3.4:5");
  EXPECT_EQ(peer.role, PeerRole::kUnchecked);
  EXPECT_THAT(peer.name, HasSubstr("plaintext"));
  EXPECT_THAT(auth.CheckWorker(peer, 0, "push"), IsOk());
  EXPECT_THAT(auth.CheckOperator(peer, "shutdown"), IsOk());
}

}  // namespace
}  // namespace ps::server
