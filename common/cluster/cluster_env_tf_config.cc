// Kubeflow's TF_CONFIG (cluster_env.h has the rules).
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/cluster/cluster_env.h"
#include "common/cluster/internal/cluster_env_util.h"
#include "common/cluster/json.h"
#include "common/status_macros.h"

namespace ps::common {
namespace {

using internal::ParseHostPort;
using internal::Quoted;

// The members of "cluster" that make up the job.
struct Members {
  std::vector<std::string> ps;
  std::vector<std::string> workers;
  std::vector<std::string> chief;  // At most one.
  std::string chief_name;          // "chief" or "master".
};

// Every error names the variable and its whole value.
class TfConfigReader {
 public:
  explicit TfConfigReader(absl::string_view text) : text_(text) {}

  absl::StatusOr<ClusterEnv> Read() const {
    if (absl::StripAsciiWhitespace(text_).empty()) return Bad("empty");
    absl::StatusOr<JsonValue> root = ParseJson(text_);
    if (!root.ok()) return Bad(absl::StrCat("not valid JSON: ", root.status().message()));
    if (root->type != JsonValue::Type::kObject) {
      return Bad(
          absl::StrCat("is a JSON ", JsonValue::TypeName(root->type), ", expected an object"));
    }
    ASSIGN_OR_RETURN(const JsonValue* cluster, Object(*root, "cluster"));
    ASSIGN_OR_RETURN(const JsonValue* task, Object(*root, "task"));
    ASSIGN_OR_RETURN(Members members, ReadCluster(*cluster));
    return ReadTask(*task, members);
  }

 private:
  absl::Status Bad(absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG=", Quoted(text_), ": ", problem));
  }

  absl::StatusOr<const JsonValue*> Object(const JsonValue& root, absl::string_view name) const {
    const JsonValue* value = root.Find(name);
    if (value == nullptr) return Bad(absl::StrCat("no \"", name, "\""));
    if (value->type != JsonValue::Type::kObject) {
      return Bad(absl::StrCat("\"", name, "\" is a ", JsonValue::TypeName(value->type),
                              ", expected an object"));
    }
    return value;
  }

  // The addresses of cluster.<name>; empty when the member is absent.
  absl::StatusOr<std::vector<std::string>> Addresses(const JsonValue& cluster,
                                                     absl::string_view name) const {
    std::vector<std::string> out;
    const JsonValue* list = cluster.Find(name);
    if (list == nullptr) return out;
    if (list->type != JsonValue::Type::kArray) {
      return Bad(absl::StrCat("cluster.", name, " is a ", JsonValue::TypeName(list->type),
                              ", expected an array of \"host:port\""));
    }
    for (size_t i = 0; i < list->array.size(); ++i) {
      const JsonValue& entry = list->array[i];
      int32_t port;
      if (entry.type != JsonValue::Type::kString || !ParseHostPort(entry.string_value, &port)) {
        return Bad(absl::StrCat("cluster.", name, "[", i, "] is ",
                                entry.type == JsonValue::Type::kString
                                    ? Quoted(entry.string_value)
                                    : absl::StrCat("a ", JsonValue::TypeName(entry.type)),
                                ", expected \"host:port\" with a port in 1..65535"));
      }
      out.push_back(entry.string_value);
    }
    return out;
  }

  absl::StatusOr<Members> ReadCluster(const JsonValue& cluster) const {
    Members m;
    ASSIGN_OR_RETURN(m.ps, Addresses(cluster, "ps"));
    ASSIGN_OR_RETURN(m.workers, Addresses(cluster, "worker"));
    ASSIGN_OR_RETURN(m.chief, Addresses(cluster, "chief"));
    ASSIGN_OR_RETURN(std::vector<std::string> master, Addresses(cluster, "master"));
    if (!m.chief.empty() && !master.empty()) {
      return Bad("cluster has both \"chief\" and \"master\" (two names for the same task)");
    }
    m.chief_name = master.empty() ? "chief" : "master";
    if (!master.empty()) m.chief = master;
    if (m.chief.size() > 1) {
      return Bad(absl::StrCat("cluster.", m.chief_name, " lists ", m.chief.size(),
                              " tasks; a job has at most one"));
    }
    if (m.ps.empty()) return Bad("cluster.ps is missing or empty: the job needs a server");
    if (m.chief.empty() && m.workers.empty()) {
      return Bad("cluster.worker and cluster.chief are missing or empty: the job needs a worker");
    }
    return m;
  }

  absl::StatusOr<ClusterEnv> ReadTask(const JsonValue& task, const Members& m) const {
    const JsonValue* type = task.Find("type");
    if (type == nullptr || type->type != JsonValue::Type::kString) {
      return Bad(type == nullptr ? "task.type is missing"
                                 : absl::StrCat("task.type is a ", JsonValue::TypeName(type->type),
                                                ", expected a string"));
    }
    const JsonValue* index_value = task.Find("index");
    if (index_value == nullptr) return Bad("task.index is missing");
    if (!index_value->IsInteger() || index_value->number < 0) {
      return Bad(absl::StrCat("task.index is ",
                              index_value->type == JsonValue::Type::kNumber
                                  ? index_value->number_text
                                  : absl::StrCat("a ", JsonValue::TypeName(index_value->type)),
                              ", expected an integer >= 0"));
    }
    const int64_t index = static_cast<int64_t>(index_value->number);
    const std::string& task_type = type->string_value;
    auto out_of_range = [&](absl::string_view member, size_t size) {
      return Bad(absl::StrCat("task.index ", index, " is out of range: cluster.", member, " has ",
                              size, size == 1 ? " entry" : " entries"));
    };

    ClusterEnv env = Common(m);
    env.index_origin = absl::StrCat("TF_CONFIG task ", task_type, "[", index, "]");
    if (task_type == "ps") {
      if (index >= static_cast<int64_t>(m.ps.size())) return out_of_range("ps", m.ps.size());
      env.role = ClusterRole::kServer;
      env.index = static_cast<int32_t>(index);
      ParseHostPort(m.ps[index], &env.port);
      env.port_origin = absl::StrCat("TF_CONFIG cluster.ps[", index, "]=", m.ps[index]);
      env.description = absl::StrCat(env.index_origin, ": server ", index, " of ", m.ps.size(),
                                     ", port ", env.port);
    } else if (task_type == "worker") {
      if (index >= static_cast<int64_t>(m.workers.size())) {
        return out_of_range("worker", m.workers.size());
      }
      env.role = ClusterRole::kWorker;
      env.index = static_cast<int32_t>(index + m.chief.size());
      env.description = absl::StrCat(
          env.index_origin, ": worker ", env.index, " of ", env.num_workers,
          m.chief.empty() ? "" : absl::StrCat(" (the ", m.chief_name, " is worker 0)"));
    } else if (task_type == "chief" || task_type == "master") {
      if (task_type != m.chief_name || m.chief.empty()) {
        return Bad(absl::StrCat("task.type is \"", task_type, "\" but cluster.", task_type,
                                " is missing"));
      }
      if (index != 0) return out_of_range(task_type, 1);
      env.role = ClusterRole::kWorker;
      env.index = 0;
      env.description = absl::StrCat(env.index_origin, ": worker 0 of ", env.num_workers);
    } else {
      return Bad(absl::StrCat("task.type \"", task_type,
                              "\" has no role in a parameter-server job (expected ps, worker or "
                              "chief)"));
    }
    return env;
  }

  // What every task of the job agrees on.
  static ClusterEnv Common(const Members& m) {
    ClusterEnv env;
    env.source = ClusterSource::kTfConfig;
    env.servers = m.ps;
    env.servers_origin = "TF_CONFIG cluster.ps";
    env.num_servers = static_cast<uint32_t>(m.ps.size());
    env.num_servers_origin = absl::StrCat("TF_CONFIG (cluster.ps has ", m.ps.size(), ")");
    env.num_workers = static_cast<uint32_t>(m.chief.size() + m.workers.size());
    env.num_workers_origin =
        m.chief.empty() ? absl::StrCat("TF_CONFIG (cluster.worker has ", m.workers.size(), ")")
                        : absl::StrCat("TF_CONFIG (cluster.", m.chief_name,
                                       " and cluster.worker have ", env.num_workers, ")");
    return env;
  }

  absl::string_view text_;
};

}  // namespace

absl::StatusOr<ClusterEnv> ClusterFromTfConfig(absl::string_view tf_config) {
  return TfConfigReader(tf_config).Read();
}

}  // namespace ps::common
