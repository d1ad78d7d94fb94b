// Choosing the source, MPI, the rendezvous and ResolveCluster. TF_CONFIG is in
// cluster_env_tf_config.cc, SLURM in cluster_env_slurm.cc.
#include "common/cluster/cluster_env.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/cluster/internal/cluster_env_util.h"
#include "common/status_macros.h"

namespace ps::common {
namespace internal {

std::string RoleName(ClusterRole role) {
  return role == ClusterRole::kServer ? "server" : "worker";
}

// A value quoted for a message, cut to a readable length.
std::string Quoted(absl::string_view value) {
  constexpr size_t kMax = 400;
  if (value.size() <= kMax) return absl::StrCat("'", value, "'");
  return absl::StrCat("'", value.substr(0, kMax), "...' (", value.size(), " bytes)");
}

// "host:port" or "[v6]:port" with a port in 1..65535. Sets *port.
bool ParseHostPort(absl::string_view address, int32_t* port) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  absl::string_view host = address.substr(0, colon);
  absl::string_view port_text = address.substr(colon + 1);
  if (absl::StartsWith(host, "[")) {
    if (!absl::EndsWith(host, "]") || host.size() < 3) return false;
  } else if (absl::StrContains(host, ':') || absl::StrContains(host, ']')) {
    return false;
  }
  for (char c : host) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) || c == ',') return false;
  }
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); })) {
    return false;
  }
  int32_t value = 0;
  if (!absl::SimpleAtoi(port_text, &value) || value < 1 || value > 65535) return false;
  *port = value;
  return true;
}

// The first of `names` that is set.
std::optional<Var> FirstSet(const EnvMap& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    auto it = env.find(name);
    if (it != env.end()) return Var{name, it->second};
  }
  return std::nullopt;
}

absl::StatusOr<Var> Required(const EnvMap& env, std::initializer_list<const char*> names,
                             absl::string_view source) {
  std::optional<Var> var = FirstSet(env, names);
  if (!var) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", absl::StrJoin(names, " or "), names.size() > 1 ? " are" : " is",
        " not set (is this process started by ", source == "SLURM" ? "srun" : "mpirun", "?)"));
  }
  return *var;
}

absl::StatusOr<uint32_t> NonNegative(const Var& var) {
  uint32_t value;
  if (!absl::SimpleAtoi(var.value, &value) || absl::StrContains(var.value, '+') ||
      absl::StrContains(var.value, ' ')) {
    return absl::InvalidArgumentError(
        absl::StrCat(var.name, "=", Quoted(var.value), ": expected a non-negative integer"));
  }
  return value;
}

std::string Show(const Var& var) { return absl::StrCat(var.name, "=", var.value); }

}  // namespace internal

namespace {

using internal::FirstSet;
using internal::NonNegative;
using internal::ParseHostPort;
using internal::Quoted;
using internal::Required;
using internal::RoleName;
using internal::Show;
using internal::Var;

// ---- Rendezvous files ----------------------------------------------------------------------

absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' exists and is not a directory"));
  }
  const size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) RETURN_IF_ERROR(MakeDirs(path.substr(0, slash)));
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create directory '", path,
                                                   "': ", std::generic_category().message(errno)));
  }
  return absl::OkStatus();
}

std::string ServerFile(const std::string& job_dir, uint32_t index) {
  return absl::StrCat(job_dir, "/server-", index);
}

// ---- ResolveCluster helpers ----------------------------------------------------------------

// How many servers the config names, for SLURM and MPI (which only give a task count).
absl::StatusOr<uint32_t> ConfigServerCount(const ps::JobConfig& config, absl::string_view source) {
  const ps::ClusterConfig& c = config.cluster();
  if (c.num_servers() == 0 && c.servers_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     " gives only the number of tasks: set cluster.num_servers (in the config or "
                     "with --set cluster.num_servers=N) to say how many of them are servers"));
  }
  if (c.num_servers() != 0 && c.servers_size() != 0 &&
      c.num_servers() != static_cast<uint32_t>(c.servers_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.num_servers: ", c.num_servers(), " but cluster.servers lists ", c.servers_size()));
  }
  return c.num_servers() != 0 ? c.num_servers() : static_cast<uint32_t>(c.servers_size());
}

absl::Status Disagree(absl::string_view what, absl::string_view ours, absl::string_view ours_origin,
                      absl::string_view theirs, absl::string_view theirs_origin) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", ours, " from ", ours_origin,
                                                 " disagrees with ", theirs, " from ",
                                                 theirs_origin));
}

absl::Status CheckAgreement(const ClusterEnv& env, const ClusterOptions& options,
                            const ps::JobConfig& config) {
  const std::string role = RoleName(options.role);
  if (options.index && *options.index != env.index) {
    return Disagree(absl::StrCat(role, " index"), absl::StrCat(*options.index), options.index_flag,
                    absl::StrCat(env.index), env.index_origin);
  }
  if (options.port && env.port != 0 && *options.port != env.port) {
    return Disagree("port", absl::StrCat(*options.port), "--port", absl::StrCat(env.port),
                    env.port_origin);
  }
  const ps::ClusterConfig& c = config.cluster();
  if (env.source == ClusterSource::kTfConfig && c.num_servers() != 0 &&
      c.num_servers() != env.num_servers) {
    return Disagree("cluster.num_servers", absl::StrCat(c.num_servers()),
                    "the config (file or --set)", absl::StrCat(env.num_servers),
                    env.num_servers_origin);
  }
  if (c.servers_size() > 0 && !env.servers.empty()) {
    std::vector<std::string> configured(c.servers().begin(), c.servers().end());
    if (configured != env.servers) {
      return Disagree("cluster.servers", absl::StrJoin(configured, ","), options.servers_origin,
                      absl::StrJoin(env.servers, ","), env.servers_origin);
    }
  }
  if (c.has_num_workers() && c.num_workers() != env.num_workers) {
    return Disagree("cluster.num_workers", absl::StrCat(c.num_workers()),
                    "the config (file or --set)", absl::StrCat(env.num_workers),
                    env.num_workers_origin);
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterEnv> ReadSource(ClusterSource source, const ClusterOptions& options,
                                      const EnvMap& env, const ps::JobConfig& config) {
  switch (source) {
    case ClusterSource::kTfConfig: {
      auto it = env.find("TF_CONFIG");
      if (it == env.end()) {
        return absl::InvalidArgumentError("--cluster_from=tf_config: TF_CONFIG is not set");
      }
      return ClusterFromTfConfig(it->second);
    }
    case ClusterSource::kSlurm: {
      SlurmOptions slurm;
      ASSIGN_OR_RETURN(slurm.num_servers, ConfigServerCount(config, "SLURM"));
      slurm.base_port = options.base_port;
      return ClusterFromSlurm(env, slurm);
    }
    case ClusterSource::kMpi: {
      if (options.rendezvous_dir.empty()) {
        return absl::InvalidArgumentError(
            "--cluster_from=mpi needs --rendezvous_dir: a directory on a filesystem every rank "
            "shares, where the servers leave their addresses for the workers");
      }
      ASSIGN_OR_RETURN(uint32_t num_servers, ConfigServerCount(config, "MPI"));
      return ClusterFromMpi(env, num_servers);
    }
    case ClusterSource::kFlags:
      break;
  }
  return absl::InternalError("ReadSource: no environment source");
}

}  // namespace

EnvMap EnvMapFromEnviron(const char* const* environ) {
  EnvMap env;
  for (const char* const* entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    absl::string_view text(*entry);
    const size_t eq = text.find('=');
    if (eq == absl::string_view::npos || eq == 0) continue;
    env.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return env;
}

const char* ClusterSourceName(ClusterSource source) {
  switch (source) {
    case ClusterSource::kFlags:
      return "flags";
    case ClusterSource::kTfConfig:
      return "TF_CONFIG";
    case ClusterSource::kSlurm:
      return "SLURM";
    case ClusterSource::kMpi:
      return "MPI";
  }
  return "?";
}

absl::StatusOr<ClusterSource> ChooseClusterSource(absl::string_view flag, const EnvMap& env) {
  if (flag == "flags") return ClusterSource::kFlags;
  if (flag == "tf_config") return ClusterSource::kTfConfig;
  if (flag == "slurm") return ClusterSource::kSlurm;
  if (flag == "mpi") return ClusterSource::kMpi;
  if (flag != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster_from=", flag, ": expected flags, tf_config, slurm, mpi or auto"));
  }
  auto tf_config = env.find("TF_CONFIG");
  if (tf_config != env.end() && !tf_config->second.empty()) return ClusterSource::kTfConfig;
  if (env.count("SLURM_PROCID") > 0) return ClusterSource::kSlurm;
  return ClusterSource::kFlags;
}

absl::StatusOr<ClusterEnv> ClusterFromMpi(const EnvMap& env, uint32_t num_servers) {
  ASSIGN_OR_RETURN(Var rank_var, Required(env, {"OMPI_COMM_WORLD_RANK"}, "MPI"));
  ASSIGN_OR_RETURN(Var size_var, Required(env, {"OMPI_COMM_WORLD_SIZE"}, "MPI"));
  ASSIGN_OR_RETURN(uint32_t rank, NonNegative(rank_var));
  ASSIGN_OR_RETURN(uint32_t size, NonNegative(size_var));
  if (rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(rank_var), " is out of range for ", Show(size_var)));
  }
  if (num_servers == 0 || num_servers >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.num_servers=", num_servers, " leaves no ", num_servers == 0 ? "server" : "worker",
        " among the ", Show(size_var), " ranks"));
  }
  std::string local;
  if (std::optional<Var> local_var = FirstSet(env, {"OMPI_COMM_WORLD_LOCAL_RANK"})) {
    ASSIGN_OR_RETURN(uint32_t local_rank, NonNegative(*local_var));
    local = absl::StrCat(" (local rank ", local_rank, ")");
  }
  ClusterEnv out;
  out.source = ClusterSource::kMpi;
  out.num_servers = num_servers;
  out.num_servers_origin = "the config";
  out.num_workers = size - num_servers;
  out.num_workers_origin =
      absl::StrCat("MPI (", Show(size_var), " less ", num_servers, " servers)");
  const bool server = rank < num_servers;
  out.role = server ? ClusterRole::kServer : ClusterRole::kWorker;
  out.index = static_cast<int32_t>(server ? rank : rank - num_servers);
  out.index_origin = absl::StrCat(Show(rank_var), " with cluster.num_servers=", num_servers);
  out.description =
      absl::StrCat("MPI rank ", rank, " of ", size, local, ": ", RoleName(out.role), " ", out.index,
                   " of ", server ? out.num_servers : out.num_workers);
  return out;
}

std::string RendezvousJobDir(const std::string& dir, const EnvMap& env) {
  std::optional<Var> job = FirstSet(env, {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"});
  std::string name = job && !job->value.empty() ? job->value : "job";
  for (char& c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      c = '_';
    }
  }
  if (name == "." || name == "..") name = "job";
  return absl::StrCat(dir, "/", name);
}

absl::Status PublishServerAddress(const std::string& job_dir, int32_t index,
                                  const std::string& address) {
  RETURN_IF_ERROR_CTX(MakeDirs(job_dir), "MPI rendezvous");
  const std::string path = ServerFile(job_dir, static_cast<uint32_t>(index));
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << address << "\n";
    out.flush();
    if (!out) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MPI rendezvous: cannot write '", tmp, "': ", std::generic_category().message(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("MPI rendezvous: cannot rename '", tmp, "' to '",
                                                   path,
                                                   "': ", std::generic_category().message(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> WaitForServerAddresses(const std::string& job_dir,
                                                                uint32_t num_servers,
                                                                absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> addresses(num_servers);
  while (true) {
    std::vector<uint32_t> missing;
    for (uint32_t i = 0; i < num_servers; ++i) {
      if (!addresses[i].empty()) continue;
      std::ifstream in(ServerFile(job_dir, i));
      std::string line;
      if (!in || !std::getline(in, line)) {
        missing.push_back(i);
        continue;
      }
      int32_t port;
      if (!ParseHostPort(line, &port)) {
        return absl::InvalidArgumentError(absl::StrCat("MPI rendezvous: '", ServerFile(job_dir, i),
                                                       "' holds ", Quoted(line),
                                                       ", expected host:port"));
      }
      addresses[i] = line;
    }
    if (missing.empty()) return addresses;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "MPI rendezvous: after ", absl::FormatDuration(timeout), " server(s) ",
          absl::StrJoin(missing, ","), " of ", num_servers, " have left no address in '", job_dir,
          "' (did they start? is the directory on a filesystem every rank shares?)"));
    }
    absl::SleepFor(std::min(absl::Milliseconds(100), deadline - absl::Now()));
  }
}

absl::StatusOr<ClusterIdentity> ResolveCluster(const ClusterOptions& options, const EnvMap& env,
                                               ps::JobConfig* config) {
  ClusterIdentity identity;
  ASSIGN_OR_RETURN(identity.source, ChooseClusterSource(options.cluster_from, env));
  if (identity.source == ClusterSource::kFlags) {
    identity.index = options.index;
    return identity;
  }
  ASSIGN_OR_RETURN(ClusterEnv cluster, ReadSource(identity.source, options, env, *config));
  if (cluster.role != options.role) {
    return absl::InvalidArgumentError(
        absl::StrCat(cluster.index_origin, " makes this process ", RoleName(cluster.role), " ",
                     cluster.index, ", but this is ps_", RoleName(options.role), ": start ps_",
                     RoleName(cluster.role), " for this task"));
  }
  if (identity.source == ClusterSource::kMpi) {
    identity.rendezvous_job_dir = RendezvousJobDir(options.rendezvous_dir, env);
    if (cluster.role == ClusterRole::kWorker) {
      ASSIGN_OR_RETURN(cluster.servers,
                       WaitForServerAddresses(identity.rendezvous_job_dir, cluster.num_servers,
                                              options.rendezvous_timeout));
      cluster.servers_origin =
          absl::StrCat("the MPI rendezvous in '", identity.rendezvous_job_dir, "'");
    }
  }
  RETURN_IF_ERROR(CheckAgreement(cluster, options, *config));
  ps::ClusterConfig* c = config->mutable_cluster();
  if (!cluster.servers.empty()) {
    c->clear_servers();
    for (const std::string& s : cluster.servers) c->add_servers(s);
  }
  c->set_num_servers(cluster.num_servers);
  c->set_num_workers(cluster.num_workers);
  identity.index = cluster.index;
  identity.port = cluster.port;
  identity.description = cluster.description;
  return identity;
}

}  // namespace ps::common
