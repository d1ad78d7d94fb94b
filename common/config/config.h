// Loading, overriding, expanding and validating the JobConfig (proto/config.proto).
//
// Every process of a job prepares its config the same way, so they all see the same tables:
//
//   ASSIGN_OR_RETURN(ps::JobConfig config, LoadAndPrepareJobConfig(path, overrides));
//
// which is LoadJobConfig (parse the textproto, then apply each --set override in order),
// ExpandModelTables (add the tables the model section needs) and ValidateJobConfig.
//
// Overrides (ApplyOverride) are `path.to.field=value`:
//   training.batch_size=128                     scalar; bools are true/false
//   tables[2].optimizer.learning_rate=0.1       repeated message element by index
//   tables[emb].dim=8                           ... or by its `name` field
//   tables[3].name=new                          index == size appends an element
//   model.mlp.hidden=256,128                    repeated scalar: replaced by the list ("" = empty)
//   model.mlp.hidden[1]=64                      one element of a repeated scalar
//   default_optimizer.kind=ADAM                 enums by name (or number)
//   default_optimizer={kind: ADAM beta1: 0.8}   message: replaced by the textproto in {}
// Table names may contain '.' and '/'; inside [...] they are taken literally.
//
// Model tables (ExpandModelTables):
//   MLP, widths [input_dim, hidden..., num_classes]: layer i (0-based) has
//     <table_prefix><i>.w  dense [width_i, width_i+1], GLOROT_UNIFORM
//     <table_prefix><i>.b  dense [width_i+1], ZEROS
//   CTR: <embedding_table> sparse, dim embedding_dim, NORMAL(0, 0.01); then with widths
//     [embedding_dim, hidden..., 1]: <dense_prefix><i>.w / .b as for the MLP.
// A model table that is already declared is kept, after checking its kind and shape (dense)
// or dim (sparse); when it has no initializer it gets the model's. For CTR, when
// embedding_dim is not set and the embedding table is declared, the declared dim is used
// (and written to embedding_dim; after expansion embedding_dim is always set). Then every table
// without an optimizer gets default_optimizer (or, without one, the OptimizerConfig defaults: SGD,
// lr 0.01). ExpandModelTables is idempotent.
//
// Thread-compatible: the functions are pure apart from LoadJobConfig's file read.
#ifndef PS_COMMON_CONFIG_CONFIG_H_
#define PS_COMMON_CONFIG_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"

namespace ps::common {

// ---- Loading -------------------------------------------------------------------------------

// Parses a JobConfig textproto. `source_name` (usually the file path) prefixes error positions.
// Errors: INVALID_ARGUMENT "<source_name>:<line>:<column>: <problem>" (1-based), for the
// first syntax error, unknown field or bad value.
[[nodiscard]] absl::StatusOr<ps::JobConfig> ParseJobConfigText(absl::string_view text,
                                                               absl::string_view source_name);

// Reads and parses the textproto at `path`, then applies `overrides` in order.
// Errors: NOT_FOUND when `path` does not exist; INVALID_ARGUMENT when it cannot be read (a
// directory, no permission), does not parse, or an override fails. Messages name the path or
// the override.
[[nodiscard]] absl::StatusOr<ps::JobConfig> LoadJobConfig(const std::string& path,
                                                          absl::Span<const std::string> overrides);

// Applies one `path.to.field=value` assignment (syntax in the file comment) via reflection.
// Errors: INVALID_ARGUMENT naming the assignment and the problem: no '=', a malformed path,
// an unknown field (naming the path component and the message type), an index on a
// non-repeated field, an index out of range (more than one past the end) or an unknown
// element name, a value that does not parse for the field's type (naming field and value).
// `*config` may be partly changed when an error is returned.
[[nodiscard]] absl::Status ApplyOverride(const std::string& assignment, ps::JobConfig* config);

// LoadJobConfig + ExpandModelTables + ValidateJobConfig. Errors: those of the three.
[[nodiscard]] absl::StatusOr<ps::JobConfig> LoadAndPrepareJobConfig(
    const std::string& path, absl::Span<const std::string> overrides);

// ---- Model tables --------------------------------------------------------------------------

// [input_dim, hidden..., num_classes]; layer i maps widths[i] -> widths[i + 1].
std::vector<uint32_t> MlpLayerWidths(const ps::MlpConfig& mlp);
// Number of layers: hidden_size() + 1.
int MlpNumLayers(const ps::MlpConfig& mlp);
// "<table_prefix><layer>.w" and "<table_prefix><layer>.b". REQUIRES: 0 <= layer < layers.
std::string MlpWeightTable(const ps::MlpConfig& mlp, int layer);
std::string MlpBiasTable(const ps::MlpConfig& mlp, int layer);

// [embedding_dim, hidden..., 1] for the dense layers on the pooled embedding.
std::vector<uint32_t> CtrLayerWidths(const ps::CtrConfig& ctr);
// Number of dense layers: hidden_size() + 1.
int CtrNumDenseLayers(const ps::CtrConfig& ctr);
// "<dense_prefix><layer>.w" and "<dense_prefix><layer>.b". REQUIRES: 0 <= layer < layers.
std::string CtrWeightTable(const ps::CtrConfig& ctr, int layer);
std::string CtrBiasTable(const ps::CtrConfig& ctr, int layer);

// The tables `model` needs, in order, with kind, shape/dim and initializer set (no
// optimizer). Empty when no model is set.
// Errors: INVALID_ARGUMENT naming the model field, for zero widths or an empty table name.
[[nodiscard]] absl::StatusOr<std::vector<ps::TableConfig>> ModelTables(
    const ps::ModelConfig& model);

// Adds the model's tables to config->tables and fills in optimizers (see the file comment).
// Errors: INVALID_ARGUMENT for a bad model section (see ModelTables) or a declared model table
// whose kind, shape or dim differs from what the model needs (naming tables[i]).
[[nodiscard]] absl::Status ExpandModelTables(ps::JobConfig* config);

// ---- Validation ----------------------------------------------------------------------------

// Bounds of rpc.keepalive_s. A server takes a ping on an idle connection at most once per
// kMinKeepaliveS (GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS) and answers a client
// that pings more often with GOAWAY, closing its connection; gRPC takes the interval as int
// milliseconds.
inline constexpr double kMinKeepaliveS = 5;
inline constexpr double kMaxKeepaliveS = 2147483;

// Checks the whole (expanded) config. Returns INVALID_ARGUMENT listing every problem found,
// "; "-separated, each as "<field path>: <problem>", e.g. "tables[2].shape: dimension 1 is 0".
// Checks: tables (unique names of [A-Za-z0-9_./-]+; kind set; dense: non-empty shape of
// positive dims, no dim, at most 2^32-1 blocks; sparse: dim > 0, no shape; initializer;
// optimizer), default_optimizer, the model (widths > 0, num_classes >= 2, its tables declared
// as ExpandModelTables would), cluster (server count, num_workers > 0,
// num_virtual_shards >= num_servers, dense_block_floats > 0), data (format set; IDX needs
// train_images/train_labels and the model mlp; LIBSVM needs train_file; SYNTHETIC_CTR needs
// the model ctr), training (batch_size > 0, staleness >= 0 when set, device
// cpu|cuda|auto), checkpoint.keep >= 1, security (plaintext XOR ca_cert+cert+key), server, rpc
// and metrics limits.
// Optimizer checks: learning_rate > 0; momentum, beta1, beta2 in [0, 1); epsilon > 0;
// initial_accumulator >= 0 (> 0 for ADAGRAD); l1, l2, ftrl_beta, weight_decay, clip_value,
// clip_norm >= 0; all finite.
[[nodiscard]] absl::Status ValidateJobConfig(const ps::JobConfig& config);

// A config without a model section is valid for servers and tools when it declares tables;
// a worker also needs the model and data sections. INVALID_ARGUMENT naming the missing one.
[[nodiscard]] absl::Status CheckTrainable(const ps::JobConfig& config);

}  // namespace ps::common

#endif  // PS_COMMON_CONFIG_CONFIG_H_
