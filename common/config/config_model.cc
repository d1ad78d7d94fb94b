// The tables a model section needs, and ExpandModelTables. See config.h for the naming scheme,
// which the worker's models rely on.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/config.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ps::common {
namespace {

ps::TableConfig DenseTable(const std::string& name, uint32_t rows, uint32_t cols,
                           ps::InitializerConfig::Kind init) {
  ps::TableConfig table;
  table.set_name(name);
  table.set_kind(ps::TABLE_KIND_DENSE);
  if (rows != 0) table.add_shape(rows);
  table.add_shape(cols);
  table.mutable_initializer()->set_kind(init);
  return table;
}

// Checks that every width is positive; `fields[i]` names widths[i] for the message.
absl::Status CheckWidths(const std::vector<uint32_t>& widths,
                         const std::vector<std::string>& fields) {
  for (size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] == 0) return absl::InvalidArgumentError(absl::StrCat(fields[i], ": must be > 0"));
  }
  return absl::OkStatus();
}

// Field paths of the widths of an MLP-style stack: first, hidden[i]..., last.
std::vector<std::string> WidthFields(const std::string& prefix, const std::string& first,
                                     int hidden, const std::string& last) {
  std::vector<std::string> fields = {absl::StrCat(prefix, first)};
  for (int i = 0; i < hidden; ++i) fields.push_back(absl::StrCat(prefix, "hidden[", i, "]"));
  fields.push_back(absl::StrCat(prefix, last));
  return fields;
}

// Appends weight and bias tables for layers with `widths`, named by `weight`/`bias`.
template <typename Config>
void AddLayers(const Config& config, const std::vector<uint32_t>& widths,
               std::string (*weight)(const Config&, int), std::string (*bias)(const Config&, int),
               std::vector<ps::TableConfig>* tables) {
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const int layer = static_cast<int>(i);
    tables->push_back(DenseTable(weight(config, layer), widths[i], widths[i + 1],
                                 ps::InitializerConfig::GLOROT_UNIFORM));
    tables->push_back(
        DenseTable(bias(config, layer), 0, widths[i + 1], ps::InitializerConfig::ZEROS));
  }
}

std::string Describe(const ps::TableConfig& table) {
  if (table.kind() == ps::TABLE_KIND_SPARSE) return absl::StrCat("sparse, dim ", table.dim());
  if (table.kind() == ps::TABLE_KIND_DENSE) {
    return absl::StrCat("dense, shape [", absl::StrJoin(table.shape(), ", "), "]");
  }
  return "kind unspecified";
}

bool SameLayout(const ps::TableConfig& a, const ps::TableConfig& b) {
  if (a.kind() != b.kind()) return false;
  if (a.kind() == ps::TABLE_KIND_SPARSE) return a.dim() == b.dim();
  return a.shape_size() == b.shape_size() &&
         std::equal(a.shape().begin(), a.shape().end(), b.shape().begin());
}

// For CTR: a declared embedding table decides the width when embedding_dim is not set. The
// width is then always written out explicitly, so that expanding again changes nothing.
void SettleEmbeddingDim(ps::JobConfig* config) {
  if (!config->model().has_ctr()) return;
  ps::CtrConfig* ctr = config->mutable_model()->mutable_ctr();
  if (!ctr->has_embedding_dim()) {
    for (const ps::TableConfig& table : config->tables()) {
      if (table.name() == ctr->embedding_table() && table.kind() == ps::TABLE_KIND_SPARSE &&
          table.dim() > 0) {
        ctr->set_embedding_dim(table.dim());
        return;
      }
    }
  }
  ctr->set_embedding_dim(ctr->embedding_dim());
}

}  // namespace

std::vector<uint32_t> MlpLayerWidths(const ps::MlpConfig& mlp) {
  std::vector<uint32_t> widths = {mlp.input_dim()};
  widths.insert(widths.end(), mlp.hidden().begin(), mlp.hidden().end());
  widths.push_back(mlp.num_classes());
  return widths;
}

int MlpNumLayers(const ps::MlpConfig& mlp) { return mlp.hidden_size() + 1; }

std::string MlpWeightTable(const ps::MlpConfig& mlp, int layer) {
  DCHECK(layer >= 0 && layer < MlpNumLayers(mlp)) << layer;
  return absl::StrCat(mlp.table_prefix(), layer, ".w");
}

std::string MlpBiasTable(const ps::MlpConfig& mlp, int layer) {
  DCHECK(layer >= 0 && layer < MlpNumLayers(mlp)) << layer;
  return absl::StrCat(mlp.table_prefix(), layer, ".b");
}

std::vector<uint32_t> CtrLayerWidths(const ps::CtrConfig& ctr) {
  std::vector<uint32_t> widths = {ctr.embedding_dim()};
  widths.insert(widths.end(), ctr.hidden().begin(), ctr.hidden().end());
  widths.push_back(1);
  return widths;
}

int CtrNumDenseLayers(const ps::CtrConfig& ctr) { return ctr.hidden_size() + 1; }

std::string CtrWeightTable(const ps::CtrConfig& ctr, int layer) {
  DCHECK(layer >= 0 && layer < CtrNumDenseLayers(ctr)) << layer;
  return absl::StrCat(ctr.dense_prefix(), layer, ".w");
}

std::string CtrBiasTable(const ps::CtrConfig& ctr, int layer) {
  DCHECK(layer >= 0 && layer < CtrNumDenseLayers(ctr)) << layer;
  return absl::StrCat(ctr.dense_prefix(), layer, ".b");
}

absl::StatusOr<std::vector<ps::TableConfig>> ModelTables(const ps::ModelConfig& model) {
  std::vector<ps::TableConfig> tables;
  if (model.has_mlp()) {
    const ps::MlpConfig& mlp = model.mlp();
    if (mlp.table_prefix().empty()) {
      return absl::InvalidArgumentError("model.mlp.table_prefix: empty");
    }
    std::vector<uint32_t> widths = MlpLayerWidths(mlp);
    RETURN_IF_ERROR(CheckWidths(
        widths, WidthFields("model.mlp.", "input_dim", mlp.hidden_size(), "num_classes")));
    AddLayers(mlp, widths, &MlpWeightTable, &MlpBiasTable, &tables);
  } else if (model.has_ctr()) {
    const ps::CtrConfig& ctr = model.ctr();
    if (ctr.embedding_table().empty()) {
      return absl::InvalidArgumentError("model.ctr.embedding_table: empty");
    }
    if (ctr.dense_prefix().empty()) {
      return absl::InvalidArgumentError("model.ctr.dense_prefix: empty");
    }
    std::vector<uint32_t> widths = CtrLayerWidths(ctr);
    RETURN_IF_ERROR(CheckWidths(
        widths, WidthFields("model.ctr.", "embedding_dim", ctr.hidden_size(), "(output)")));
    ps::TableConfig embedding;
    embedding.set_name(ctr.embedding_table());
    embedding.set_kind(ps::TABLE_KIND_SPARSE);
    embedding.set_dim(ctr.embedding_dim());
    embedding.mutable_initializer()->set_kind(ps::InitializerConfig::NORMAL);
    embedding.mutable_initializer()->set_mean(0.0f);
    embedding.mutable_initializer()->set_stddev(0.01f);
    tables.push_back(std::move(embedding));
    AddLayers(ctr, widths, &CtrWeightTable, &CtrBiasTable, &tables);
  }
  return tables;
}

absl::Status ExpandModelTables(ps::JobConfig* config) {
  SettleEmbeddingDim(config);
  ASSIGN_OR_RETURN(std::vector<ps::TableConfig> needed, ModelTables(config->model()));
  absl::flat_hash_map<std::string, int> declared;
  for (int i = 0; i < config->tables_size(); ++i) declared.emplace(config->tables(i).name(), i);
  for (ps::TableConfig& table : needed) {
    auto it = declared.find(table.name());
    if (it == declared.end()) {
      *config->add_tables() = std::move(table);
      continue;
    }
    ps::TableConfig* existing = config->mutable_tables(it->second);
    if (!SameLayout(*existing, table)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tables[", it->second, "]: table '", table.name(), "' is declared as ",
                       Describe(*existing), " but the model needs ", Describe(table)));
    }
    if (!existing->has_initializer()) *existing->mutable_initializer() = table.initializer();
  }
  for (ps::TableConfig& table : *config->mutable_tables()) {
    if (!table.has_optimizer()) *table.mutable_optimizer() = config->default_optimizer();
  }
  return absl::OkStatus();
}

}  // namespace ps::common
