// ParameterServerService's control methods: Stats, Checkpoint, ServerInfo, Heartbeat and
// Shutdown (the data path's are in service.cc).
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/parameter_store.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/rpc/service.h"
#include "server/rpc/service_internal.h"

namespace ps::server {

using service_internal::Finish;
using service_internal::InfoOf;

grpc::ServerUnaryReactor* ParameterServerService::Stats(grpc::CallbackServerContext* context,
                                                        const StatsRequest* /*request*/,
                                                        StatsResponse* response) {
  shard_->FillStats(response);
  if (hooks_.stats) hooks_.stats(response);
  CountCall("stats", absl::OkStatus());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Checkpoint(grpc::CallbackServerContext* context,
                                                             const CheckpointRequest* /*request*/,
                                                             CheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = auth_.CheckOperator(auth_.Identify(*context), "checkpoint"); !s.ok()) {
    CountCall("checkpoint", s);
    Finish(reactor, s);
    return reactor;
  }
  if (!hooks_.checkpoint) {
    const absl::Status status =
        absl::FailedPreconditionError("this server has no data dir to checkpoint to");
    CountCall("checkpoint", status);
    Finish(reactor, status);
    return reactor;
  }
  pool_.Schedule([this, reactor, response] {
    absl::StatusOr<CheckpointResponse> result = hooks_.checkpoint();
    if (result.ok()) *response = *std::move(result);
    CountCall("checkpoint", result.status());
    Finish(reactor, result.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::ServerInfo(grpc::CallbackServerContext* context,
                                                             const ServerInfoRequest* /*request*/,
                                                             ServerInfoResponse* response) {
  shard_->FillServerInfo(response);
  if (hooks_.server_info) hooks_.server_info(response);
  CountCall("server_info", absl::OkStatus());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Heartbeat(grpc::CallbackServerContext* context,
                                                            const HeartbeatRequest* request,
                                                            HeartbeatResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status status = HandleHeartbeat(auth_.Identify(*context), *request, response);
  CountCall("heartbeat", status);
  Finish(reactor, status);
  return reactor;
}

absl::Status ParameterServerService::HandleHeartbeat(const PeerIdentity& peer,
                                                     const HeartbeatRequest& request,
                                                     HeartbeatResponse* response) {
  response->set_server_incarnation(shard_->incarnation());
  const RequestHeader& h = request.header();
  RETURN_IF_ERROR(shard_->CheckLayout(InfoOf(h)));
  // A tool (negative id) has no worker state: its heartbeats, finished or not, change
  // nothing (a tool's client says finished when it closes).
  if (h.worker_id() < 0) return absl::OkStatus();
  if (absl::Status s = auth_.CheckWorker(peer, h.worker_id(), "heartbeat"); !s.ok()) {
    return shard_->Reject("identity", std::move(s));
  }
  WorkerTracker& workers = shard_->workers();
  if (request.finished()) {
    // Finishing takes the worker out of the bound (and, with --exit_when_done, can stop the
    // servers): only its current incarnation may, never a new one announced by this call.
    RETURN_IF_ERROR(workers.Finish(h.worker_id(), h.worker_incarnation()));
    // Its segment goes with it (the pages are freed once its process lets go of them too).
    std::shared_ptr<ChannelServer> channel;  // joined after the lock
    absl::MutexLock lock(&shared_mu_);
    if (auto it = shared_.find(h.worker_id());
        it != shared_.end() && it->second.incarnation == h.worker_incarnation()) {
      channel = std::move(it->second.channel);
      shared_.erase(it);
    }
  } else {
    if (h.done_clock() < 0 || h.done_clock() > common::kMaxClock) {
      return shard_->Reject(
          "bad_clock", absl::InvalidArgumentError(
                           absl::StrCat("worker ", h.worker_id(), ": done_clock ", h.done_clock(),
                                        " is not in [0, ", common::kMaxClock, "]")));
    }
    RETURN_IF_ERROR(workers.Touch(h.worker_id(), h.worker_incarnation(), h.done_clock()));
  }
  if (request.data_offset() > 0 || request.epoch() > 0) {
    workers.SetDataPosition(h.worker_id(), h.worker_incarnation(), request.data_offset(),
                            request.epoch());
  }
  if (auto saved = workers.PositionOf(h.worker_id()); saved.has_value()) {
    response->set_data_offset(saved->data_offset);
    response->set_epoch(saved->epoch);
    response->set_clock(saved->clock);
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Shutdown(grpc::CallbackServerContext* context,
                                                           const ShutdownRequest* request,
                                                           ShutdownResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status status = HandleShutdown(auth_.Identify(*context), *request);
  CountCall("shutdown", status);
  Finish(reactor, status);
  return reactor;
}

absl::Status ParameterServerService::HandleShutdown(const PeerIdentity& peer,
                                                    const ShutdownRequest& request) {
  RETURN_IF_ERROR(auth_.CheckOperator(peer, "shutdown"));
  if (request.reason().empty()) {
    // An empty body parses as a ShutdownRequest: a stop must be asked for in so many words.
    return absl::InvalidArgumentError(
        "shutdown needs a reason (ShutdownRequest.reason): it is logged with the caller");
  }
  if (!hooks_.shutdown) {
    return absl::UnimplementedError("this server cannot be shut down remotely");
  }
  LOG(WARNING) << "shutdown requested by " << peer.name << " (final checkpoint "
               << (request.checkpoint() ? "asked for" : "not asked for")
               << "): " << absl::CHexEscape(request.reason().substr(0, 256));
  hooks_.shutdown(request.checkpoint());
  return absl::OkStatus();
}

}  // namespace ps::server
