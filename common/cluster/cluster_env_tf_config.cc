// Kubeflow's TF_CONFIG (cluster_env.h has the rules).
//
// The JSON is read by protobuf's parser (JsonStringToMessage) into a google.protobuf.Value
// rather than into a typed message: a typed message takes "ps": "h:1" as a one-entry list and
// "index": "0" as 0, and reports a member of the wrong kind as "invalid value 7 for type
// TYPE_STRING", whereas a Value keeps each member's JSON kind, so every error below names the
// member and what is wrong with it. Protobuf's parser (3.21) refuses duplicate keys but is
// more lenient than RFC 8259 elsewhere (a trailing comma, single quotes, a raw control
// character or an unknown escape in a string); none of these can change what a TF_CONFIG
// that TensorFlow itself accepts means. Its time grows with the square of the nesting depth
// (16,000 levels took 11 s), so the depth is bounded before it parses.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/cluster/cluster_env.h"
#include "common/cluster/internal/cluster_env_util.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace ps::common {
namespace {

using google::protobuf::Value;
using internal::ParseHostPort;
using internal::Quoted;

// Arrays and objects nested deeper than this are refused before parsing. A TF_CONFIG needs 3
// (the root, "cluster", an address list); protobuf's own limit is about 48.
constexpr int kMaxTfConfigDepth = 32;

// True if arrays and objects nest more than `limit` deep in `text`, not counting brackets
// inside double-quoted strings. Linear in the text.
bool NestedDeeperThan(absl::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// "null", "boolean", "number", "string", "array" or "object", for error messages.
const char* KindName(const Value& value) {
  switch (value.kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kBoolValue:
      return "boolean";
    case Value::kNumberValue:
      return "number";
    case Value::kStringValue:
      return "string";
    case Value::kListValue:
      return "array";
    case Value::kStructValue:
      return "object";
    case Value::KIND_NOT_SET:
      break;
  }
  return "value of no kind";
}

// A number as written for a message: integers without a fraction or exponent.
std::string NumberText(double number) {
  if (number == std::floor(number) && std::fabs(number) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(number));
  }
  return absl::StrCat(number);
}

// The member `name` of an object, or nullptr.
const Value* Find(const Value& object, const std::string& name) {
  const auto& fields = object.struct_value().fields();
  auto it = fields.find(name);
  return it == fields.end() ? nullptr : &it->second;
}

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
    if (NestedDeeperThan(text_, kMaxTfConfigDepth)) {
      return Bad(absl::StrCat("not valid JSON: arrays and objects nested more than ",
                              kMaxTfConfigDepth, " deep"));
    }
    Value root;
    // Protobuf 3.21 has its own Status type; only its message is kept.
    const auto parsed = google::protobuf::util::JsonStringToMessage(std::string(text_), &root);
    if (!parsed.ok()) {
      return Bad(absl::StrCat("not valid JSON: ", std::string(parsed.message())));
    }
    if (root.kind_case() != Value::kStructValue) {
      return Bad(absl::StrCat("is a JSON ", KindName(root), ", expected an object"));
    }
    ASSIGN_OR_RETURN(const Value* cluster, Object(root, "cluster"));
    ASSIGN_OR_RETURN(const Value* task, Object(root, "task"));
    ASSIGN_OR_RETURN(Members members, ReadCluster(*cluster));
    return ReadTask(*task, members);
  }

 private:
  absl::Status Bad(absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG=", Quoted(text_), ": ", problem));
  }

  absl::StatusOr<const Value*> Object(const Value& root, const std::string& name) const {
    const Value* value = Find(root, name);
    if (value == nullptr) return Bad(absl::StrCat("no \"", name, "\""));
    if (value->kind_case() != Value::kStructValue) {
      return Bad(
          absl::StrCat("\"", name, "\" is a ", KindName(*value), ", expected an object"));
    }
    return value;
  }

  // The addresses of cluster.<name>; empty when the member is absent.
  absl::StatusOr<std::vector<std::string>> Addresses(const Value& cluster,
                                                     const std::string& name) const {
    std::vector<std::string> out;
    const Value* list = Find(cluster, name);
    if (list == nullptr) return out;
    if (list->kind_case() != Value::kListValue) {
      return Bad(absl::StrCat("cluster.", name, " is a ", KindName(*list),
                              ", expected an array of \"host:port\""));
    }
    for (int i = 0; i < list->list_value().values_size(); ++i) {
      const Value& entry = list->list_value().values(i);
      const bool is_string = entry.kind_case() == Value::kStringValue;
      int32_t port;
      if (!is_string || !ParseHostPort(entry.string_value(), &port)) {
        return Bad(absl::StrCat(
            "cluster.", name, "[", i, "] is ",
            is_string ? Quoted(entry.string_value()) : absl::StrCat("a ", KindName(entry)),
            ", expected \"host:port\" with a port in 1..65535"));
      }
      out.push_back(entry.string_value());
    }
    return out;
  }

  absl::StatusOr<Members> ReadCluster(const Value& cluster) const {
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

  // task.index: an integer >= 0, kept as the double JSON numbers are.
  absl::StatusOr<double> Index(const Value& task) const {
    const Value* index = Find(task, "index");
    if (index == nullptr) return Bad("task.index is missing");
    const bool is_number = index->kind_case() == Value::kNumberValue;
    const double number = is_number ? index->number_value() : -1;
    if (!is_number || number < 0 || number != std::floor(number)) {
      return Bad(absl::StrCat(
          "task.index is ", is_number ? NumberText(number) : absl::StrCat("a ", KindName(*index)),
          ", expected an integer >= 0"));
    }
    return number;
  }

  absl::StatusOr<ClusterEnv> ReadTask(const Value& task, const Members& m) const {
    const Value* type = Find(task, "type");
    if (type == nullptr || type->kind_case() != Value::kStringValue) {
      return Bad(type == nullptr
                     ? "task.type is missing"
                     : absl::StrCat("task.type is a ", KindName(*type), ", expected a string"));
    }
    ASSIGN_OR_RETURN(const double number, Index(task));
    // Any index from 2^53 up is out of range of every list (they come from one environment
    // variable); capping it keeps the conversion defined.
    const int64_t index = static_cast<int64_t>(std::min(number, 0x1p53));
    const std::string& task_type = type->string_value();
    auto out_of_range = [&](absl::string_view member, size_t size) {
      return Bad(absl::StrCat("task.index ", NumberText(number), " is out of range: cluster.",
                              member, " has ", size, size == 1 ? " entry" : " entries"));
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
