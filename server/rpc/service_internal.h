// Helpers shared by the files of ParameterServerService (service.cc, service_control.cc,
// service_push_pull.cc).
// Internal.
#ifndef PS_SERVER_RPC_SERVICE_INTERNAL_H_
#define PS_SERVER_RPC_SERVICE_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/parse_bound.h"
#include "grpcpp/support/server_callback.h"
#include "proto/ps.pb.h"
#include "server/shard.h"

namespace ps::server::service_internal {

// What a parked pull's parsed request (or frame header) holds, for the caps on parked bytes:
// a small one is bounded by the most its wire bytes can take parsed (no walk, for every
// pull), a large one measured. Found in review, 2026-12-06: the wire size was counted, and
// entries take up to tens of times their wire bytes parsed.
inline uint64_t ParkedBytes(const google::protobuf::Message& request) {
  constexpr size_t kMeasuredAbove = size_t{4} << 10;
  const size_t wire = request.ByteSizeLong();
  if (wire <= kMeasuredAbove) {
    return wire * common::MostParsedPerWireByte(*request.GetDescriptor());
  }
  return std::max<size_t>(wire, request.SpaceUsedLong());
}

// The shard's view of a request's header.
inline RequestInfo InfoOf(const RequestHeader& h) {
  RequestInfo info;
  info.worker_id = h.worker_id();
  info.worker_incarnation = h.worker_incarnation();
  info.sequence = h.sequence();
  info.clock = h.clock();
  info.done_clock = h.done_clock();
  info.layout_fingerprint = h.layout_fingerprint();
  return info;
}

inline absl::Span<const uint64_t> KeysOf(const google::protobuf::RepeatedField<uint64_t>& keys) {
  return absl::MakeConstSpan(keys.data(), keys.size());
}

// The shard's view of a pushed table, without its payloads.
inline PushTable TableOf(const TableValues& t) {
  PushTable view;
  view.table = t.table();
  view.encoding = t.encoding();
  view.keys = KeysOf(t.keys());
  return view;
}

// The shard's view of a pull's tables (no copies: spans into the message).
inline std::vector<PullTable> PullViews(
    const google::protobuf::RepeatedPtrField<TablePullRequest>& tables) {
  std::vector<PullTable> views;
  views.reserve(tables.size());
  for (const TablePullRequest& t : tables) {
    views.push_back(PullTable{t.table(), t.encoding(),
                              absl::MakeConstSpan(t.block_ids().data(), t.block_ids().size()),
                              KeysOf(t.keys())});
  }
  return views;
}

// The data methods' names in metrics labels and refusals, by ParameterServerService::Method.
inline constexpr const char* kMethodNames[] = {"pull", "push"};

// Finishes `reactor` with `status`.
inline void Finish(grpc::ServerUnaryReactor* reactor, const absl::Status& status) {
  reactor->Finish(common::ToGrpcStatus(status));
}

}  // namespace ps::server::service_internal

#endif  // PS_SERVER_RPC_SERVICE_INTERNAL_H_
