// echo_server: the plain-gRPC reference that ps_bench --modes=echo measures next to raw TCP
// and the parameter server. One unary method (bench/echo.proto), served with gRPC's own
// machinery and nothing of this project's data path: no frames, no identity checks, no
// completion-queue loop of our own. ps_bench starts it as a child process (so its CPU time and
// context switches are counted apart from the client's, as a ps_server's are):
//
//   echo_server --port_file=F [--api=sync|callback] [--max_reply_bytes=N] [--data_path_args]
//   echo_server --port_file=F --raw_tcp
//
// It binds 127.0.0.1:0 (plaintext, as the bench's servers), writes the port to F and serves
// until SIGTERM/SIGINT. With --raw_tcp it serves ps_bench's raw-TCP request/reply protocol
// (bench/raw_tcp.h) instead: the raw baseline with the same process boundary as the gRPC
// servers (ps_bench's own tcp rows run their server as threads of the client's process). The process settings are those of ps_server (freed memory kept for
// reuse, Abseil's deadlock detection off), so that only the serving code differs.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/echo.grpc.pb.h"
#include "bench/raw_tcp.h"
#include "common/rpc/credentials.h"
#include "common/startup/process_memory.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, port_file, "", "Write the bound port here (required).");
ABSL_FLAG(std::string, api, "sync",
          "gRPC server API: sync (gRPC's own polling threads run the handler) or callback.");
ABSL_FLAG(uint64_t, max_reply_bytes, 64 << 20,
          "Largest reply_bytes answered; also the largest request accepted.");
ABSL_FLAG(bool, raw_tcp, false,
          "Serve raw-TCP request/reply (bench/raw_tcp.h) instead of gRPC.");
ABSL_FLAG(bool, data_path_args, false,
          "Serve with the parameter server's data-path channel arguments "
          "(common/rpc/credentials.h DataPathChannelArgs) instead of gRPC's defaults.");

namespace ps::bench {
namespace {

std::atomic<bool> stop_requested{false};

void OnSignal(int) { stop_requested = true; }

// The answer's bytes, made once; a reply copies its first reply_bytes of them.
class Replies {
 public:
  explicit Replies(uint64_t max) : bytes_(max, 'r') {}
  grpc::Status Fill(const EchoRequest& request, EchoReply* reply) const {
    if (request.reply_bytes() > bytes_.size()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("reply_bytes ", request.reply_bytes(), " > ",
                                       bytes_.size()));
    }
    reply->set_payload(bytes_.data(), request.reply_bytes());
    return grpc::Status::OK;
  }

 private:
  const std::string bytes_;
};

class SyncEcho final : public Echo::Service {
 public:
  explicit SyncEcho(const Replies* replies) : replies_(replies) {}
  grpc::Status Call(grpc::ServerContext*, const EchoRequest* request, EchoReply* reply) override {
    return replies_->Fill(*request, reply);
  }

 private:
  const Replies* replies_;  // Not owned.
};

class CallbackEcho final : public Echo::CallbackService {
 public:
  explicit CallbackEcho(const Replies* replies) : replies_(replies) {}
  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* context, const EchoRequest* request,
                                 EchoReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(replies_->Fill(*request, reply));
    return reactor;
  }

 private:
  const Replies* replies_;  // Not owned.
};

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
    if (!out.good()) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  // Renamed into place whole: the reader never sees a partial line.
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

// Signal handlers only set the flag; this thread looks at it. A parent that ends without
// stopping this server (ps_bench killed) leaves it no reason to run.
void WaitForStop(pid_t parent) {
  while (!stop_requested && getppid() == parent) absl::SleepFor(absl::Milliseconds(50));
}

absl::Status ServeRawTcp(const std::string& port_file, pid_t parent) {
  absl::StatusOr<std::unique_ptr<RawTcpServer>> server = RawTcpServer::Start();
  if (!server.ok()) return server.status();
  if (absl::Status s = WritePortFile(port_file, (*server)->port()); !s.ok()) return s;
  WaitForStop(parent);
  return absl::OkStatus();
}

absl::Status Serve() {
  const pid_t parent = getppid();
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  const std::string api = absl::GetFlag(FLAGS_api);
  const uint64_t max_bytes = absl::GetFlag(FLAGS_max_reply_bytes);
  if (port_file.empty()) return absl::InvalidArgumentError("--port_file is required");
  if (absl::GetFlag(FLAGS_raw_tcp)) return ServeRawTcp(port_file, parent);
  if (api != "sync" && api != "callback") {
    return absl::InvalidArgumentError(absl::StrCat("--api=", api, ": expected sync or callback"));
  }
  if (max_bytes == 0 || max_bytes > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError("--max_reply_bytes: expected 1 .. 1 GB");
  }
  const Replies replies(max_bytes);
  SyncEcho sync(&replies);
  CallbackEcho callback(&replies);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  // The request's payload and framing fit; nothing larger is accepted.
  const int max_message = static_cast<int>(std::min<uint64_t>(max_bytes + 4096, INT_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  if (absl::GetFlag(FLAGS_data_path_args)) {
    for (const auto& [name, value] : common::DataPathChannelArgs()) {
      builder.AddChannelArgument(name, value);
    }
  }
  if (api == "sync") {
    builder.RegisterService(&sync);
  } else {
    builder.RegisterService(&callback);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return absl::UnavailableError("cannot listen on 127.0.0.1");
  if (absl::Status s = WritePortFile(port_file, port); !s.ok()) {
    server->Shutdown();
    return s;
  }
  WaitForStop(parent);
  server->Shutdown(std::chrono::system_clock::now());
  server->Wait();
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As ps_server: before any thread starts.
  if (absl::Status s = ps::common::KeepFreedMemoryForReuse(); !s.ok()) std::cerr << s << "\n";
  ps::common::SkipMutexDeadlockChecks();
  signal(SIGTERM, ps::bench::OnSignal);
  signal(SIGINT, ps::bench::OnSignal);
  const absl::Status status = ps::bench::Serve();
  if (!status.ok()) {
    std::cerr << "echo_server: " << status << std::endl;
    return 1;
  }
  return 0;
}
