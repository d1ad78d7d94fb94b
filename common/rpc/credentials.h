// gRPC credentials from the job's SecurityConfig, for servers and for clients alike.
//
// TLS is mutual: the server requires and verifies a client certificate signed by the job's
// CA, and clients verify the server's certificate against the same CA. On top of it, an
// optional bearer token ("authorization: Bearer <token>") is checked on every call: servers
// accept the worker role's token (security.token_file) and the operator role's
// (security.operator_token_file), and record which one a call carried in its AuthContext
// (kTokenRoleProperty) for the service's role checks (server/rpc/auth.h).
// Plaintext must be chosen explicitly (security.plaintext: true).
#ifndef PS_COMMON_RPC_CREDENTIALS_H_
#define PS_COMMON_RPC_CREDENTIALS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "proto/config.pb.h"

namespace ps::common {

// AuthContext property naming the role of the token a call carried: kWorkerTokenRole or
// kOperatorTokenRole.
inline constexpr char kTokenRoleProperty[] = "ps_token_role";
inline constexpr char kWorkerTokenRole[] = "worker";
inline constexpr char kOperatorTokenRole[] = "operator";

// The transport settings of every data-path connection, client and server alike (see
// MakeChannelArguments and server/rpc/grpc_server.cc): name and integer value of each gRPC
// channel argument.
std::vector<std::pair<std::string, int>> DataPathChannelArgs();

// Reads a whole file. NOT_FOUND / PERMISSION_DENIED naming the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Server credentials. INVALID_ARGUMENT when neither plaintext nor a complete TLS setup is
// configured, or when a certificate or key file holds no PEM block (an empty file included);
// NOT_FOUND for missing files.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityConfig& security);

// Channel credentials for clients (workers, tools), including the bearer token if any.
// Errors as for MakeServerCredentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const SecurityConfig& security);

// Channel arguments every client of the job uses: message sizes, keepalive.
grpc::ChannelArguments MakeChannelArguments(const RpcConfig& rpc);

// Opens a channel to `address` with the job's credentials and arguments.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const JobConfig& config);

}  // namespace ps::common

#endif  // PS_COMMON_RPC_CREDENTIALS_H_
