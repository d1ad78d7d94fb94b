#include "common/rpc/credentials.h"

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/rpc/cert_validity.h"
#include "common/status_macros.h"

namespace ps::common {
namespace {

// Compares in time that depends only on the lengths, so that response times do not reveal
// how much of a guessed token was right.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Checks "authorization: Bearer <token>" on every call against the worker role's token and
// the operator role's (either may be empty = not accepted), and records the role of the one
// that matched in the call's AuthContext. Thread-safe (immutable).
class TokenChecker final : public grpc::AuthMetadataProcessor {
 public:
  TokenChecker(std::string worker_token, std::string operator_token)
      : worker_token_(std::move(worker_token)), operator_token_(std::move(operator_token)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* /*consumed*/, OutputMetadata* /*response*/) override {
    auto it = auth_metadata.find("authorization");
    if (it == auth_metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing bearer token");
    }
    absl::string_view value(it->second.data(), it->second.size());
    if (!absl::ConsumePrefix(&value, "Bearer ")) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
    }
    // Both comparisons always run, so the time taken does not say which role came close.
    const bool worker = !worker_token_.empty() && ConstantTimeEquals(value, worker_token_);
    const bool op = !operator_token_.empty() && ConstantTimeEquals(value, operator_token_);
    if (!worker && !op) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
    }
    context->AddProperty(kTokenRoleProperty, op ? kOperatorTokenRole : kWorkerTokenRole);
    return grpc::Status::OK;
  }

 private:
  const std::string worker_token_;
  const std::string operator_token_;
};

// Adds the bearer token to every call.
class TokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenPlugin(std::string token) : token_(std::move(token)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->emplace("authorization", "Bearer " + token_);
    return grpc::Status::OK;
  }

 private:
  const std::string token_;
};

// The token in `path` (security.<field>), whitespace trimmed; "" when no file is named.
absl::StatusOr<std::string> ReadToken(const std::string& path, absl::string_view field) {
  if (path.empty()) return std::string();
  ASSIGN_OR_RETURN(std::string token, ReadFileToString(path), absl::StrCat("security.", field));
  std::string trimmed(absl::StripAsciiWhitespace(token));
  if (trimmed.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("security.", field, " ", path, " is empty"));
  }
  return trimmed;
}

absl::StatusOr<std::string> ReadToken(const SecurityConfig& security) {
  return ReadToken(security.token_file(), "token_file");
}

// Reads a PEM file named by security.<field>. An empty file must not get through: gRPC
// takes an empty root certificate string to mean "the system's default roots", so a client
// with an empty ca_cert would trust any publicly certified server (and send it the token)
// instead of only the job's CA.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view field) {
  ASSIGN_OR_RETURN(std::string pem, ReadFileToString(path), absl::StrCat("security.", field));
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.", field, ": ", path, " holds no PEM block"));
  }
  return pem;
}

// Reads a certificate file (security.cert or security.ca_cert) and refuses it when a
// certificate in it has expired or is not valid yet: gRPC would load it, and every handshake
// would then fail with nothing but UNAVAILABLE or DEADLINE_EXCEEDED on the peer's side.
absl::StatusOr<std::string> ReadCertFile(const std::string& path, absl::string_view field) {
  ASSIGN_OR_RETURN(std::string pem, ReadPemFile(path, field));
  RETURN_IF_ERROR(CheckCertValidity(pem, absl::StrCat("security.", field, " ", path), absl::Now()));
  return pem;
}

absl::Status CheckTls(const SecurityConfig& security) {
  if (security.plaintext()) {
    if (!security.token_file().empty() || !security.operator_token_file().empty()) {
      // gRPC attaches call credentials only to secure channels.
      return absl::InvalidArgumentError(
          "security.token_file needs TLS: bearer tokens are never sent in plaintext");
    }
    return absl::OkStatus();
  }
  if (security.ca_cert().empty() || security.cert().empty() || security.key().empty()) {
    return absl::InvalidArgumentError(
        "security: set ca_cert, cert and key for mutual TLS, or plaintext: true to run "
        "without encryption");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string what = absl::StrCat(path, ": ", std::strerror(err));
    if (err == EACCES) return absl::PermissionDeniedError(what);
    return absl::NotFoundError(what);
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityConfig& security) {
  RETURN_IF_ERROR(CheckTls(security));
  ASSIGN_OR_RETURN(std::string token, ReadToken(security));
  ASSIGN_OR_RETURN(std::string operator_token,
                   ReadToken(security.operator_token_file(), "operator_token_file"));
  if (!operator_token.empty() && token.empty()) {
    return absl::InvalidArgumentError(
        "security.operator_token_file needs security.token_file (the workers' token) too");
  }
  if (!operator_token.empty() && operator_token == token) {
    return absl::InvalidArgumentError(
        "security.operator_token_file holds the same token as security.token_file: the "
        "operator role needs a token of its own");
  }
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (security.plaintext()) {
    creds = grpc::InsecureServerCredentials();
  } else {
    grpc::SslServerCredentialsOptions options(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadCertFile(security.ca_cert(), "ca_cert"));
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    ASSIGN_OR_RETURN(pair.private_key, ReadPemFile(security.key(), "key"));
    ASSIGN_OR_RETURN(pair.cert_chain, ReadCertFile(security.cert(), "cert"));
    options.pem_key_cert_pairs.push_back(std::move(pair));
    creds = grpc::SslServerCredentials(options);
  }
  if (!token.empty() || !operator_token.empty()) {
    creds->SetAuthMetadataProcessor(
        std::make_shared<TokenChecker>(std::move(token), std::move(operator_token)));
  }
  return creds;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const SecurityConfig& security) {
  RETURN_IF_ERROR(CheckTls(security));
  ASSIGN_OR_RETURN(std::string token, ReadToken(security));
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (security.plaintext()) {
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadCertFile(security.ca_cert(), "ca_cert"));
  ASSIGN_OR_RETURN(options.pem_private_key, ReadPemFile(security.key(), "key"));
  ASSIGN_OR_RETURN(options.pem_cert_chain, ReadCertFile(security.cert(), "cert"));
  creds = grpc::SslCredentials(options);
  if (!token.empty()) {
    creds = grpc::CompositeChannelCredentials(
        creds, grpc::MetadataCredentialsFromPlugin(
                   std::make_unique<TokenPlugin>(std::move(token))));
  }
  return creds;
}

std::vector<std::pair<std::string, int>> DataPathChannelArgs() {
  return {
      // The frame size and stream window a connection starts with: DATA frames of up to
      // 16 MB - 1 (the HTTP/2 maximum) instead of 16 KB, and 64 MB per stream before its
      // first window update instead of 64 KB. Once the bandwidth-delay probe below has an
      // estimate, gRPC announces both from it instead (windows of at most 32 MB). Neither
      // admits more than the message size limit does: a receiver holds a whole message
      // before handing it over either way.
      {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (1 << 24) - 1},
      {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20},
      // The bandwidth-delay probe stays on (gRPC's default): in gRPC 1.51 it is the only
      // thing that raises the connection's own window above HTTP/2's initial 64 KB. With it
      // off, every message over 64 KB stopped after its first 64 KB until the receiver had
      // read them and sent a WINDOW_UPDATE: a round trip and two wake-ups per large message
      // in each direction (tests/flow_window_test). Its pings back off to one per 10 s once
      // the estimate is steady.
      {GRPC_ARG_HTTP2_BDP_PROBE, 1},
      // No channelz: nothing here reads it, and every call paid for its counters and
      // timestamps on both ends.
      {GRPC_ARG_ENABLE_CHANNELZ, 0},
  };
}

grpc::ChannelArguments MakeChannelArguments(const RpcConfig& rpc) {
  grpc::ChannelArguments args;
  const int max_bytes = static_cast<int>(std::min<uint64_t>(rpc.max_message_bytes(), INT32_MAX));
  args.SetMaxReceiveMessageSize(max_bytes);
  args.SetMaxSendMessageSize(max_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(rpc.keepalive_s() * 1000));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Each store keeps its own connections (one per server), not shared with other stores.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  for (const auto& [name, value] : DataPathChannelArgs()) args.SetInt(name, value);
  return args;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const JobConfig& config) {
  ASSIGN_OR_RETURN(auto creds, MakeChannelCredentials(config.security()));
  return grpc::CreateCustomChannel(address, creds, MakeChannelArguments(config.rpc()));
}

}  // namespace ps::common
