// What ps_server's and ps_worker's mains share: the flags both take, loading the job config
// with its overrides and the cluster identity, the metrics port announcement, and the
// handling of SIGTERM/SIGINT.
//
// Only the mains link this library (its flags are defined here, once): libraries take
// Options structs, never flags.
#ifndef PS_COMMON_STARTUP_MAIN_FLAGS_H_
#define PS_COMMON_STARTUP_MAIN_FLAGS_H_

#include <atomic>
#include <csignal>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cluster/cluster_env.h"
#include "proto/config.pb.h"

ABSL_DECLARE_FLAG(std::string, config);
ABSL_DECLARE_FLAG(std::string, set);
ABSL_DECLARE_FLAG(std::string, cluster_from);
ABSL_DECLARE_FLAG(int32_t, base_port);
ABSL_DECLARE_FLAG(std::string, rendezvous_dir);
ABSL_DECLARE_FLAG(int32_t, metrics_port);
ABSL_DECLARE_FLAG(std::string, metrics_port_file);
ABSL_DECLARE_FLAG(bool, print_config);

namespace ps::common {

// The job as a main starts it.
struct StartupConfig {
  std::string config_path;  // --config
  // Loaded with --set and the extra overrides, the cluster filled in from the environment,
  // the model's tables expanded, validated.
  JobConfig config;
  ClusterIdentity cluster;
  // --metrics_port, or metrics.port when the flag is left at -2: -1 = off, 0 = a free port.
  int32_t metrics_port = -1;
};

// Loads --config with --set, then `extra_overrides` (a binary's own flags, e.g.
// "cluster.servers=..."), resolves the cluster identity (`cluster_options` completed with
// --cluster_from unless already set to something other than "auto", --base_port and
// --rendezvous_dir), expands the model's tables and validates the result.
// Errors: INVALID_ARGUMENT naming the flag or the config file and field; those of
// ResolveCluster.
absl::StatusOr<StartupConfig> LoadStartupConfig(ClusterOptions cluster_options,
                                                const std::vector<std::string>& extra_overrides);

// "path=value" for each (config path, flag value) pair whose value is set (non-empty): the
// overrides a binary's own flags stand for, passed to LoadStartupConfig after --set's.
std::vector<std::string> FlagOverrides(
    std::initializer_list<std::pair<const char*, std::string>> flags);

// With --print_config: prints `config` as JSON on stdout (field names as in the .proto, every
// field, defaults included; 64-bit integers as strings, as proto3's JSON mapping has them) and
// returns true, for the launchers to read the job the binaries will run. Else returns false.
bool PrintConfigIfAsked(const JobConfig& config);

// Prints "<who> metrics on http://HOST:PORT/metrics" on stdout and writes the port to
// --metrics_port_file (if set). Errors: those of WriteFileAtomically.
absl::Status AnnounceMetricsPort(const std::string& who, const std::string& host, int port);

// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts later; call it
// before starting any thread. Returns the set for WaitForStopSignal.
sigset_t BlockStopSignals();
// Waits on the calling thread for one of `signals` (sigwait: no handler runs, so nothing
// async-signal-unsafe can happen), logs it and returns true; returns false without logging
// when `*woken_internally` is set by then (the process stops for another reason and wakes
// this thread with pthread_kill).
bool WaitForStopSignal(const sigset_t& signals, const std::atomic<bool>* woken_internally);

// Runs `on_signal` on a thread of its own once SIGTERM or SIGINT arrives (block them first
// with BlockStopSignals). The destructor wakes that thread if no signal came (the process
// stops for another reason) and joins it. Thread-compatible.
class StopSignalThread {
 public:
  StopSignalThread(const sigset_t& signals, std::function<void()> on_signal);
  ~StopSignalThread();
  StopSignalThread(const StopSignalThread&) = delete;
  StopSignalThread& operator=(const StopSignalThread&) = delete;

 private:
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// The whole of a main(): sets the usage message, parses the flags, logs to stderr, keeps freed
// memory mapped for reuse (before any thread starts), then calls `run`. Returns the exit code:
// 0, or 1 after printing "<program>: <status>" on stderr.
int RunMain(int argc, char** argv, const char* program, const char* usage,
            absl::Status (*run)());

// The name other hosts reach this one by: `listen_host`, or this host's name for a wildcard.
std::string AdvertisedHost(const std::string& listen_host);

}  // namespace ps::common

#endif  // PS_COMMON_STARTUP_MAIN_FLAGS_H_
