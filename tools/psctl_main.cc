// psctl: administer the servers of a running job.
//
//   psctl status     --config=job.textproto --servers=h0:p0,h1:p1 [--json]
//   psctl checkpoint --config=job.textproto --servers=...            # now, on all, and wait
//   psctl shutdown   --config=job.textproto --servers=... --reason="why" [--checkpoint=false]
//
// --servers defaults to the config's cluster.servers. The config supplies the security
// settings (TLS certificates, token) and the RPC limits; --set overrides fields of it, e.g.
// the operator's certificate and token (tools/make_certs.sh): checkpoint and shutdown need
// the operator role, status does not. The servers log the reason with the caller.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/config/overrides.h"
#include "common/rpc/credentials.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/unary_call.h"
#include "common/startup/flag_check.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/ps.pb.h"

ABSL_FLAG(std::string, config, "", "The job's JobConfig textproto (required).");
ABSL_FLAG(std::string, servers, "", "Server addresses h:p,... (default: cluster.servers).");
ABSL_FLAG(bool, json, false, "Print JSON (one object per server per line) instead of tables.");
ABSL_FLAG(double, rate_interval_s, 1.0, "status: seconds between the two samples for rates.");
ABSL_FLAG(bool, checkpoint, true, "shutdown: write a final checkpoint first.");
ABSL_FLAG(std::string, reason, "",
          "shutdown (required): why; each server logs it with who asked.");
ABSL_FLAG(std::string, set, "",
          "Config overrides path=value,... e.g. security.cert=operator.pem,security.key=...");
ABSL_FLAG(double, timeout_s, 120, "Deadline of each call, seconds.");

namespace ps::tools {
namespace {

struct Server {
  std::string address;
  std::unique_ptr<grpc::GenericStub> stub;
};

// Calls `method` ("Stats", "Checkpoint", "Shutdown") of server `s`.
absl::Status Call(Server& s, const std::string& method, const google::protobuf::Message& request,
                  google::protobuf::Message* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s))));
  return common::Annotate(
      common::BoundedUnaryCall(*s.stub, &context, absl::StrCat("/ps.ParameterServer/", method),
                               request, common::kMaxAdminAnswerBytes, response),
      s.address);
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  // Cannot fail for our messages (no Any fields); an empty object would show if it did.
  if (!google::protobuf::util::MessageToJsonString(m, &out, options).ok()) out = "{}";
  return out;
}

absl::Status Status(std::vector<Server>& servers) {
  std::vector<StatsResponse> first(servers.size()), second(servers.size());
  for (size_t i = 0; i < servers.size(); ++i) {
    RETURN_IF_ERROR(Call(servers[i], "Stats", StatsRequest(), &first[i]));
  }
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_rate_interval_s)));
  for (size_t i = 0; i < servers.size(); ++i) {
    RETURN_IF_ERROR(Call(servers[i], "Stats", StatsRequest(), &second[i]));
  }
  for (size_t i = 0; i < servers.size(); ++i) {
    const StatsResponse& s = second[i];
    const double dt = std::max(1e-9, s.uptime_s() - first[i].uptime_s());
    const double updates_per_s = (s.updates_applied() - first[i].updates_applied()) / dt;
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("{\"address\":\"%s\",\"updates_per_s\":%.3f,\"stats\":%s}\n",
                  servers[i].address.c_str(), updates_per_s, Json(s).c_str());
      continue;
    }
    std::printf("server %u  %s  incarnation %llu  up %.0f s  updates %llu (%.1f/s)  pulls %llu  "
                "pushes %llu  duplicates %llu\n",
                s.server_index(), servers[i].address.c_str(),
                static_cast<unsigned long long>(s.server_incarnation()), s.uptime_s(),
                static_cast<unsigned long long>(s.updates_applied()), updates_per_s,
                static_cast<unsigned long long>(s.pulls()),
                static_cast<unsigned long long>(s.pushes()),
                static_cast<unsigned long long>(s.duplicate_pushes()));
    std::printf("  checkpoint %llu, %.0f s ago, took %.2f s; storage %.1f MiB\n",
                static_cast<unsigned long long>(s.last_checkpoint_id()), s.last_checkpoint_age_s(),
                s.last_checkpoint_duration_s(), s.storage_bytes() / 1048576.0);
    std::printf("  %-28s %-7s %12s %12s %12s\n", "table", "kind", "rows", "MiB", "updates");
    for (const TableStats& t : s.tables()) {
      std::printf("  %-28s %-7s %12llu %12.1f %12llu\n", t.name().c_str(),
                  t.kind() == TABLE_KIND_DENSE ? "dense" : "sparse",
                  static_cast<unsigned long long>(t.rows()), t.bytes() / 1048576.0,
                  static_cast<unsigned long long>(t.updates_applied()));
    }
    int64_t max_clock = 0;
    for (const WorkerClock& w : s.worker_clocks()) max_clock = std::max(max_clock, w.clock());
    std::printf("  %-8s %10s %10s %6s %12s\n", "worker", "clock", "behind", "live", "last seen");
    for (const WorkerClock& w : s.worker_clocks()) {
      std::printf("  %-8d %10lld %10lld %6s %10.1f s\n", w.worker_id(),
                  static_cast<long long>(w.clock()), static_cast<long long>(max_clock - w.clock()),
                  w.live() ? "yes" : "no", w.seconds_since_seen());
    }
    std::printf("  max staleness seen %lld", static_cast<long long>(s.max_staleness_seen()));
    for (const auto& [reason, n] : s.rejected()) {
      std::printf("; rejected %s: %llu", reason.c_str(), static_cast<unsigned long long>(n));
    }
    std::printf("\n");
  }
  return absl::OkStatus();
}

// A server's failure, printed as it is found (stderr); the others' results still follow.
void ReportFailure(const absl::Status& status) {
  std::fprintf(stderr, "psctl: %s\n", status.ToString().c_str());
}

// OK when every call was; else the first failure's code, saying how many of them failed.
absl::Status Overall(const std::vector<absl::Status>& statuses, absl::string_view what) {
  size_t failed = 0;
  const absl::Status* first = nullptr;
  for (const absl::Status& s : statuses) {
    if (s.ok()) continue;
    ++failed;
    if (first == nullptr) first = &s;
  }
  if (first == nullptr) return absl::OkStatus();
  return absl::Status(first->code(), absl::StrCat(failed, " of ", statuses.size(), " servers ",
                                                  what, " (first: ", first->message(), ")"));
}

absl::Status Checkpoint(std::vector<Server>& servers) {
  std::vector<CheckpointResponse> responses(servers.size());
  std::vector<absl::Status> statuses(servers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < servers.size(); ++i) {
    threads.emplace_back([&, i] {
      statuses[i] = Call(servers[i], "Checkpoint", CheckpointRequest(), &responses[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < servers.size(); ++i) {
    if (!statuses[i].ok()) {
      ReportFailure(statuses[i]);
      continue;
    }
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("{\"address\":\"%s\",\"checkpoint\":%s}\n", servers[i].address.c_str(),
                  Json(responses[i]).c_str());
    } else {
      std::printf("%s: checkpoint %llu, %.1f MiB, %llu updates, %.2f s\n",
                  servers[i].address.c_str(),
                  static_cast<unsigned long long>(responses[i].checkpoint_id()),
                  responses[i].bytes() / 1048576.0,
                  static_cast<unsigned long long>(responses[i].updates_applied()),
                  responses[i].duration_s());
    }
  }
  return Overall(statuses, "did not write the checkpoint");
}

absl::Status Shutdown(std::vector<Server>& servers) {
  ShutdownRequest request;
  request.set_checkpoint(absl::GetFlag(FLAGS_checkpoint));
  request.set_reason(absl::GetFlag(FLAGS_reason));
  if (request.reason().empty()) {
    return absl::InvalidArgumentError("shutdown needs --reason=\"...\" (the servers log it)");
  }
  // Every server is asked, whatever the others answer: one that is down does not keep the
  // rest running.
  std::vector<absl::Status> statuses;
  for (Server& s : servers) {
    ShutdownResponse response;
    statuses.push_back(Call(s, "Shutdown", request, &response));
    if (!statuses.back().ok()) {
      ReportFailure(statuses.back());
      continue;
    }
    std::printf(absl::GetFlag(FLAGS_json) ? "{\"address\":\"%s\",\"shutdown\":true}\n"
                                          : "%s: shutting down\n",
                s.address.c_str());
  }
  return Overall(statuses, "did not take the shutdown");
}

// Flag ranges, checked before anything is read or dialled: a wrong value is refused with its
// range, never wrapped (a port beyond 65535) or waited on (a negative deadline).
absl::Status CheckFlags(const std::string& command) {
  if (command != "status" && command != "checkpoint" && command != "shutdown") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown command '", command, "': expected status, checkpoint or shutdown"));
  }
  if (absl::GetFlag(FLAGS_config).empty()) return absl::InvalidArgumentError("--config is required");
  RETURN_IF_ERROR(common::AllFlagsInRange({
      common::CheckDoubleFlagRange("timeout_s", absl::GetFlag(FLAGS_timeout_s), common::kAboveZero,
                                   86400, "0 < seconds <= 86400"),
      common::CheckDoubleFlagRange("rate_interval_s", absl::GetFlag(FLAGS_rate_interval_s),
                                   common::kAboveZero, 3600, "0 < seconds <= 3600"),
  }));
  for (absl::string_view a :
       absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty())) {
    const size_t colon = a.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(a.substr(colon + 1), &port) || port < 1 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--servers: '", a, "' is not host:port with a port in 1..65535"));
    }
  }
  return absl::OkStatus();
}

absl::Status Run(const std::string& command) {
  RETURN_IF_ERROR(CheckFlags(command));
  ASSIGN_OR_RETURN(JobConfig config,
                   common::LoadJobConfig(absl::GetFlag(FLAGS_config),
                                         common::SplitOverrides(absl::GetFlag(FLAGS_set))));
  std::vector<std::string> addresses(config.cluster().servers().begin(),
                                     config.cluster().servers().end());
  if (!absl::GetFlag(FLAGS_servers).empty()) {
    addresses = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  }
  if (addresses.empty()) {
    return absl::InvalidArgumentError("no servers: pass --servers=h:p,... or set cluster.servers");
  }
  std::vector<Server> servers;
  for (const std::string& a : addresses) {
    ASSIGN_OR_RETURN(auto channel, common::MakeChannel(a, config));
    servers.push_back({a, std::make_unique<grpc::GenericStub>(channel)});
  }
  if (command == "status") return Status(servers);
  if (command == "checkpoint") return Checkpoint(servers);
  if (command == "shutdown") return Shutdown(servers);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown command '", command, "': expected status, checkpoint or shutdown"));
}

}  // namespace
}  // namespace ps::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "psctl status|checkpoint|shutdown --config=job.textproto [--servers=h:p,...] [--json] "
      "[--set=security.cert=...] [--reason=why (shutdown)]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << "usage: psctl status|checkpoint|shutdown --config=F [--servers=h:p,...] [--json]\n";
    return 2;
  }
  absl::Status s = ps::tools::Run(args[1]);
  if (!s.ok()) {
    std::cerr << "psctl: " << s << std::endl;
    return 1;
  }
  return 0;
}
