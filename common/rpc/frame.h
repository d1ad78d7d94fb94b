// Data-path frames: a small protobuf header followed by raw payload bytes, carried in a
// grpc::ByteBuffer without copying the payload in user space (see rpc PushPull in ps.proto).
//
// Wire layout of a frame:
//   [uint32 little-endian: header length H][H bytes: the serialized header][payload bytes]
// The header says how the payload is cut (DenseBlock.payload_bytes, TableValues.rows_bytes);
// this file knows nothing of that, only of the header and a byte stream after it.
//
// Sending: FrameBuilder puts the header in one small slice and each payload as a slice that
// aliases the caller's memory (counted by an AliasTracker until gRPC lets go of it: the caller
// keeps the memory alive until then, or until the call ended OK) or that hands a pooled
// buffer back to its BufferPool when gRPC lets go of it. So gradients go from
// the model's buffer to the socket, and parameters from the server's read buffer to it.
//
// Receiving: FrameReader walks gRPC's receive slices in place. Pieces() hands a payload out
// as views of the slices it spans (gRPC reads a socket into slices of up to 64 KB, so a large
// payload spans many, at any alignment): dense push payloads are checked and applied there.
// Next() gives one contiguous view: in place when the bytes lie in one slice at an aligned
// address, else gathered once into a caller's scratch buffer, which comes from a BufferPool,
// so that no call touches freshly mapped pages in steady state. Every byte handed out in
// place or gathered, and every fresh pool buffer, is counted (DataPathCounters), which the
// zero-copy tests assert on.
#ifndef PS_COMMON_RPC_FRAME_H_
#define PS_COMMON_RPC_FRAME_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/message.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace ps::common {

// Copies and allocations of the data path. Thread-safe (relaxed atomics).
struct DataPathCounters {
  // Payload bytes copied in user space on receipt (gathered across slices).
  std::atomic<uint64_t> bytes_gathered{0};
  // Payload bytes used in place (no user-space copy).
  std::atomic<uint64_t> bytes_in_place{0};
  // Buffers a BufferPool had to allocate (not reused).
  std::atomic<uint64_t> buffers_allocated{0};
  // Payload bytes that came through shared memory (copied out of it once on receipt), and
  // that went out through it (written into it once).
  std::atomic<uint64_t> bytes_shared_in{0};
  std::atomic<uint64_t> bytes_shared_out{0};
  // Of bytes_shared_in, push payloads written after their call was posted, checked as they
  // came (common/rpc/following_payload.h).
  std::atomic<uint64_t> bytes_following{0};
  // Frames that came through a shared-memory channel instead of a gRPC call.
  std::atomic<uint64_t> calls_shared{0};
};

// Reusable byte buffers, so that payload memory stays mapped across calls. Thread-safe.
// Created as a shared_ptr: slices made by MakeSlice keep the pool alive until gRPC frees them.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  struct Buffer {
    std::unique_ptr<char[]> data;
    size_t capacity = 0;
  };

  // Keeps at most `max_cached_bytes` of idle buffers (bigger idle sets are freed);
  // `counters` (not owned, may be null) counts allocations: only Acquire touches them, so they
  // must outlive every Acquire, not the pool, which answers' slices keep alive until gRPC lets
  // go of them (after their service, and its counters, may be gone). Release must not touch
  // them.
  static std::shared_ptr<BufferPool> Create(size_t max_cached_bytes,
                                            DataPathCounters* counters = nullptr);

  // A buffer of at least `n` bytes: the smallest idle one that fits, or a new one.
  Buffer Acquire(size_t n);
  // Returns a buffer for reuse.
  void Release(Buffer buffer);
  // A slice over the first `n` bytes of `buffer` that hands it back to this pool when gRPC
  // is done with it.
  grpc::Slice MakeSlice(Buffer buffer, size_t n);

  size_t idle_bytes() const;

 private:
  BufferPool(size_t max_cached_bytes, DataPathCounters* counters)
      : max_cached_bytes_(max_cached_bytes), counters_(counters) {}

  const size_t max_cached_bytes_;
  DataPathCounters* const counters_;  // Not owned; may be null.
  mutable absl::Mutex mu_;
  std::vector<Buffer> idle_ ABSL_GUARDED_BY(mu_);
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Counts the slices gRPC still holds that alias a sender's memory (FrameBuilder::AddAliased).
// gRPC can keep a message's slices after its call ended: a call that failed (a deadline, a
// cancel) may still have bytes queued for a socket that is slow to take them, sent later from
// wherever they lie and read before that by TLS; an in-process server reads the sender's
// memory itself until it finishes the call. So memory lent to a call that did not end OK at
// its first attempt is not the sender's again until released(). A transport lets go of them
// once their bytes are written or its connection closes (keepalive bounds how long that
// takes). Thread-safe.
class AliasTracker {
 public:
  AliasTracker() : held_(std::make_shared<std::atomic<int64_t>>(0)) {}
  // A slice that aliases `bytes` (which gRPC only reads), counted until gRPC lets go of it.
  grpc::Slice Alias(absl::string_view bytes) const;
  // Whether gRPC holds none of the slices made so far.
  bool released() const { return held_->load(std::memory_order_acquire) == 0; }

 private:
  // Shared with the slices' release callbacks, which may run after this object is gone.
  std::shared_ptr<std::atomic<int64_t>> held_;
};

// Builds a frame. Thread-compatible.
class FrameBuilder {
 public:
  explicit FrameBuilder(const google::protobuf::MessageLite& header);
  // Appends bytes that the caller keeps alive and unchanged until `tracker` says gRPC let go
  // of them (or the call ended OK at its first attempt).
  void AddAliased(absl::string_view bytes, const AliasTracker& tracker);
  // Appends a slice (e.g. BufferPool::MakeSlice).
  void AddSlice(grpc::Slice slice);
  grpc::ByteBuffer Build();

 private:
  std::vector<grpc::Slice> slices_;
};

// The payload lengths a peer's header gives, summed against the payload bytes there are: a
// sum past them stays past them, so lengths that add up to the payload only modulo 2^64 are
// not taken for exact. Check Exact() before taking any payload by those lengths.
class PayloadLengths {
 public:
  explicit PayloadLengths(uint64_t payload_bytes) : have_(payload_bytes) {}
  void Add(uint64_t n) { total_ = n > have_ || total_ > have_ - n ? have_ + 1 : total_ + n; }
  // Whether the lengths added so far cut the payload exactly.
  bool Exact() const { return total_ == have_; }

 private:
  const uint64_t have_;
  uint64_t total_ = 0;  // at most have_ + 1
};

// Reads a frame in place. Thread-compatible; the ByteBuffer must outlive the reader and the
// views it returns.
class FrameReader {
 public:
  // Parses the header of `buffer` into `header`. INVALID_ARGUMENT (message starting
  // "unparseable frame") for a frame too short for its header length, a header longer than
  // `max_header_bytes`, or a header that does not parse, or would take more than
  // `max_parsed_header_bytes` parsed (0: `max_header_bytes`; common/rpc/parse_bound.h). `counters`
  // may be null.
  static absl::Status Open(const grpc::ByteBuffer& buffer, size_t max_header_bytes,
                           google::protobuf::Message* header, FrameReader* reader,
                           DataPathCounters* counters = nullptr,
                           size_t max_parsed_header_bytes = 0);

  // Payload bytes not read yet.
  size_t remaining() const { return remaining_; }
  // The next `n` payload bytes: in place when they lie in one slice at an address aligned to
  // `align`, otherwise copied to `scratch` (which must hold n bytes). REQUIRES: n <= remaining.
  absl::string_view Next(size_t n, size_t align, char* scratch);
  // The next `n` payload bytes where they lie, appended to `pieces` as one view per slice
  // they touch (no copy, at any alignment). REQUIRES: n <= remaining.
  void Pieces(size_t n, std::vector<absl::string_view>* pieces);
  // Copies the next `n` payload bytes to `dest`. REQUIRES: n <= remaining.
  void CopyTo(size_t n, char* dest);
  // Skips `n` bytes. REQUIRES: n <= remaining.
  void Skip(size_t n);
  // Adds `bytes` (which the caller keeps alive and unchanged while the reader and its views
  // are used) to the end of the payload: a payload that came in shared memory
  // (common/rpc/shared_memory.h) rather than in the frame.
  void Append(absl::string_view bytes);

 private:
  // Copies n bytes from the current position to dest (nullptr: skip) and advances.
  void Consume(size_t n, char* dest);
  // Advances over n bytes, calling `visit` with each slice's part of them.
  void Walk(size_t n, absl::FunctionRef<void(const char*, size_t)> visit);

  std::vector<grpc::Slice> slices_;
  size_t slice_ = 0;   // current slice
  size_t offset_ = 0;  // within it
  size_t remaining_ = 0;
  DataPathCounters* counters_ = nullptr;
};

}  // namespace ps::common

#endif  // PS_COMMON_RPC_FRAME_H_
