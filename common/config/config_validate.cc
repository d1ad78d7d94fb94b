// ValidateJobConfig. Every problem is reported (not just the first), each prefixed with the
// field path, so one run of a launcher shows everything wrong with a config.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/config.h"
#include "common/initializer.h"
#include "common/partitioner.h"

namespace ps::common {
namespace {

class Errors {
 public:
  void Add(absl::string_view path, absl::string_view problem) {
    list_.push_back(absl::StrCat(path, ": ", problem));
  }
  // For messages that already start with their path.
  void AddMessage(absl::string_view message) { list_.emplace_back(message); }

  absl::Status ToStatus() const {
    if (list_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(list_, "; "));
  }

 private:
  std::vector<std::string> list_;
};

void Positive(Errors* errors, absl::string_view path, double value) {
  if (!(value > 0) || !std::isfinite(value))
    errors->Add(path, absl::StrCat("must be > 0, got ", value));
}

void NonNegative(Errors* errors, absl::string_view path, double value) {
  if (!(value >= 0) || !std::isfinite(value)) {
    errors->Add(path, absl::StrCat("must be >= 0, got ", value));
  }
}

// In [0, 1).
void Fraction(Errors* errors, absl::string_view path, double value) {
  if (!(value >= 0 && value < 1)) errors->Add(path, absl::StrCat("must be in [0, 1), got ", value));
}

// gRPC takes message limits as int.
void MessageLimit(Errors* errors, absl::string_view path, uint64_t bytes) {
  if (bytes == 0 || bytes > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    errors->Add(path, absl::StrCat("must be in [1, 2^31 - 1], got ", bytes));
  }
}

void ValidateOptimizer(const std::string& path, const ps::OptimizerConfig& opt, Errors* errors) {
  Positive(errors, path + ".learning_rate", opt.learning_rate());
  Fraction(errors, path + ".momentum", opt.momentum());
  Fraction(errors, path + ".beta1", opt.beta1());
  Fraction(errors, path + ".beta2", opt.beta2());
  Positive(errors, path + ".epsilon", opt.epsilon());
  if (opt.kind() == ps::OptimizerConfig::ADAGRAD) {
    Positive(errors, path + ".initial_accumulator", opt.initial_accumulator());
  } else {
    NonNegative(errors, path + ".initial_accumulator", opt.initial_accumulator());
  }
  NonNegative(errors, path + ".l1", opt.l1());
  NonNegative(errors, path + ".l2", opt.l2());
  NonNegative(errors, path + ".ftrl_beta", opt.ftrl_beta());
  NonNegative(errors, path + ".weight_decay", opt.weight_decay());
  NonNegative(errors, path + ".clip_value", opt.clip_value());
  NonNegative(errors, path + ".clip_norm", opt.clip_norm());
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '/' || c == '-';
}

void ValidateDenseShape(const std::string& path, const ps::TableConfig& table,
                        uint64_t block_floats, Errors* errors) {
  if (table.shape_size() == 0) {
    errors->Add(path + ".shape", "empty (a dense table needs a shape)");
    return;
  }
  uint64_t numel = 1;
  bool ok = true;
  for (int d = 0; d < table.shape_size(); ++d) {
    const int64_t dim = table.shape(d);
    if (dim <= 0) {
      errors->Add(path + ".shape", absl::StrCat("dimension ", d, " is ", dim));
      ok = false;
    } else if (numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
      errors->Add(path + ".shape", "element count overflows 64 bits");
      return;
    } else {
      numel *= static_cast<uint64_t>(dim);
    }
  }
  if (ok && block_floats > 0 &&
      (numel - 1) / block_floats >= std::numeric_limits<uint32_t>::max()) {
    errors->Add(path + ".shape", "needs 2^32 or more blocks; raise cluster.dense_block_floats");
  }
  if (table.dim() != 0) errors->Add(path + ".dim", "set on a dense table (dense tables use shape)");
}

constexpr uint32_t kMaxSparseDim = uint32_t{1} << 20;
constexpr uint32_t kMaxBusyPollUs = 1000000;
// Beyond this, threads of one queue only take turns at it.
constexpr uint32_t kMaxDataThreads = 1024;
constexpr uint32_t kMaxApplyThreads = 1024;

void ValidateTable(int index, const ps::TableConfig& table, uint64_t block_floats, Errors* errors) {
  const std::string path = absl::StrCat("tables[", index, "]");
  switch (table.kind()) {
    case ps::TABLE_KIND_DENSE:
      ValidateDenseShape(path, table, block_floats, errors);
      break;
    case ps::TABLE_KIND_SPARSE:
      if (table.dim() == 0) errors->Add(path + ".dim", "must be > 0 for a sparse table");
      // A row travels whole in one message and is allocated on first touch: a row of 2^20
      // floats (4 MiB) is already far beyond any embedding; more is a typo or an attack.
      if (table.dim() > kMaxSparseDim) {
        errors->Add(path + ".dim", absl::StrCat(table.dim(), " is over the limit of ",
                                                kMaxSparseDim, " floats per row"));
      }
      if (table.shape_size() != 0) {
        errors->Add(path + ".shape", "set on a sparse table (sparse tables use dim)");
      }
      break;
    default:
      errors->Add(path + ".kind", "unspecified (TABLE_KIND_DENSE or TABLE_KIND_SPARSE)");
      return;
  }
  absl::Status init = ValidateInitializer(table.initializer(), table);
  if (!init.ok()) errors->AddMessage(absl::StrCat(path, ".initializer.", init.message()));
  ValidateOptimizer(path + ".optimizer", table.optimizer(), errors);
}

void ValidateTables(const ps::JobConfig& config, Errors* errors) {
  if (config.tables_size() == 0) errors->Add("tables", "none (declare tables or a model)");
  absl::flat_hash_map<std::string, int> first_index;
  for (int i = 0; i < config.tables_size(); ++i) {
    const ps::TableConfig& table = config.tables(i);
    const std::string path = absl::StrCat("tables[", i, "].name");
    if (table.name().empty()) {
      errors->Add(path, "empty");
    } else if (!std::all_of(table.name().begin(), table.name().end(), IsNameChar)) {
      errors->Add(path,
                  absl::StrCat("'", table.name(), "' has characters outside [A-Za-z0-9_./-]"));
    } else if (auto [it, inserted] = first_index.emplace(table.name(), i); !inserted) {
      errors->Add(path, absl::StrCat("'", table.name(), "' duplicates tables[", it->second, "]"));
    }
    ValidateTable(i, table, config.cluster().dense_block_floats(), errors);
  }
}

void ValidateModel(const ps::JobConfig& config, Errors* errors) {
  const ps::ModelConfig& model = config.model();
  if (!model.has_mlp() && !model.has_ctr()) {
    // A tables-only config serves parameter servers and tools; training needs a model
    // (CheckTrainable).
    if (config.tables_size() == 0) errors->Add("model", "not set (mlp or ctr) and no tables declared");
    return;
  }
  if (model.has_mlp() && model.mlp().num_classes() == 1) {
    errors->Add("model.mlp.num_classes", "must be >= 2");
  }
  // The model's tables must be declared as ExpandModelTables would: expanding again is a no-op.
  ps::JobConfig expanded = config;
  absl::Status status = ExpandModelTables(&expanded);
  if (!status.ok()) {
    errors->AddMessage(status.message());
    return;
  }
  for (int i = config.tables_size(); i < expanded.tables_size(); ++i) {
    errors->Add("model", absl::StrCat("needs table '", expanded.tables(i).name(),
                                      "', which is not declared (run ExpandModelTables)"));
  }
}

void ValidateCluster(const ps::ClusterConfig& cluster, Errors* errors) {
  absl::StatusOr<uint32_t> servers = NumServers(cluster);
  if (!servers.ok()) errors->AddMessage(servers.status().message());
  for (int i = 0; i < cluster.servers_size(); ++i) {
    if (cluster.servers(i).empty()) errors->Add(absl::StrCat("cluster.servers[", i, "]"), "empty");
  }
  if (cluster.num_workers() == 0) errors->Add("cluster.num_workers", "must be > 0");
  if (cluster.num_virtual_shards() == 0) {
    errors->Add("cluster.num_virtual_shards", "must be > 0");
  } else if (servers.ok() && cluster.num_virtual_shards() < *servers) {
    errors->Add("cluster.num_virtual_shards",
                absl::StrCat(cluster.num_virtual_shards(), " is less than the ", *servers,
                             " servers (some would hold no sparse rows)"));
  }
  if (cluster.dense_block_floats() == 0) errors->Add("cluster.dense_block_floats", "must be > 0");
}

void Required(Errors* errors, const std::string& value, absl::string_view field,
              absl::string_view format) {
  if (value.empty())
    errors->Add(absl::StrCat("data.", field), absl::StrCat("required for format ", format));
}

void ValidateData(const ps::JobConfig& config, Errors* errors) {
  const ps::DataConfig& data = config.data();
  switch (data.format()) {
    case ps::DataConfig::IDX:
      Required(errors, data.train_images(), "train_images", "IDX");
      Required(errors, data.train_labels(), "train_labels", "IDX");
      if (data.test_images().empty() != data.test_labels().empty()) {
        errors->Add(data.test_images().empty() ? "data.test_images" : "data.test_labels",
                    "required with the other test file");
      }
      Positive(errors, "data.pixel_scale", data.pixel_scale());
      if (data.pixel_scale() > 0 && !std::isfinite(255.0f / data.pixel_scale())) {
        errors->Add("data.pixel_scale", "so small that 255 / it overflows float32");
      }
      if (config.model().has_ctr()) errors->Add("data.format", "IDX needs model.mlp, not ctr");
      break;
    case ps::DataConfig::LIBSVM:
      Required(errors, data.train_file(), "train_file", "LIBSVM");
      break;
    case ps::DataConfig::SYNTHETIC_CTR: {
      const ps::SyntheticCtrConfig& s = data.synthetic();
      if (s.num_train() == 0) errors->Add("data.synthetic.num_train", "must be > 0");
      if (s.num_fields() == 0) errors->Add("data.synthetic.num_fields", "must be > 0");
      if (s.vocabulary_per_field() == 0) {
        errors->Add("data.synthetic.vocabulary_per_field", "must be > 0");
      }
      NonNegative(errors, "data.synthetic.zipf_exponent", s.zipf_exponent());
      NonNegative(errors, "data.synthetic.weight_stddev", s.weight_stddev());
      if (config.model().has_mlp())
        errors->Add("data.format", "SYNTHETIC_CTR needs model.ctr, not mlp");
      break;
    }
    default:
      if (config.model().has_mlp() || config.model().has_ctr()) {
        errors->Add("data.format", "unspecified (IDX, LIBSVM or SYNTHETIC_CTR)");
      }
  }
}

void ValidateTraining(const ps::TrainingConfig& training, Errors* errors) {
  if (training.batch_size() == 0) errors->Add("training.batch_size", "must be > 0");
  if (training.has_staleness() && training.staleness() < 0) {
    errors->Add("training.staleness", absl::StrCat("must be >= 0 (or unset for asynchronous), got ",
                                                   training.staleness()));
  }
  if (training.device() != "cpu" && training.device() != "cuda" && training.device() != "auto") {
    errors->Add("training.device",
                absl::StrCat("'", training.device(), "' is not cpu, cuda or auto"));
  }
  NonNegative(errors, "training.progress_interval_s", training.progress_interval_s());
  if (!(training.target_metric() >= 0 && training.target_metric() <= 1)) {
    errors->Add("training.target_metric",
                absl::StrCat("must be in [0, 1], got ", training.target_metric()));
  }
  // Prefetching step t+1 before pushing step t would wait on its own clock under BSP.
  if (training.prefetch() && training.has_staleness() && training.staleness() == 0) {
    errors->Add("training.prefetch", "needs asynchronous (staleness unset) or SSP (staleness > 0)");
  }
  // Local SGD pulls from the worker's own copy: there is nothing to overlap, and a prefetched
  // pull would miss the previous local step.
  if (training.prefetch() && training.local_sgd().steps() > 0) {
    errors->Add("training.prefetch", "does not combine with local_sgd (its pulls are local)");
  }
  if (training.deterministic() && !(training.has_staleness() && training.staleness() == 0)) {
    errors->Add("training.deterministic", "needs BSP (staleness: 0)");
  }
}

void ValidateSecurity(const ps::SecurityConfig& security, Errors* errors) {
  const bool any_tls =
      !security.ca_cert().empty() || !security.cert().empty() || !security.key().empty();
  if (security.plaintext()) {
    if (any_tls)
      errors->Add("security.plaintext", "set together with ca_cert/cert/key; choose one");
    return;
  }
  if (!any_tls) {
    errors->Add("security", "choose plaintext: true or mutual TLS (ca_cert, cert and key)");
    return;
  }
  if (security.ca_cert().empty()) errors->Add("security.ca_cert", "required for mutual TLS");
  if (security.cert().empty()) errors->Add("security.cert", "required for mutual TLS");
  if (security.key().empty()) errors->Add("security.key", "required for mutual TLS");
}

void ValidateProcesses(const ps::JobConfig& config, Errors* errors) {
  if (config.checkpoint().keep() < 1) errors->Add("checkpoint.keep", "must be >= 1");
  NonNegative(errors, "checkpoint.interval_s", config.checkpoint().interval_s());

  const ps::ServerConfig& server = config.server();
  MessageLimit(errors, "server.max_message_bytes", server.max_message_bytes());
  Positive(errors, "server.worker_lease_s", server.worker_lease_s());
  Positive(errors, "server.max_pull_wait_s", server.max_pull_wait_s());
  // gRPC takes it as an int, as it takes message limits.
  MessageLimit(errors, "server.max_concurrent_streams", server.max_concurrent_streams());
  Positive(errors, "server.max_pool_requests", server.max_pool_requests());
  Positive(errors, "server.handshake_timeout_s", server.handshake_timeout_s());
  Positive(errors, "server.max_pool_request_bytes",
           static_cast<double>(server.max_pool_request_bytes()));
  Positive(errors, "server.max_unsent_answer_bytes",
           static_cast<double>(server.max_unsent_answer_bytes()));
  Positive(errors, "server.max_unsent_answer_bytes_per_peer",
           static_cast<double>(server.max_unsent_answer_bytes_per_peer()));

  const ps::RpcConfig& rpc = config.rpc();
  Positive(errors, "rpc.deadline_s", rpc.deadline_s());
  // Each retry waits twice the one before, up to max_backoff_s: from 0 it would never wait,
  // and a worker would spend its retries in milliseconds against a restarting server.
  Positive(errors, "rpc.initial_backoff_s", rpc.initial_backoff_s());
  if (!(rpc.max_backoff_s() >= rpc.initial_backoff_s())) {
    errors->Add("rpc.max_backoff_s",
                absl::StrCat("must be >= initial_backoff_s (", rpc.initial_backoff_s(), "), got ",
                             rpc.max_backoff_s()));
  }
  if (!(rpc.keepalive_s() >= kMinKeepaliveS && rpc.keepalive_s() <= kMaxKeepaliveS)) {
    errors->Add("rpc.keepalive_s",
                absl::StrCat("must be in [", kMinKeepaliveS, ", ",
                             static_cast<int64_t>(kMaxKeepaliveS), "], got ", rpc.keepalive_s()));
  }
  MessageLimit(errors, "rpc.max_message_bytes", rpc.max_message_bytes());
  // Polling for longer than a second after each event is a thread that never sleeps.
  for (auto [field, us] : {std::pair<const char*, uint32_t>{"server.busy_poll_us",
                                                             server.busy_poll_us()},
                           {"rpc.busy_poll_us", rpc.busy_poll_us()}}) {
    if (us > kMaxBusyPollUs) {
      errors->Add(field, absl::StrCat("must be <= ", kMaxBusyPollUs, " (1 s), got ", us));
    }
  }
  if (server.apply_spin_us() > static_cast<int64_t>(kMaxBusyPollUs)) {
    errors->Add("server.apply_spin_us", absl::StrCat("must be <= ", kMaxBusyPollUs, " (1 s), got ",
                                                     server.apply_spin_us()));
  }

  // Each is a thread started up front: beyond a few thousand, a server cannot start them.
  if (server.num_threads() > kMaxApplyThreads) {
    errors->Add("server.num_threads",
                absl::StrCat("must be <= ", kMaxApplyThreads, ", got ", server.num_threads()));
  }
  if (server.apply_threads() > kMaxApplyThreads) {
    errors->Add("server.apply_threads",
                absl::StrCat("must be <= ", kMaxApplyThreads, ", got ", server.apply_threads()));
  }
  if (server.data_threads() > kMaxDataThreads) {
    errors->Add("server.data_threads", absl::StrCat("must be <= ", kMaxDataThreads, ", got ",
                                                    server.data_threads()));
  }

  if (config.metrics().port() < -1 || config.metrics().port() > 65535) {
    errors->Add("metrics.port",
                absl::StrCat("must be in [-1, 65535], got ", config.metrics().port()));
  }
}

}  // namespace

absl::Status ValidateJobConfig(const ps::JobConfig& config) {
  Errors errors;
  ValidateTables(config, &errors);
  if (config.has_default_optimizer()) {
    ValidateOptimizer("default_optimizer", config.default_optimizer(), &errors);
  }
  ValidateModel(config, &errors);
  ValidateCluster(config.cluster(), &errors);
  ValidateData(config, &errors);
  ValidateTraining(config.training(), &errors);
  ValidateSecurity(config.security(), &errors);
  ValidateProcesses(config, &errors);
  return errors.ToStatus();
}

absl::Status CheckTrainable(const ps::JobConfig& config) {
  if (!config.model().has_mlp() && !config.model().has_ctr()) {
    return absl::InvalidArgumentError("model: not set (mlp or ctr); a worker needs a model to train");
  }
  if (config.data().format() == ps::DataConfig::FORMAT_UNSPECIFIED) {
    return absl::InvalidArgumentError("data.format: unspecified (IDX, LIBSVM or SYNTHETIC_CTR)");
  }
  return absl::OkStatus();
}

}  // namespace ps::common
