// Helpers shared by the sources of cluster_env.h (cluster_env*.cc); not part of its API.
#ifndef PS_COMMON_CLUSTER_INTERNAL_CLUSTER_ENV_UTIL_H_
#define PS_COMMON_CLUSTER_INTERNAL_CLUSTER_ENV_UTIL_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cluster/cluster_env.h"

namespace ps::common::internal {

// "server" or "worker".
std::string RoleName(ClusterRole role);

// `value` in single quotes for a message, cut after 400 bytes.
std::string Quoted(absl::string_view value);

// True for "host:port" or "[v6]:port" with a non-empty host free of whitespace and commas, and
// a port in 1..65535, which it stores in *port.
bool ParseHostPort(absl::string_view address, int32_t* port);

// An environment variable that is set.
struct Var {
  std::string name;
  std::string value;
};

// The first of `names` that is set in `env`.
std::optional<Var> FirstSet(const EnvMap& env, std::initializer_list<const char*> names);

// The first of `names` that is set. Errors: INVALID_ARGUMENT "<source>: A or B are not set
// (...)", `source` being "SLURM" or "MPI".
absl::StatusOr<Var> Required(const EnvMap& env, std::initializer_list<const char*> names,
                             absl::string_view source);

// The variable as a uint32. Errors: INVALID_ARGUMENT "NAME='value': expected a non-negative
// integer".
absl::StatusOr<uint32_t> NonNegative(const Var& var);

// "NAME=value".
std::string Show(const Var& var);

}  // namespace ps::common::internal

#endif  // PS_COMMON_CLUSTER_INTERNAL_CLUSTER_ENV_UTIL_H_
