#include "python/client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/partitioner.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "server/in_process_store.h"
#include "worker/rpc/grpc_store.h"

namespace ps::python {
namespace {

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  // Cannot fail for these messages (no Any fields); an empty object shows if it did.
  if (!google::protobuf::util::MessageToJsonString(m, &out, options).ok()) out = "{}";
  return out;
}

// The security section with the caller's overrides applied.
void ApplySecurity(const ClientOptions& options, SecurityConfig* security) {
  if (!options.ca_cert.empty()) security->set_ca_cert(options.ca_cert);
  if (!options.cert.empty()) security->set_cert(options.cert);
  if (!options.key.empty()) security->set_key(options.key);
  if (!options.token_file.empty()) security->set_token_file(options.token_file);
  if (options.plaintext >= 0) security->set_plaintext(options.plaintext == 1);
}

absl::StatusOr<JobConfig> PrepareConfig(const ClientOptions& options) {
  ASSIGN_OR_RETURN(JobConfig config,
                   common::ParseJobConfigText(options.config_text, options.config_source));
  for (const std::string& o : options.overrides) {
    RETURN_IF_ERROR(common::ApplyOverride(o, &config));
  }
  if (!options.servers.empty()) {
    RETURN_IF_ERROR(common::ApplyOverride(
        absl::StrCat("cluster.servers=", absl::StrJoin(options.servers, ",")), &config));
  }
  ApplySecurity(options, config.mutable_security());
  if (options.centralized) config.mutable_cluster()->set_num_workers(1);
  RETURN_IF_ERROR_CTX(common::ExpandModelTables(&config), options.config_source);
  RETURN_IF_ERROR_CTX(common::ValidateJobConfig(config), options.config_source);
  return config;
}

TableInfo Describe(const TableConfig& t) {
  TableInfo info;
  info.name = t.name();
  info.sparse = t.kind() == TABLE_KIND_SPARSE;
  if (info.sparse) {
    info.shape = {static_cast<int64_t>(t.dim())};
    info.size = t.dim();
  } else {
    info.shape.assign(t.shape().begin(), t.shape().end());
    info.size = 1;
    for (int64_t d : info.shape) info.size *= d;
  }
  return info;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  std::unique_ptr<Client> client(new Client(options));
  ASSIGN_OR_RETURN(client->config_, PrepareConfig(options));
  const int32_t num_workers =
      options.centralized ? 1 : static_cast<int32_t>(client->config_.cluster().num_workers());
  if (options.worker_index < -1 || options.worker_index >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker_index=", options.worker_index,
                                                   " is out of range: the job has ", num_workers,
                                                   " workers"));
  }
  for (const TableConfig& t : client->config_.tables()) {
    client->table_index_[t.name()] = client->tables_.size();
    client->tables_.push_back(Describe(t));
  }
  // A new incarnation per client, as ps_worker takes its start time.
  const uint64_t incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  if (options.centralized) {
    RETURN_IF_ERROR(client->InitCentralized(incarnation));
  } else {
    RETURN_IF_ERROR(client->InitDistributed(incarnation));
  }
  if (options.worker_index >= 0) {
    if (absl::Status s = client->Resume(); !s.ok()) {
      // A client that never started does not tell the servers that the worker finished (the
      // destructor would): the servers that heard this incarnation let its lease run out.
      client->store_.reset();
      return s;
    }
  }
  return client;
}

// As ps_worker (TrainingJob::MakeTrainerOptions). Under BSP a restarted worker that counted
// from 0 again would be N steps behind the clock the servers hold for it: its pulls would
// pass at once while its empty pushes changed nothing there, so it would run N steps outside
// the bound. A worker that finished and starts again (a new incarnation) resumes the same way:
// the servers take it back into the bound at the clock it finished with (WorkerTracker's
// Lookup keeps the clock across incarnations).
absl::Status Client::Resume() {
  ASSIGN_OR_RETURN(start_position_, store_->ReportPosition(0, 0));
  // Nothing has pushed yet: the servers already hold this clock, so the step after it is the
  // first that needs a push (or Tick's empty one) to be heard.
  clock_.store(start_position_.clock);
  pushed_clock_.store(start_position_.clock);
  return absl::OkStatus();
}

absl::StatusOr<common::WorkerPosition> Client::ReportPosition(uint32_t epoch, uint64_t offset) {
  if (options_.worker_index < 0) {
    return absl::FailedPreconditionError(
        "a tool client (worker_index -1) has no data position: only a training worker "
        "(worker_index 0..num_workers-1) reports one");
  }
  return store_->ReportPosition(epoch, offset);
}

// As ps_worker --centralized (InProcessParameterStore::CreateCentralized, whose shards are
// private): one shard per server index with the same options, called directly; composed here
// because Stats and Checkpoint need the shards.
absl::Status Client::InitCentralized(uint64_t incarnation) {
  ASSIGN_OR_RETURN(uint32_t num_servers, common::NumServers(config_.cluster()));
  std::vector<server::Shard*> raw;
  for (uint32_t s = 0; s < num_servers; ++s) {
    ASSIGN_OR_RETURN(auto shard,
                     server::Shard::Create(config_, server::CentralizedShardOptions(config_, s)));
    raw.push_back(shard.get());
    shards_.push_back(std::move(shard));
  }
  if (!options_.data_dir.empty()) {
    for (uint32_t s = 0; s < num_servers; ++s) {
      server::CheckpointerOptions checkpoint_options;
      checkpoint_options.data_dir = absl::StrCat(options_.data_dir, "/server-", s);
      checkpoint_options.interval = absl::ZeroDuration();  // on demand only
      ASSIGN_OR_RETURN(auto checkpointer,
                       server::Checkpointer::Create(shards_[s].get(), checkpoint_options));
      ASSIGN_OR_RETURN(server::RestoreReport restored, checkpointer->Restore());
      (void)restored;  // a fresh directory restores nothing; an old one resumes
      checkpointers_.push_back(std::move(checkpointer));
    }
  }
  server::InProcessStoreOptions store_options;
  store_options.worker_id = options_.worker_index;
  store_options.worker_incarnation = incarnation;
  store_options.pull_timeout = absl::Seconds(config_.server().max_pull_wait_s());
  ASSIGN_OR_RETURN(store_, server::InProcessParameterStore::Create(raw, store_options));
  return absl::OkStatus();
}

// As ps_worker: GrpcParameterStore with the job's rpc settings (JobStoreOptions).
absl::Status Client::InitDistributed(uint64_t incarnation) {
  const worker::GrpcStoreOptions store_options =
      worker::JobStoreOptions(config_, options_.worker_index, incarnation);
  ASSIGN_OR_RETURN(auto store, worker::GrpcParameterStore::Create(config_, store_options));
  RETURN_IF_ERROR(store->WaitForServers(options_.wait_for_servers));
  store_ = std::move(store);
  ASSIGN_OR_RETURN(admin_, AdminClient::Create(config_, absl::Seconds(config_.rpc().deadline_s())));
  return absl::OkStatus();
}

Client::~Client() {
  // Leaves the consistency bound so that the other workers do not wait for this one, unless
  // the user's own Finish was tried (and, if it failed, reported); the error (a server
  // already gone) has nobody left to report to.
  bool tried;
  {
    absl::MutexLock lock(&finish_mu_);
    tried = finish_tried_;
  }
  if (!tried) Finish().IgnoreError();
  // The store refers to the shards: it goes first.
  store_.reset();
  checkpointers_.clear();
}

absl::StatusOr<const TableInfo*> Client::Table(const std::string& name) const {
  auto it = table_index_.find(name);
  if (it == table_index_.end()) {
    return absl::NotFoundError(absl::StrCat("no table \"", name, "\" in the job's config"));
  }
  return &tables_[it->second];
}

absl::Status Client::Pull(const common::PullBatch& batch) {
  common::PullOptions options;
  options.clock = clock_.load();
  return store_->Pull(batch, options);
}

absl::Status Client::Push(const common::PushBatch& batch) {
  common::PushOptions options;
  options.clock = clock_.load() + 1;
  RETURN_IF_ERROR(store_->Push(batch, options));
  NotePushed(options.clock);
  return absl::OkStatus();
}

void Client::NotePushed(int64_t clock) {
  int64_t seen = pushed_clock_.load();
  while (seen < clock && !pushed_clock_.compare_exchange_weak(seen, clock)) {
  }
}

absl::StatusOr<int64_t> Client::Tick() {
  absl::MutexLock lock(&step_mu_);
  const int64_t next = clock_.load() + 1;
  if (pushed_clock_.load() < next) {
    // Nothing carried this step's clock to the servers yet: an empty push does.
    common::PushOptions options;
    options.clock = next;
    RETURN_IF_ERROR(store_->Push(common::PushBatch(), options));
    NotePushed(next);
  }
  clock_.store(next);
  return next;
}

absl::StatusOr<int64_t> Client::Step(const common::PushBatch& push, const common::PullBatch& pull) {
  absl::MutexLock lock(&step_mu_);
  const int64_t next = clock_.load() + 1;
  if (push.dense.empty() && push.sparse.empty()) {
    // Tick's empty push (once: a step taken again after its pull failed does not repeat it),
    // then the next step's pull; the clock moves only once both succeeded.
    if (pushed_clock_.load() < next) {
      common::PushOptions options;
      options.clock = next;
      RETURN_IF_ERROR(store_->Push(common::PushBatch(), options));
      NotePushed(next);
    }
    common::PullOptions options;
    options.clock = next;
    RETURN_IF_ERROR(store_->Pull(pull, options));
    clock_.store(next);
    return next;
  }
  common::PushOptions push_options;
  push_options.clock = next;
  common::PullOptions pull_options;
  pull_options.clock = next;
  RETURN_IF_ERROR(store_->PushPull(push, push_options, pull, pull_options));
  NotePushed(next);
  clock_.store(next);
  return next;
}

absl::Status Client::Finish() {
  absl::MutexLock lock(&finish_mu_);
  finish_tried_ = true;
  if (finished_ || store_ == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(store_->Finish());
  finished_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Client::Checkpoint() {
  std::vector<std::string> out;
  if (admin_ != nullptr) {
    ASSIGN_OR_RETURN(std::vector<CheckpointResponse> responses, admin_->Checkpoint());
    for (const CheckpointResponse& r : responses) out.push_back(Json(r));
    return out;
  }
  if (checkpointers_.empty()) {
    return absl::FailedPreconditionError(
        "this centralized client has no data_dir to write checkpoints into");
  }
  for (auto& checkpointer : checkpointers_) {
    ASSIGN_OR_RETURN(CheckpointResponse r, checkpointer->CheckpointNow());
    out.push_back(Json(r));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> Client::Stats() {
  std::vector<std::string> out;
  if (admin_ != nullptr) {
    ASSIGN_OR_RETURN(std::vector<StatsResponse> responses, admin_->Stats());
    for (const StatsResponse& r : responses) out.push_back(Json(r));
    return out;
  }
  for (size_t s = 0; s < shards_.size(); ++s) {
    StatsResponse r;
    shards_[s]->FillStats(&r);
    if (s < checkpointers_.size()) checkpointers_[s]->FillStats(&r);
    out.push_back(Json(r));
  }
  return out;
}

}  // namespace ps::python
