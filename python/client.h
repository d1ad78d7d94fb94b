// Client: what the Python package (`import ps`) drives. It composes a ParameterStore the way
// ps_worker does (the servers through GrpcParameterStore, or the shards in this process
// through InProcessParameterStore for --centralized) and adds what a training loop written
// in Python needs around it: the table layout, the worker's clock, checkpoints and stats.
//
// No Python here: the pybind11 module (ps_module.cc) converts arrays to spans and statuses
// to exceptions, and releases the GIL around every call that may block.
//
// Clock protocol (as in worker/trainer.cc): the clock counts the steps this worker has
// completed. Pulls carry clock(), so under training.staleness = k a pull waits until every
// live worker has completed at least clock() - k steps; pushes carry clock() + 1 (the clock
// after the current step). Tick() ends a step; if the step pushed nothing, it sends an empty
// push so that every server learns the new clock (otherwise BSP would wait for it forever).
//
// Restarts (as ps_worker, worker/training_job.cc): a training worker's client asks the store
// at creation where this worker stood (its clock and data position, kept by the servers, or
// by a restored data_dir's shards) and its clock starts there. The servers only ever raise a
// worker's clock, so a restarted process counting from 0 again would run unbounded until it
// caught up with its old clock while, under BSP, its pulls no longer held it back; and a
// data loader that cannot resume repeats the examples it had consumed.
#ifndef PS_PYTHON_CLIENT_H_
#define PS_PYTHON_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/parameter_store.h"
#include "proto/config.pb.h"
#include "python/rpc/admin.h"
#include "server/checkpointer.h"
#include "server/shard.h"

namespace ps::python {

struct ClientOptions {
  // The job's JobConfig textproto (text, not a path), and a name for error messages.
  std::string config_text;
  std::string config_source = "config";
  // `path=value` overrides applied after parsing, in order (as ps_worker --set).
  std::vector<std::string> overrides;
  // Servers host:port in index order; empty = the config's cluster.servers.
  std::vector<std::string> servers;
  // This worker's index in 0..cluster.num_workers-1. -1 = a tool: it takes no part in the
  // consistency bound or exactly-once (e.g. a reader of parameters).
  int32_t worker_index = 0;
  // Run the shards in this process (centralized mode, no sockets). The job then has one
  // worker, index 0.
  bool centralized = false;
  // Centralized only: where Checkpoint() writes (one RocksDB per shard under it); "" = no
  // checkpoints (Checkpoint() answers FAILED_PRECONDITION).
  std::string data_dir;
  // Security overrides of the config's `security` section (empty = keep the config's).
  std::string ca_cert, cert, key, token_file;
  // -1 = keep the config's security.plaintext, 0 = TLS, 1 = plaintext.
  int plaintext = -1;
  // How long the constructor waits for every server to answer with this job's layout.
  absl::Duration wait_for_servers = absl::Seconds(60);
};

// What a table looks like to a client.
struct TableInfo {
  std::string name;
  bool sparse = false;
  std::vector<int64_t> shape;  // dense: the tensor's shape; sparse: {dim}
  int64_t size = 0;            // dense: element count; sparse: dim
};

// Thread-safe: calls from several threads go to the store concurrently (the clock is one
// atomic counter per client).
class Client {
 public:
  // Parses and prepares the config, builds the store and, distributed, waits for the
  // servers. Errors: INVALID_ARGUMENT (config, index, servers), UNAVAILABLE (servers silent
  // for wait_for_servers), FAILED_PRECONDITION (a server runs another layout), and those of
  // the credentials.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  ~Client();

  // The tables of the prepared config (model tables expanded), in config order.
  const std::vector<TableInfo>& tables() const { return tables_; }
  // NOT_FOUND naming the table if the config has none of that name.
  absl::StatusOr<const TableInfo*> Table(const std::string& name) const;
  const JobConfig& config() const { return config_; }
  bool centralized() const { return options_.centralized; }
  int32_t worker_index() const { return options_.worker_index; }
  // Where this worker stood when the client was created: the store's answer to
  // ReportPosition(0, 0), i.e. the furthest data position reported by any incarnation of this
  // worker and the clock the servers hold for it; the client's clock started at its clock.
  // Zeros for a worker the store has not seen, and for a tool (worker_index -1).
  const common::WorkerPosition& start_position() const { return start_position_; }
  // Tells the store where this worker is in its data (epochs completed, examples consumed of
  // the current epoch; 0, 0 says nothing new) and returns what the store remembers of it, as
  // ps_worker reports after the step's pushes. A restarted worker finds it in
  // start_position(). FAILED_PRECONDITION for a tool (worker_index -1); errors as Pull.
  absl::StatusOr<common::WorkerPosition> ReportPosition(uint32_t epoch, uint64_t offset);

  // The store's calls, with this client's clock. Errors: those of ParameterStore.
  absl::Status Pull(const common::PullBatch& batch);
  absl::Status Push(const common::PushBatch& batch);
  // Ends a step: the clock advances by one (see the file comment). Returns the new clock.
  absl::StatusOr<int64_t> Tick();
  // One fused step: pushes `push` with this step's clock, ends the step, and pulls `pull` for
  // the next one, in one round trip per server (ParameterStore::PushPull). An empty push is
  // Tick()'s empty push then the next step's pull. Returns the new clock. Errors: those of
  // Push and Pull; the clock advances only when both succeed. (A fused call that failed may
  // have applied its push on some servers: taken again, it is a new push there.)
  absl::StatusOr<int64_t> Step(const common::PushBatch& push, const common::PullBatch& pull);
  int64_t clock() const { return clock_.load(); }
  // The worker leaves the consistency bound; distributed servers shut down once every
  // worker has finished. Idempotent.
  absl::Status Finish();

  // Writes a checkpoint on every server (or every in-process shard, under data_dir) and
  // returns one CheckpointResponse per server, as JSON objects. FAILED_PRECONDITION for a
  // centralized client without data_dir; errors of the calls (UNAUTHENTICATED, ...) and of the
  // servers' stores.
  absl::StatusOr<std::vector<std::string>> Checkpoint();
  // One StatsResponse per server, as JSON objects.
  absl::StatusOr<std::vector<std::string>> Stats();

 private:
  explicit Client(const ClientOptions& options) : options_(options) {}
  absl::Status InitCentralized(uint64_t incarnation);
  absl::Status InitDistributed(uint64_t incarnation);

  const ClientOptions options_;
  JobConfig config_;
  std::vector<TableInfo> tables_;
  absl::flat_hash_map<std::string, size_t> table_index_;
  // Centralized: the shards (one per server index) and their checkpointers (with data_dir).
  std::vector<std::unique_ptr<server::Shard>> shards_;
  std::vector<std::unique_ptr<server::Checkpointer>> checkpointers_;
  // Distributed: Stats and Checkpoint calls.
  std::unique_ptr<AdminClient> admin_;
  std::unique_ptr<common::ParameterStore> store_;
  // Raises pushed_clock_ to `clock` (a push carrying it succeeded).
  void NotePushed(int64_t clock);
  // A training worker's resume: see "Restarts" in the file comment. Sets start_position_ and
  // the clocks; errors those of ReportPosition.
  absl::Status Resume();
  // Set once by Create (Resume), before the client is handed out.
  common::WorkerPosition start_position_;

  // Tick and Step, which move the clock, one at a time; Push and Pull read it.
  absl::Mutex step_mu_;
  std::atomic<int64_t> clock_{0};
  // The highest clock a push that succeeded carried: the step clock_ + 1 needs no empty push
  // to be heard once this reaches it. (A flag "pushed this step", set after a push's call,
  // counted a push that was in flight across another thread's Tick for the step after.)
  std::atomic<int64_t> pushed_clock_{0};
  absl::Mutex finish_mu_;
  bool finished_ ABSL_GUARDED_BY(finish_mu_) = false;
  // An explicit Finish was tried: the destructor does not try again (after a failed one it
  // would spend the whole retry budget a second time).
  bool finish_tried_ ABSL_GUARDED_BY(finish_mu_) = false;
};

}  // namespace ps::python

#endif  // PS_PYTHON_CLIENT_H_
