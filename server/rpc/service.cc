#include "server/rpc/service.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ps::server {
namespace {

RequestInfo InfoOf(const RequestHeader& h) {
  RequestInfo info;
  info.worker_id = h.worker_id();
  info.worker_incarnation = h.worker_incarnation();
  info.sequence = h.sequence();
  info.clock = h.clock();
  info.layout_fingerprint = h.layout_fingerprint();
  return info;
}

absl::Status CheckEncoding(Encoding e) {
  if (common::IsKnownEncoding(e)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("unknown payload encoding ", e));
}

absl::Span<const uint64_t> KeysOf(const google::protobuf::RepeatedField<uint64_t>& keys) {
  return absl::MakeConstSpan(keys.data(), keys.size());
}

// The float32 values of a payload read in place (no copy) when the bytes are float32 and
// aligned for float, as protobuf's heap-allocated strings are; empty otherwise (decode then).
absl::Span<const float> Floats(const std::string& bytes, Encoding encoding) {
  static_assert(absl::little_endian::IsLittleEndian(), "the wire format is little-endian");
  if (encoding != ENCODING_FLOAT32 || bytes.empty() ||
      reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) != 0) {
    return {};
  }
  return absl::Span<const float>(reinterpret_cast<const float*>(bytes.data()),
                                 bytes.size() / sizeof(float));
}

// Finishes `reactor` with `status`.
void Finish(grpc::ServerUnaryReactor* reactor, const absl::Status& status) {
  reactor->Finish(common::ToGrpcStatus(status));
}

}  // namespace

ParameterServerService::ParameterServerService(Shard* shard, const ServiceOptions& options,
                                               ServiceHooks hooks)
    : shard_(shard), options_(options), hooks_(std::move(hooks)), pool_(options.num_threads) {}

ParameterServerService::~ParameterServerService() = default;

// ---- Pull -------------------------------------------------------------------------------

absl::Status ParameterServerService::HandlePull(const PullRequest& request, absl::Time deadline,
                                                PullResponse* response) {
  const RequestInfo info = InfoOf(request.header());
  RETURN_IF_ERROR(shard_->CheckLayout(info));
  // Phase 1: check every part before waiting or reading anything.
  for (const TablePullRequest& t : request.tables()) {
    RETURN_IF_ERROR(CheckEncoding(t.encoding()));
    ASSIGN_OR_RETURN(TablePart * part, shard_->FindTable(t.table()));
    if (part->info().kind == TABLE_KIND_DENSE) {
      if (!t.keys().empty()) {
        shard_->CountRejection("wrong_kind");
        return absl::InvalidArgumentError(
            absl::StrCat("table '", t.table(), "' is dense: pull it by blocks, not keys"));
      }
      for (uint32_t b : t.block_ids()) {
        RETURN_IF_ERROR(shard_->CheckBlock(*static_cast<DenseTablePart*>(part), b, -1));
      }
    } else {
      if (!t.block_ids().empty()) {
        shard_->CountRejection("wrong_kind");
        return absl::InvalidArgumentError(
            absl::StrCat("table '", t.table(), "' is sparse: pull it by keys, not blocks"));
      }
      RETURN_IF_ERROR(shard_->CheckKeys(*static_cast<SparseTablePart*>(part), KeysOf(t.keys()),
                                        -1));
    }
  }
  RETURN_IF_ERROR(shard_->BeginPull(info, std::min(deadline, absl::Now() + options_.max_pull_wait)));
  // Phase 2: read.
  std::vector<float> scratch;
  uint64_t bytes_out = 0;
  for (const TablePullRequest& t : request.tables()) {
    const Encoding encoding = t.encoding();
    const size_t bpv = common::BytesPerValue(encoding);
    TablePart* part = *shard_->FindTable(t.table());
    TableValues* out = response->add_tables();
    out->set_table(t.table());
    out->set_encoding(encoding);
    if (part->info().kind == TABLE_KIND_DENSE) {
      auto* dense = static_cast<DenseTablePart*>(part);
      for (uint32_t b : t.block_ids()) {
        DenseBlock* block = out->add_blocks();
        block->set_block_id(b);
        const size_t n = dense->BlockSize(b);
        if (encoding == ENCODING_FLOAT32) {
          // Read straight into the response's buffer: no intermediate copy.
          std::string* bytes = block->mutable_values();
          bytes->resize(n * sizeof(float));
          scratch.resize(0);
          dense->Read(b, absl::Span<float>(reinterpret_cast<float*>(bytes->data()), n));
        } else {
          scratch.resize(n);
          dense->Read(b, absl::MakeSpan(scratch));
          common::EncodeFloats(scratch, encoding, block->mutable_values());
        }
        bytes_out += n * bpv;
      }
    } else {
      auto* sparse = static_cast<SparseTablePart*>(part);
      const size_t n = static_cast<size_t>(t.keys_size()) * sparse->info().dim;
      *out->mutable_keys() = t.keys();
      if (encoding == ENCODING_FLOAT32) {
        std::string* bytes = out->mutable_rows();
        bytes->resize(n * sizeof(float));
        sparse->Read(KeysOf(t.keys()), absl::Span<float>(reinterpret_cast<float*>(bytes->data()), n));
      } else {
        scratch.resize(n);
        sparse->Read(KeysOf(t.keys()), absl::MakeSpan(scratch));
        common::EncodeFloats(scratch, encoding, out->mutable_rows());
      }
      bytes_out += n * bpv;
    }
  }
  response->set_server_incarnation(shard_->incarnation());
  response->set_min_clock(shard_->workers().MinLiveClock());
  shard_->CountPull(bytes_out);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Pull(grpc::CallbackServerContext* context,
                                                       const PullRequest* request,
                                                       PullResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time deadline = absl::FromChrono(context->deadline());
  pool_.Schedule([this, reactor, request, response, deadline] {
    Finish(reactor, HandlePull(*request, deadline, response));
  });
  return reactor;
}

// ---- Push -------------------------------------------------------------------------------

absl::Status ParameterServerService::HandlePush(const PushRequest& request,
                                                PushResponse* response) {
  const RequestInfo info = InfoOf(request.header());
  RETURN_IF_ERROR(shard_->CheckLayout(info));
  // Phase 1: resolve, decode and check every part; nothing changes on any error.
  std::vector<PendingUpdate> updates;
  std::vector<std::vector<float>> decoded;
  size_t parts = 0;
  for (const TableValues& t : request.tables()) parts += t.blocks_size() + (t.keys_size() > 0);
  updates.reserve(parts);
  decoded.reserve(parts);
  uint64_t bytes_in = 0;
  for (const TableValues& t : request.tables()) {
    RETURN_IF_ERROR(CheckEncoding(t.encoding()));
    const size_t bpv = common::BytesPerValue(t.encoding());
    ASSIGN_OR_RETURN(TablePart * part, shard_->FindTable(t.table()));
    if (part->info().kind == TABLE_KIND_DENSE) {
      auto* dense = static_cast<DenseTablePart*>(part);
      if (!t.keys().empty() || !t.rows().empty()) {
        shard_->CountRejection("wrong_kind");
        return absl::InvalidArgumentError(
            absl::StrCat("table '", t.table(), "' is dense: push blocks, not keyed rows"));
      }
      for (const DenseBlock& block : t.blocks()) {
        const uint32_t b = block.block_id();
        if (block.values().size() % bpv != 0) {
          shard_->CountRejection("bad_size");
          return absl::InvalidArgumentError(absl::StrCat(
              "table '", t.table(), "' block ", b, ": payload of ", block.values().size(),
              " bytes is not a whole number of ", common::EncodingName(t.encoding()),
              " values"));
        }
        RETURN_IF_ERROR(shard_->CheckBlock(*dense, b, block.values().size() / bpv));
        absl::Span<const float> values = Floats(block.values(), t.encoding());
        if (values.empty() && dense->BlockSize(b) > 0) {
          auto& buffer = decoded.emplace_back(dense->BlockSize(b));
          RETURN_IF_ERROR(common::DecodeFloats(block.values(), t.encoding(), absl::MakeSpan(buffer)));
          values = buffer;
        }
        if (!request.is_delta()) {
          RETURN_IF_ERROR(shard_->CheckFinite(*dense, absl::StrCat("block ", b), values));
        }
        updates.push_back(PendingUpdate{dense, b, {}, values});
        bytes_in += block.values().size();
      }
    } else {
      auto* sparse = static_cast<SparseTablePart*>(part);
      if (!t.blocks().empty()) {
        shard_->CountRejection("wrong_kind");
        return absl::InvalidArgumentError(
            absl::StrCat("table '", t.table(), "' is sparse: push keyed rows, not blocks"));
      }
      if (t.rows().size() % bpv != 0) {
        shard_->CountRejection("bad_size");
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", t.table(), "': rows payload of ", t.rows().size(),
            " bytes is not a whole number of ", common::EncodingName(t.encoding()), " values"));
      }
      RETURN_IF_ERROR(shard_->CheckKeys(*sparse, KeysOf(t.keys()), t.rows().size() / bpv));
      absl::Span<const float> values = Floats(t.rows(), t.encoding());
      if (values.empty() && !t.rows().empty()) {
        auto& buffer = decoded.emplace_back(t.rows().size() / bpv);
        RETURN_IF_ERROR(common::DecodeFloats(t.rows(), t.encoding(), absl::MakeSpan(buffer)));
        values = buffer;
      }
      if (!request.is_delta()) RETURN_IF_ERROR(shard_->CheckFinite(*sparse, "rows", values));
      updates.push_back(PendingUpdate{sparse, 0, KeysOf(t.keys()), values});
      bytes_in += t.rows().size();
    }
  }
  // Phase 2.
  UpdateOptions options;
  options.kind = request.is_delta() ? UpdateKind::kDelta : UpdateKind::kGradient;
  ASSIGN_OR_RETURN(PushResult result, shard_->ApplyPush(info, updates, options, bytes_in));
  response->set_duplicate(result.duplicate);
  response->set_updates_applied(result.updates_applied);
  response->set_server_incarnation(shard_->incarnation());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Push(grpc::CallbackServerContext* context,
                                                       const PushRequest* request,
                                                       PushResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  pool_.Schedule([this, reactor, request, response] {
    Finish(reactor, HandlePush(*request, response));
  });
  return reactor;
}

// ---- The rest ---------------------------------------------------------------------------

grpc::ServerUnaryReactor* ParameterServerService::Stats(grpc::CallbackServerContext* context,
                                                        const StatsRequest* /*request*/,
                                                        StatsResponse* response) {
  shard_->FillStats(response);
  if (hooks_.stats) hooks_.stats(response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Checkpoint(
    grpc::CallbackServerContext* context, const CheckpointRequest* /*request*/,
    CheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!hooks_.checkpoint) {
    Finish(reactor, absl::FailedPreconditionError("this server has no data dir to checkpoint to"));
    return reactor;
  }
  pool_.Schedule([this, reactor, response] {
    absl::StatusOr<CheckpointResponse> result = hooks_.checkpoint();
    if (result.ok()) *response = *std::move(result);
    Finish(reactor, result.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::ServerInfo(
    grpc::CallbackServerContext* context, const ServerInfoRequest* /*request*/,
    ServerInfoResponse* response) {
  shard_->FillServerInfo(response);
  if (hooks_.server_info) hooks_.server_info(response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Heartbeat(
    grpc::CallbackServerContext* context, const HeartbeatRequest* request,
    HeartbeatResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const RequestHeader& h = request->header();
  absl::Status status = shard_->CheckLayout(InfoOf(h));
  if (status.ok() && h.worker_id() >= 0) {
    WorkerTracker& workers = shard_->workers();
    status = workers.Touch(h.worker_id(), h.worker_incarnation());
    if (status.ok()) {
      if (request->finished()) workers.Finish(h.worker_id(), h.worker_incarnation());
      if (request->data_offset() > 0 || request->epoch() > 0) {
        workers.SetDataPosition(h.worker_id(), request->data_offset(), request->epoch());
      }
      if (auto saved = workers.Get(h.worker_id()); saved.has_value()) {
        response->set_data_offset(saved->data_offset());
        response->set_epoch(saved->epoch());
        response->set_clock(saved->clock());
      }
    }
  }
  response->set_server_incarnation(shard_->incarnation());
  Finish(reactor, status);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Shutdown(grpc::CallbackServerContext* context,
                                                           const ShutdownRequest* request,
                                                           ShutdownResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!hooks_.shutdown) {
    Finish(reactor, absl::UnimplementedError("this server cannot be shut down remotely"));
    return reactor;
  }
  hooks_.shutdown(request->checkpoint());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace ps::server
