// The cluster identity of a process (role, index, the servers' addresses, how many servers and
// workers) from the environment a cluster manager sets, so the same ps_server / ps_worker
// binaries run under Kubeflow, SLURM and mpirun without per-process flags.
//
// Sources (`--cluster_from`, see ChooseClusterSource):
//
//   TF_CONFIG (Kubeflow TFJob)  {"cluster": {"ps": ["h:p", ...], "worker": [...],
//                                            "chief": ["h:p"]},
//                                "task": {"type": "worker", "index": 0}}
//     Servers are cluster.ps in order; a "ps" task is server `index` and listens on the port
//     of its own entry. Workers are the chief (if there is one; "master" is taken as its older
//     name) as worker 0, then cluster.worker[i] as worker i + 1 (worker i without a chief).
//     Other members (e.g. "evaluator") are not part of the job; such a task is refused.
//     Members other than "cluster" and "task" (e.g. "environment") are ignored.
//
//   SLURM (one srun step, the default block distribution)
//     SLURM_PROCID (rank), SLURM_STEP_NUM_TASKS or SLURM_NTASKS (task count),
//     SLURM_STEP_NODELIST / SLURM_JOB_NODELIST / SLURM_NODELIST (hostlist, e.g.
//     "node[01-03,07],gpu5"), SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE (e.g.
//     "2(x3),1"). Ranks [0, num_servers) are servers, the rest workers, num_servers taken
//     from the config (cluster.num_servers or cluster.servers). Ranks fill the nodes in
//     order (block). A server listens on base_port + its local rank on its node, so several
//     fit on one host; base_port 0 = derived from SLURM_JOB_ID (see SlurmOptions). When
//     SLURM_NODEID / SLURM_LOCALID are set they must match the block layout.
//
//   MPI (Open MPI's mpirun)
//     OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE (OMPI_COMM_WORLD_LOCAL_RANK for logs).
//     Ranks split as for SLURM. MPI tells nobody the peers' host names, so the servers meet
//     the workers in a rendezvous directory on a filesystem all ranks share: each server,
//     once it listens (on any port), writes "host:port" into <dir>/<job>/server-<i>
//     (write + rename, so a reader never sees half an address); each worker waits until all
//     num_servers files are there. <job> is mpirun's job id (OMPI_MCA_ess_base_jobid, else
//     PMIX_NAMESPACE, else "job"), so a directory reused across runs never hands out a
//     previous run's addresses.
//
// A value the environment supplies that a flag or the config also sets must agree, or
// ResolveCluster fails naming both values and where each came from; a process whose role
// differs from its binary's (ps_worker for a TF_CONFIG "ps" task, or for a server rank) is
// refused. With ClusterSource::kFlags nothing is read and nothing changes.
//
// Libraries read no environment: the binaries pass theirs in (EnvMapFromEnviron(environ)).
// Thread-compatible: everything here is pure apart from the rendezvous file I/O.
#ifndef PS_COMMON_CLUSTER_CLUSTER_ENV_H_
#define PS_COMMON_CLUSTER_CLUSTER_ENV_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"

namespace ps::common {

// Environment variables by name.
using EnvMap = std::map<std::string, std::string>;

// The NAME=VALUE entries of a null-terminated array such as `environ`.
EnvMap EnvMapFromEnviron(const char* const* environ);

enum class ClusterSource { kFlags, kTfConfig, kSlurm, kMpi };
enum class ClusterRole { kServer, kWorker };

// "flags", "TF_CONFIG", "SLURM", "MPI".
const char* ClusterSourceName(ClusterSource source);

// Resolves --cluster_from: flags|tf_config|slurm|mpi, or auto = kTfConfig when TF_CONFIG is
// set and non-empty, else kSlurm when SLURM_PROCID is set, else kFlags. (auto never picks
// kMpi: mpirun needs a rendezvous directory, so ask for it with --cluster_from=mpi.)
// Errors: INVALID_ARGUMENT for any other value.
[[nodiscard]] absl::StatusOr<ClusterSource> ChooseClusterSource(absl::string_view flag,
                                                                const EnvMap& env);

// What an environment source says about this process and its job. Each *_origin says where
// the value came from, for error messages (e.g. "SLURM_PROCID=3").
struct ClusterEnv {
  ClusterSource source = ClusterSource::kFlags;
  ClusterRole role = ClusterRole::kWorker;
  // Server index (role kServer) or worker index (role kWorker).
  int32_t index = 0;
  std::string index_origin;
  // Server addresses in index order; empty when the source has none (MPI until the
  // rendezvous).
  std::vector<std::string> servers;
  std::string servers_origin;
  uint32_t num_servers = 0;
  std::string num_servers_origin;
  uint32_t num_workers = 0;
  std::string num_workers_origin;
  // A server's port to listen on; 0 = any (MPI).
  int32_t port = 0;
  std::string port_origin;
  // One line for the logs, e.g. "SLURM task 2 of 4 on node n2 (local rank 0): worker 0".
  std::string description;
};

// ---- Sources -------------------------------------------------------------------------------

// Parses Kubeflow's TF_CONFIG (rules in the file comment).
// Errors: INVALID_ARGUMENT "TF_CONFIG=<value>: <problem>": not JSON (with protobuf's parser's
// message), a duplicate key, arrays or objects nested more than 32 deep, no cluster or task, a
// member of the wrong type, an address that is not host:port (port 1..65535), no ps or no
// workers, more than one chief, an unknown task type, an index out of range.
[[nodiscard]] absl::StatusOr<ClusterEnv> ClusterFromTfConfig(absl::string_view tf_config);

struct SlurmOptions {
  // How many of the tasks are servers (ranks 0..num_servers-1). REQUIRES: > 0.
  uint32_t num_servers = 0;
  // Server ports are base_port + local rank on the node. 0 = 20000 + 16 * (SLURM_JOB_ID mod
  // 750), in [20000, 32000) below the usual ephemeral range, 16 apart so that concurrent jobs
  // on one node rarely meet; it then allows at most 16 tasks per node before the last server.
  int32_t base_port = 0;
};

// The cluster of one SLURM step (rules in the file comment).
// Errors: INVALID_ARGUMENT naming the variable and its value: a variable missing or not a
// number, a bad hostlist or tasks-per-node list, node and task counts that disagree, a rank
// out of range, no worker rank left, SLURM_NODEID / SLURM_LOCALID that contradict the block
// layout, a port beyond 65535; SLURM_JOB_ID when base_port is 0 and it is missing.
[[nodiscard]] absl::StatusOr<ClusterEnv> ClusterFromSlurm(const EnvMap& env,
                                                          const SlurmOptions& options);

// Rank, size and role from Open MPI's variables; `servers` stays empty (see
// WaitForServerAddresses). REQUIRES: num_servers > 0.
// Errors: INVALID_ARGUMENT naming the variable and its value: missing or not a number, rank
// out of range, no worker rank left.
[[nodiscard]] absl::StatusOr<ClusterEnv> ClusterFromMpi(const EnvMap& env, uint32_t num_servers);

// Expands a SLURM hostlist: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5.
// Several bracket groups in one name give every combination in order ("r[1-2]n[1-2]" ->
// r1n1 r1n2 r2n1 r2n2); a range keeps the zero padding of its lower bound.
// Errors: INVALID_ARGUMENT "hostlist '<value>': <problem>" (empty name, unbalanced or nested
// brackets, a bound that is not a number, lower > upper, more than 1<<20 names).
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view hostlist);

// Expands SLURM's tasks-per-node list: "2(x3),1" -> 2 2 2 1.
// Errors: INVALID_ARGUMENT "tasks per node '<value>': <problem>" (a count that is not a
// positive number, a bad "(xN)" repeat, more than 1<<20 nodes).
[[nodiscard]] absl::StatusOr<std::vector<uint32_t>> ExpandTasksPerNode(absl::string_view tasks);

// ---- MPI rendezvous ------------------------------------------------------------------------

// <dir>/<job> for this mpirun (the job id as in the file comment, with any character outside
// [A-Za-z0-9._-] replaced by '_').
std::string RendezvousJobDir(const std::string& dir, const EnvMap& env);

// Writes "address\n" to <job_dir>/server-<index> (creating job_dir and its parent as needed)
// through a temporary file and a rename. Errors: INVALID_ARGUMENT naming the path and the
// system's reason when a directory or the file cannot be written.
[[nodiscard]] absl::Status PublishServerAddress(const std::string& job_dir, int32_t index,
                                                const std::string& address);

// Waits (polling every 100 ms) until <job_dir>/server-0 .. server-<num_servers - 1> all hold
// an address, and returns them in index order.
// Errors: DEADLINE_EXCEEDED after `timeout`, naming the directory and the servers still
// missing; INVALID_ARGUMENT for a file that holds something other than host:port.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> WaitForServerAddresses(
    const std::string& job_dir, uint32_t num_servers, absl::Duration timeout);

// ---- Putting it together (what the binaries call) ------------------------------------------

struct ClusterOptions {
  // The --cluster_from flag (see ChooseClusterSource).
  std::string cluster_from = "auto";
  // The role of the calling binary.
  ClusterRole role = ClusterRole::kWorker;
  // --server_index / --worker_index when given on the command line.
  std::optional<int32_t> index;
  std::string index_flag = "--worker_index";
  // ps_server's --port when given and non-zero.
  std::optional<int32_t> port;
  // Where the config's cluster.servers came from, for messages (e.g. "--servers").
  std::string servers_origin = "the config's cluster.servers";
  // SLURM: see SlurmOptions::base_port.
  int32_t base_port = 0;
  // MPI: the shared rendezvous directory (required for kMpi).
  std::string rendezvous_dir;
  // MPI workers: how long to wait for every server's address.
  absl::Duration rendezvous_timeout = absl::Minutes(2);
};

struct ClusterIdentity {
  ClusterSource source = ClusterSource::kFlags;
  // This process's server or worker index; for kFlags, ClusterOptions::index unchanged.
  std::optional<int32_t> index;
  // A server's port to listen on; 0 = whatever the flags say.
  int32_t port = 0;
  // MPI servers: publish the address here once listening (PublishServerAddress).
  std::string rendezvous_job_dir;
  // For the logs; empty for kFlags.
  std::string description;
};

// Chooses the source, reads it, checks it against `options` and `*config` (loaded with its
// overrides, before ExpandModelTables / ValidateJobConfig), and writes the environment's
// cluster.servers, num_servers and num_workers into `*config`. For kFlags it returns at once
// and changes nothing. For MPI workers it waits for the servers' addresses.
// Errors: those of the sources; INVALID_ARGUMENT for a process in the wrong role, for a value
// the environment and a flag or the config both give and that disagrees (naming both values
// and their origins), for SLURM/MPI without a server count in the config, for MPI without a
// rendezvous directory; DEADLINE_EXCEEDED from the MPI rendezvous.
[[nodiscard]] absl::StatusOr<ClusterIdentity> ResolveCluster(const ClusterOptions& options,
                                                             const EnvMap& env,
                                                             ps::JobConfig* config);

}  // namespace ps::common

#endif  // PS_COMMON_CLUSTER_CLUSTER_ENV_H_
