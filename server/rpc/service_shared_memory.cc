// ParameterServerService's shared-memory segments (docs/design.md, "Shared memory between
// processes of one host"): making one for a worker that asks, and finding and checking the one
// a PushPull names.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "server/rpc/service.h"

namespace ps::server {

absl::StatusOr<std::shared_ptr<common::SharedMemory>> ParameterServerService::SharedSegmentOf(
    const PushPullRequest& header, const common::FrameReader& reader) {
  const SharedPayload& sp = header.shared();
  std::shared_ptr<common::SharedMemory> segment;
  {
    absl::MutexLock lock(&shared_mu_);
    auto it = shared_.find(header.header().worker_id());
    if (it != shared_.end() && it->second.memory->id() == sp.segment()) {
      segment = it->second.memory;
    }
  }
  if (segment == nullptr) {
    return shard_->Reject(
        "unknown_segment",
        absl::AbortedError(absl::StrCat("shared segment ", absl::Hex(sp.segment()),
                                        " is not this worker's: send the call without it")));
  }
  if (reader.remaining() > 0 || (sp.push_bytes() > 0 && !header.has_push()) ||
      (sp.push_bytes() > 0 && !segment->Holds(sp.push_offset(), sp.push_bytes())) ||
      (sp.answer_capacity() > 0 && !segment->Holds(sp.answer_offset(), sp.answer_capacity()))) {
    return Unparseable(absl::InvalidArgumentError(
        absl::StrCat("unparseable frame: shared payload of ", sp.push_bytes(), " bytes at ",
                     sp.push_offset(), " and answer room of ", sp.answer_capacity(), " at ",
                     sp.answer_offset(), ", ", reader.remaining(),
                     " payload bytes in the frame, in a segment of ", segment->size(), " bytes")));
  }
  return segment;
}

bool ParameterServerService::OfferSharedSegment(const RequestInfo& info, uint64_t bytes,
                                                SharedSegment* offer) {
  const int32_t worker_id = info.worker_id;
  bytes = std::min<uint64_t>(bytes, options_.max_shared_bytes_per_worker);
  if (bytes <= common::SharedMemory::kReservedBytes || worker_id < 0 ||
      worker_id >= static_cast<int64_t>(shard_->config().cluster().num_workers())) {
    return false;
  }
  {
    absl::MutexLock lock(&shared_mu_);
    auto it = shared_.find(worker_id);
    if (it != shared_.end() && it->second.incarnation > info.worker_incarnation) return false;
  }
  absl::StatusOr<std::shared_ptr<common::SharedMemory>> made = common::SharedMemory::Create(bytes);
  if (!made.ok()) {
    LOG(WARNING) << "no shared memory for worker " << worker_id << ": " << made.status();
    return false;
  }
  offer->set_id((*made)->id());
  offer->set_path((*made)->path());
  offer->set_bytes((*made)->size());
  offer->set_boot_id(common::SharedMemory::BootId());
  absl::MutexLock lock(&shared_mu_);
  WorkerSegment& w = shared_[worker_id];
  if (w.memory != nullptr && w.incarnation > info.worker_incarnation) return false;
  w.incarnation = info.worker_incarnation;
  w.memory = *std::move(made);  // calls still using the old one hold it
  return true;
}

}  // namespace ps::server
