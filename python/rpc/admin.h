// AdminClient: the calls a Python client makes to every server besides Pull and Push: Stats
// and Checkpoint. Kept apart from GrpcParameterStore (which owns the data path) so that the
// Python package builds on the store's public interface only.
#ifndef PS_PYTHON_RPC_ADMIN_H_
#define PS_PYTHON_RPC_ADMIN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "proto/ps.pb.h"

namespace ps::python {

// Thread-safe.
class AdminClient {
 public:
  // One channel per server of config.cluster().servers, with the job's credentials.
  // Errors: those of common::MakeChannel (credentials files).
  static absl::StatusOr<std::unique_ptr<AdminClient>> Create(const JobConfig& config,
                                                             absl::Duration deadline);
  virtual ~AdminClient() = default;

  // Every server's Stats, in server order. Errors: the first failing server's, naming it.
  virtual absl::StatusOr<std::vector<StatsResponse>> Stats() = 0;
  // Asks every server for a checkpoint and waits until each is durable. Errors as Stats.
  virtual absl::StatusOr<std::vector<CheckpointResponse>> Checkpoint() = 0;
};

}  // namespace ps::python

#endif  // PS_PYTHON_RPC_ADMIN_H_
