// SLURM: hostlists, tasks per node, and the cluster of one srun step (cluster_env.h has the
// rules).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cluster/cluster_env.h"
#include "common/cluster/internal/cluster_env_util.h"
#include "common/status_macros.h"

namespace ps::common {
namespace {

using internal::FirstSet;
using internal::NonNegative;
using internal::Quoted;
using internal::Required;
using internal::RoleName;
using internal::Show;
using internal::Var;

// Hostlists and task lists longer than this are refused (a typo like "n[1-100000000]" must not
// exhaust memory).
constexpr size_t kMaxExpanded = size_t{1} << 20;

// Ports derived from SLURM_JOB_ID: kDerivedPortBase + kDerivedPortStride * (id % kDerivedSlots).
constexpr int32_t kDerivedPortBase = 20000;
constexpr int32_t kDerivedPortStride = 16;
constexpr int32_t kDerivedSlots = 750;

// Splits at commas outside brackets.
absl::StatusOr<std::vector<absl::string_view>> SplitTopLevel(absl::string_view list,
                                                             absl::string_view what) {
  std::vector<absl::string_view> items;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') {
      if (++depth > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " ", Quoted(list), ": nested '[' at offset ", i));
      }
    } else if (c == ']') {
      if (--depth < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " ", Quoted(list), ": ']' without '[' at offset ", i));
      }
    } else if (c == ',' && depth == 0) {
      items.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Quoted(list), ": unclosed '['"));
  }
  return items;
}

// "01-03,07" -> 01 02 03 07, keeping the lower bound's width.
absl::Status ExpandRanges(absl::string_view ranges, std::vector<std::string>* out,
                          const std::function<absl::Status(absl::string_view)>& bad) {
  if (ranges.empty()) return bad("empty []");
  for (absl::string_view range : absl::StrSplit(ranges, ',')) {
    std::pair<absl::string_view, absl::string_view> bounds = absl::StrSplit(range, '-');
    absl::string_view lo_text = bounds.first;
    absl::string_view hi_text =
        bounds.second.empty() && !absl::StrContains(range, '-') ? bounds.first : bounds.second;
    auto all_digits = [](absl::string_view s) {
      return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) {
        return absl::ascii_isdigit(static_cast<unsigned char>(c));
      });
    };
    if (!all_digits(lo_text) || !all_digits(hi_text) ||
        std::count(range.begin(), range.end(), '-') > 1) {
      return bad(absl::StrCat("bad range '", range, "' (expected N or N-M)"));
    }
    uint64_t lo = 0, hi = 0;
    absl::SimpleAtoi(lo_text, &lo);
    absl::SimpleAtoi(hi_text, &hi);
    if (lo > hi) return bad(absl::StrCat("range '", range, "' runs backwards"));
    if (hi - lo >= kMaxExpanded || out->size() + (hi - lo + 1) > kMaxExpanded) {
      return bad(absl::StrCat("more than ", kMaxExpanded, " names"));
    }
    const size_t width = lo_text.size();
    for (uint64_t n = lo; n <= hi; ++n) {
      std::string digits = absl::StrCat(n);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      out->push_back(std::move(digits));
    }
  }
  return absl::OkStatus();
}

// Where every rank of the step runs, from the step's (or else the job's) variables.
struct SlurmLayout {
  Var procid_var, ntasks_var, nodes_var, tpn_var;
  uint32_t procid = 0;
  uint32_t ntasks = 0;
  std::vector<std::string> nodes;
  // Block distribution: rank r runs on nodes[node_of[r]] as its local_of[r]-th task.
  std::vector<uint32_t> node_of, local_of;
};

absl::StatusOr<SlurmLayout> ReadSlurmLayout(const EnvMap& env) {
  SlurmLayout s;
  ASSIGN_OR_RETURN(s.procid_var, Required(env, {"SLURM_PROCID"}, "SLURM"));
  ASSIGN_OR_RETURN(s.ntasks_var, Required(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, "SLURM"));
  // The node list and the task counts must describe the same set (step or job).
  const bool step = env.count("SLURM_STEP_NODELIST") > 0;
  ASSIGN_OR_RETURN(s.nodes_var,
                   step ? Required(env, {"SLURM_STEP_NODELIST"}, "SLURM")
                        : Required(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}, "SLURM"));
  ASSIGN_OR_RETURN(s.tpn_var, step ? Required(env, {"SLURM_STEP_TASKS_PER_NODE"}, "SLURM")
                                   : Required(env, {"SLURM_TASKS_PER_NODE"}, "SLURM"));
  ASSIGN_OR_RETURN(s.procid, NonNegative(s.procid_var));
  ASSIGN_OR_RETURN(s.ntasks, NonNegative(s.ntasks_var));
  ASSIGN_OR_RETURN(s.nodes, ExpandHostlist(s.nodes_var.value), s.nodes_var.name);
  ASSIGN_OR_RETURN(std::vector<uint32_t> per_node, ExpandTasksPerNode(s.tpn_var.value),
                   s.tpn_var.name);
  if (s.nodes.size() != per_node.size()) {
    return absl::InvalidArgumentError(absl::StrCat(Show(s.nodes_var), " names ", s.nodes.size(),
                                                   " nodes but ", Show(s.tpn_var), " counts ",
                                                   per_node.size()));
  }
  uint64_t total = 0;
  for (uint32_t n : per_node) total += n;
  if (total != s.ntasks) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(s.tpn_var), " adds up to ", total, " tasks but ", Show(s.ntasks_var)));
  }
  if (s.procid >= s.ntasks) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(s.procid_var), " is out of range for ", Show(s.ntasks_var)));
  }
  s.node_of.resize(s.ntasks);
  s.local_of.resize(s.ntasks);
  for (uint32_t node = 0, rank = 0; node < per_node.size(); ++node) {
    for (uint32_t local = 0; local < per_node[node]; ++local, ++rank) {
      s.node_of[rank] = node;
      s.local_of[rank] = local;
    }
  }
  return s;
}

// SLURM_NODEID / SLURM_LOCALID, when set, must be where the block layout puts this rank:
// another --distribution would put the servers elsewhere than the workers compute.
absl::Status CheckBlockLayout(const EnvMap& env, const SlurmLayout& s) {
  for (const char* name : {"SLURM_NODEID", "SLURM_LOCALID"}) {
    std::optional<Var> var = FirstSet(env, {name});
    if (!var) continue;
    ASSIGN_OR_RETURN(uint32_t value, NonNegative(*var));
    const uint32_t node = s.node_of[s.procid];
    const uint32_t local = s.local_of[s.procid];
    if (value != (var->name == "SLURM_NODEID" ? node : local)) {
      return absl::InvalidArgumentError(absl::StrCat(
          Show(*var), " but the block layout of ", Show(s.nodes_var), " and ", Show(s.tpn_var),
          " puts ", Show(s.procid_var), " at node ", node, " (", s.nodes[node], ") local rank ",
          local, ": run the step with the default --distribution=block"));
    }
  }
  return absl::OkStatus();
}

// The servers' base port; *rule says where it came from, for messages.
absl::StatusOr<int32_t> SlurmBasePort(const EnvMap& env, const SlurmOptions& options,
                                      const SlurmLayout& s, std::string* rule) {
  uint32_t max_local = 0;
  for (uint32_t r = 0; r < options.num_servers; ++r) max_local = std::max(max_local, s.local_of[r]);
  int32_t base_port = options.base_port;
  *rule = absl::StrCat("--base_port=", base_port);
  if (base_port <= 0) {
    ASSIGN_OR_RETURN(Var job_var, Required(env, {"SLURM_JOB_ID"}, "SLURM"));
    ASSIGN_OR_RETURN(uint32_t job_id, NonNegative(job_var));
    base_port =
        kDerivedPortBase + kDerivedPortStride * static_cast<int32_t>(job_id % kDerivedSlots);
    *rule = absl::StrCat("base port ", base_port, " from ", Show(job_var));
    if (max_local >= static_cast<uint32_t>(kDerivedPortStride)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a server has local rank ", max_local, " on its node (", Show(s.tpn_var),
                       "); ports derived from SLURM_JOB_ID allow ", kDerivedPortStride,
                       " per node: give --base_port"));
    }
  }
  if (static_cast<int64_t>(base_port) + max_local > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(*rule, " + local rank ", max_local, " is beyond port 65535"));
  }
  return base_port;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view hostlist) {
  auto bad = [&](absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat("hostlist ", Quoted(hostlist), ": ", problem));
  };
  ASSIGN_OR_RETURN(std::vector<absl::string_view> items, SplitTopLevel(hostlist, "hostlist"));
  std::vector<std::string> hosts;
  for (absl::string_view item : items) {
    if (item.empty()) return bad("empty host name");
    // Every combination of the bracket groups, left to right.
    std::vector<std::string> names = {""};
    size_t pos = 0;
    while (pos < item.size()) {
      const size_t open = item.find('[', pos);
      const absl::string_view literal =
          item.substr(pos, open == absl::string_view::npos ? absl::string_view::npos : open - pos);
      for (std::string& name : names) absl::StrAppend(&name, literal);
      if (open == absl::string_view::npos) break;
      const size_t close = item.find(']', open);  // SplitTopLevel checked the balance.
      std::vector<std::string> numbers;
      RETURN_IF_ERROR(ExpandRanges(item.substr(open + 1, close - open - 1), &numbers, bad));
      if (names.size() * numbers.size() + hosts.size() > kMaxExpanded) {
        return bad(absl::StrCat("more than ", kMaxExpanded, " names"));
      }
      std::vector<std::string> combined;
      combined.reserve(names.size() * numbers.size());
      for (const std::string& name : names) {
        for (const std::string& number : numbers) combined.push_back(absl::StrCat(name, number));
      }
      names = std::move(combined);
      pos = close + 1;
    }
    for (std::string& name : names) {
      if (absl::StrContains(name, ' ')) return bad(absl::StrCat("space in host name '", name, "'"));
      hosts.push_back(std::move(name));
    }
  }
  return hosts;
}

absl::StatusOr<std::vector<uint32_t>> ExpandTasksPerNode(absl::string_view tasks) {
  auto bad = [&](absl::string_view problem) {
    return absl::InvalidArgumentError(
        absl::StrCat("tasks per node ", Quoted(tasks), ": ", problem));
  };
  std::vector<uint32_t> out;
  for (absl::string_view item : absl::StrSplit(tasks, ',')) {
    absl::string_view count_text = item;
    uint64_t repeat = 1;
    const size_t paren = item.find('(');
    if (paren != absl::string_view::npos) {
      count_text = item.substr(0, paren);
      absl::string_view rest = item.substr(paren);
      if (!absl::ConsumePrefix(&rest, "(x") || !absl::ConsumeSuffix(&rest, ")") ||
          !absl::SimpleAtoi(rest, &repeat) || repeat == 0 || !absl::ascii_isdigit(rest[0])) {
        return bad(absl::StrCat("bad repeat in '", item, "' (expected N(xM) with M > 0)"));
      }
    }
    uint32_t count;
    if (count_text.empty() || !absl::ascii_isdigit(count_text[0]) ||
        !absl::SimpleAtoi(count_text, &count) || count == 0) {
      return bad(absl::StrCat("bad count in '", item, "' (expected a positive integer)"));
    }
    if (repeat > kMaxExpanded || out.size() + repeat > kMaxExpanded) {
      return bad(absl::StrCat("more than ", kMaxExpanded, " nodes"));
    }
    out.insert(out.end(), repeat, count);
  }
  return out;
}

absl::StatusOr<ClusterEnv> ClusterFromSlurm(const EnvMap& env, const SlurmOptions& options) {
  ASSIGN_OR_RETURN(SlurmLayout s, ReadSlurmLayout(env));
  if (options.num_servers == 0 || options.num_servers >= s.ntasks) {
    return absl::InvalidArgumentError(absl::StrCat("cluster.num_servers=", options.num_servers,
                                                   " leaves no ",
                                                   options.num_servers == 0 ? "server" : "worker",
                                                   " among the ", Show(s.ntasks_var), " tasks"));
  }
  RETURN_IF_ERROR(CheckBlockLayout(env, s));
  std::string port_rule;
  ASSIGN_OR_RETURN(int32_t base_port, SlurmBasePort(env, options, s, &port_rule));

  ClusterEnv out;
  out.source = ClusterSource::kSlurm;
  for (uint32_t r = 0; r < options.num_servers; ++r) {
    out.servers.push_back(absl::StrCat(s.nodes[s.node_of[r]], ":", base_port + s.local_of[r]));
  }
  out.servers_origin = absl::StrCat("SLURM (", Show(s.nodes_var), ", ", Show(s.tpn_var), ", ",
                                    port_rule, " + local rank)");
  out.num_servers = options.num_servers;
  out.num_servers_origin = "the config";
  out.num_workers = s.ntasks - options.num_servers;
  out.num_workers_origin =
      absl::StrCat("SLURM (", Show(s.ntasks_var), " less ", options.num_servers, " servers)");
  const bool server = s.procid < options.num_servers;
  out.role = server ? ClusterRole::kServer : ClusterRole::kWorker;
  out.index = static_cast<int32_t>(server ? s.procid : s.procid - options.num_servers);
  out.index_origin =
      absl::StrCat(Show(s.procid_var), " with cluster.num_servers=", options.num_servers);
  const uint32_t local = s.local_of[s.procid];
  if (server) {
    out.port = base_port + static_cast<int32_t>(local);
    out.port_origin = absl::StrCat("SLURM (", port_rule, " + local rank ", local, ")");
  }
  out.description = absl::StrCat(
      "SLURM task ", s.procid, " of ", s.ntasks, " on node ", s.nodes[s.node_of[s.procid]],
      " (local rank ", local, "): ", RoleName(out.role), " ", out.index, " of ",
      server ? out.num_servers : out.num_workers, server ? absl::StrCat(", port ", out.port) : "");
  return out;
}

}  // namespace ps::common
