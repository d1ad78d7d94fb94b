// GrpcParameterStore's Exchange: one call's PushPull frames per server, shared by the files
// that build and read them (grpc_store_frames.cc), place them in shared memory
// (grpc_store_shared.cc) and run them (grpc_store.cc). Internal.
#ifndef PS_WORKER_RPC_GRPC_STORE_EXCHANGE_H_
#define PS_WORKER_RPC_GRPC_STORE_EXCHANGE_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/rpc/frame.h"
#include "worker/rpc/grpc_store.h"

namespace ps::worker {

// One call's frames: headers and payload pieces per frame, and where pulled values go. Frame
// s < servers goes to server s; the frames after them are the extra pieces of large pulls
// (SplitPullPieces), to piece_server[f - servers].
struct GrpcParameterStore::Exchange {
  struct SparseOut {
    const common::SparsePull* pull;
    const common::TableInfo* info;
    // Per server: positions in pull->keys of the first occurrences it answers for.
    std::vector<std::vector<uint32_t>> positions;
    std::vector<std::pair<uint32_t, uint32_t>> repeats;  // (position, its first occurrence)
  };
  // Where the values of one pull entry of a frame go: the dense pull's buffer, or (null) the
  // sparse pull sparse_out[sparse].
  struct PullOut {
    const common::DensePull* dense = nullptr;
    size_t sparse = 0;
  };
  explicit Exchange(size_t n) : servers(n), headers(n), payloads(n), pull_out(n) {}
  uint32_t ServerOf(uint32_t f) const { return f < servers ? f : piece_server[f - servers]; }

  const size_t servers;
  std::vector<uint32_t> piece_server;

  std::vector<PushPullRequest> headers;
  // Per server, in header order: aliased gradient bytes, or bytes of `encoded`.
  std::vector<std::vector<absl::string_view>> payloads;
  // Owned encode buffers (stable addresses), taken from the store's spares. A list: empty,
  // it allocates nothing (a deque allocates two blocks up front, on every call).
  std::list<std::string> encoded;
  // Counts the slices of `payloads` gRPC still holds: a call that did not end OK at its first
  // attempt gives its memory (the caller's, `encoded`) back only once gRPC let go of them all.
  common::AliasTracker aliases;
  // Per frame, one for each of its header's pull entries, in their order (an answer's tables
  // are those entries, in order): kept by entry, not by table name, so that a batch naming a
  // table twice gets the values in both of its buffers, as InProcessParameterStore does.
  // AddPull and SplitPullPieces keep it in step with the headers.
  std::vector<std::vector<PullOut>> pull_out;
  // Per sparse entry of the pull batch, in its order.
  std::vector<SparseOut> sparse_out;
  // Per frame (sized when the frames are built): the region of shared memory holding its push
  // payload and room for its answer (invalid: by the socket), and whether it asked for a
  // segment.
  std::vector<common::SharedArena::Region> shared;
  // (asked: the token of its ask, SharedLink::ask; 0: it did not ask.)
  std::vector<uint64_t> asked;
  // Per frame (sized with `shared`): a call through shared memory whose way of handing its
  // bytes its link's HandoffChooser chose, weighed by the CPU its copies cost this thread and
  // the server's threads (PushPullResponse.served_cpu_ns), or, from a server that does not
  // say, by its time from placing its payload to copying out its answer.
  struct Handoff {
    bool timed = false;
    bool stream = false;
    uint32_t chooser = 0;  // its index in GrpcParameterStore::handoff_
    uint64_t bytes = 0;  // push payload and answer room
    int64_t start_ns = 0;
    // Weighed by CPU (rpc.handoff adaptive): this thread's CPU copying the push in and the
    // answer out.
    bool costed = false;
    int64_t copy_cpu_ns = 0;
    // Its push payload lies in a LentBuffer of the segment, where the server reads it: not
    // copied, not timed.
    bool lent = false;
  };
  std::vector<Handoff> handoff;
  // Per frame (sized with `shared`): a push payload placed to follow its call
  // (common/rpc/following_payload.h), still to be copied by CopyFollowing.
  struct Following {
    bool could = false;    // it could follow (counted either way once answered)
    bool follows = false;  // and did
    bool pending = false;
    bool stream = false;
    char* to = nullptr;
    std::atomic<uint64_t>* written = nullptr;  // the count, in the segment
  };
  std::vector<Following> following;
  uint64_t sent = 0;  // push payload bytes of every frame (summed as they are added)
  uint64_t received = 0;
  uint64_t dense_pull_bytes = 0;  // float32 bytes of the dense pulls, all servers' together
  uint64_t shared_bytes = 0;  // of sent and received, through shared memory
  uint64_t lent_bytes = 0;    // of shared_bytes, push payloads read where they lay (lent)
  uint64_t duplicates = 0;
};

}  // namespace ps::worker

#endif  // PS_WORKER_RPC_GRPC_STORE_EXCHANGE_H_
