// ps_bench --modes=echo: the plain-gRPC reference (bench/echo_server_main.cc), and raw TCP to a
// server in a child process (the same process boundary as every gRPC row). One client
// thread makes unary calls of a generated stub to an echo server in a child process, shaped
// as the dense rows are: "push" sends the payload and gets an empty answer, "pull" sends an
// empty request and gets the payload back. Costs per call are counted for both processes, as
// for the parameter server, so the echo rows say what gRPC itself costs on this machine and
// the dense rows what the project adds on top.

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_process.h"
#include "bench/echo.grpc.pb.h"
#include "bench/ps_bench.h"
#include "bench/raw_tcp.h"
#include "common/rpc/credentials.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace ps::bench {
namespace {

// Beside this binary (bazel-bin/bench/), else its runfiles, else the workspace's bazel-bin.
std::string FindEchoBinary() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::vector<std::string> candidates;
  if (!ec) {
    candidates.push_back((self.parent_path() / "echo_server").string());
    candidates.push_back(self.string() + ".runfiles/ps/bench/echo_server");
  }
  candidates.push_back("bazel-bin/bench/echo_server");
  for (const std::string& c : candidates) {
    if (std::filesystem::exists(c, ec)) return c;
  }
  return candidates.back();
}

// One echo server (a child process) and a channel to it. Stops the child when destroyed.
struct EchoTarget {
  std::string dir;
  std::unique_ptr<ChildProcess> server;
  int port = 0;
  std::unique_ptr<Echo::Stub> stub;  // null for the raw-TCP server
  ~EchoTarget() {
    if (server != nullptr) server->Stop(absl::Seconds(5));
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

uint64_t MaxPayload(const BenchOptions& f) {
  uint64_t max_bytes = 1;
  for (uint64_t b : f.payloads) max_bytes = std::max(max_bytes, b);
  return max_bytes;
}

// Starts bench/echo_server with `flags` and waits for its port.
absl::StatusOr<std::unique_ptr<EchoTarget>> StartServer(const std::vector<std::string>& flags) {
  auto target = std::make_unique<EchoTarget>();
  ASSIGN_OR_RETURN(target->dir, MakeTempDir("ps_bench_echo."));
  const std::string port_file = target->dir + "/port";
  std::vector<std::string> argv = {FindEchoBinary(), "--port_file=" + port_file};
  argv.insert(argv.end(), flags.begin(), flags.end());
  ASSIGN_OR_RETURN(target->server, ChildProcess::Start(argv, target->dir + "/echo.log"));
  absl::StatusOr<std::string> port =
      WaitForFileLine(port_file, absl::Seconds(30), target->server.get());
  if (!port.ok() || !absl::SimpleAtoi(*port, &target->port)) {
    const absl::Status s = port.ok() ? absl::InternalError("bad port file") : port.status();
    return absl::Status(s.code(), absl::StrCat("echo server (", argv[0], "): ", s.message(),
                                               "\n", target->server->LogTail(20)));
  }
  return target;
}

absl::StatusOr<std::unique_ptr<EchoTarget>> StartEcho(const BenchOptions& f,
                                                      const std::string& api) {
  const uint64_t max_bytes = MaxPayload(f);
  std::vector<std::string> flags = {"--api=" + api,
                                    absl::StrCat("--max_reply_bytes=", max_bytes)};
  if (f.echo_data_path_args) flags.push_back("--data_path_args");
  ASSIGN_OR_RETURN(std::unique_ptr<EchoTarget> target, StartServer(flags));
  grpc::ChannelArguments args;
  const int max_message = static_cast<int>(std::min<uint64_t>(max_bytes + 4096, INT32_MAX));
  args.SetMaxReceiveMessageSize(max_message);
  args.SetMaxSendMessageSize(max_message);
  if (f.echo_data_path_args) {
    for (const auto& [name, value] : common::DataPathChannelArgs()) args.SetInt(name, value);
  }
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", target->port),
                                           grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(30)))) {
    return absl::UnavailableError(
        absl::StrCat("echo server on port ", target->port, " not reachable"));
  }
  target->stub = Echo::NewStub(channel);
  return target;
}

// The costs per call of both processes, the ratio to raw TCP of one in-process connection.
absl::StatusOr<BenchRow> Measure(const BenchEnv& env, EchoTarget* target, const LoadCall& call,
                                 const std::string& what, const BenchRow& shape) {
  BenchEnv echo_env = env;
  echo_env.cluster = nullptr;
  echo_env.server_pids = {target->server->pid()};
  BenchRow usage;
  ASSIGN_OR_RETURN(LoadResult r, RunChecked(echo_env, 1, call, what, &usage));
  BenchRow row =
      MakeRow(shape.mode, shape.op, shape.payload, shape.payload_bytes, 0, 1, 1, r);
  row.client_per_call = usage.client_per_call;
  row.server_per_call = usage.server_per_call;
  if (auto it = env.tcp_mb_per_s.find({row.payload_bytes, 1});
      it != env.tcp_mb_per_s.end() && it->second > 0) {
    row.vs_tcp = row.mb_per_second / it->second;
  }
  return row;
}

// Raw-TCP request/reply to a server in a child process: the raw baseline's figures with the
// process boundary the gRPC servers have.
absl::StatusOr<std::vector<BenchRow>> RunRawTcpChild(const BenchEnv& env) {
  ASSIGN_OR_RETURN(std::unique_ptr<EchoTarget> target, StartServer({"--raw_tcp"}));
  ASSIGN_OR_RETURN(auto client, RawTcpClient::Connect(target->port));
  std::vector<BenchRow> rows;
  for (uint64_t bytes : env.flags->payloads) {
    const std::string payload(bytes, 'p');
    BenchRow shape;
    shape.mode = "tcp_child";
    shape.op = "req_reply";
    shape.payload = FormatBytes(bytes);
    shape.payload_bytes = bytes;
    ASSIGN_OR_RETURN(BenchRow row,
                     Measure(env, target.get(), [&](int) { return client->Call(payload); },
                             absl::StrCat("raw tcp to a child process ", FormatBytes(bytes)),
                             shape));
    rows.push_back(std::move(row));
  }
  return rows;
}

absl::StatusOr<BenchRow> RunEchoOp(const BenchEnv& env, const std::string& api,
                                   EchoTarget* target, uint64_t bytes, bool push) {
  EchoRequest request;
  if (push) {
    request.set_payload(std::string(bytes, 'p'));
  } else {
    request.set_reply_bytes(bytes);
  }
  EchoReply reply;
  // As the store's calls: a deadline on every call (the bench config's rpc.deadline_s).
  const absl::Duration deadline = absl::Seconds(30);
  auto call = [&](int) -> absl::Status {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    RETURN_IF_ERROR(common::FromGrpcStatus(target->stub->Call(&context, request, &reply)));
    if (reply.payload().size() != (push ? 0 : bytes)) {
      return absl::InternalError(absl::StrCat("echo answered ", reply.payload().size(),
                                              " bytes"));
    }
    return absl::OkStatus();
  };
  BenchRow shape;
  shape.mode = absl::StrCat("echo_", api);
  shape.op = push ? "push" : "pull";
  shape.payload = FormatBytes(bytes);
  shape.payload_bytes = bytes;
  return Measure(env, target, call,
                 absl::StrCat("echo (", api, ") ", shape.op, " ", shape.payload), shape);
}

}  // namespace

absl::StatusOr<std::vector<BenchRow>> RunEcho(BenchEnv* env) {
  const BenchOptions& f = *env->flags;
  ASSIGN_OR_RETURN(std::vector<BenchRow> rows, RunRawTcpChild(*env));
  for (const std::string& api : f.echo_apis) {
    ASSIGN_OR_RETURN(std::unique_ptr<EchoTarget> target, StartEcho(f, api));
    for (uint64_t bytes : f.payloads) {
      for (bool push : f.dense_ops) {
        ASSIGN_OR_RETURN(BenchRow row, RunEchoOp(*env, api, target.get(), bytes, push));
        rows.push_back(std::move(row));
      }
    }
  }
  return rows;
}

}  // namespace ps::bench
