#include "common/rpc/frame.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/parse_bound.h"

namespace ps::common {
namespace {

constexpr size_t kLengthBytes = 4;

// What a pooled slice needs to hand its buffer back.
struct Lease {
  std::shared_ptr<BufferPool> pool;
  BufferPool::Buffer buffer;
};

void ReturnLease(void* p) {
  std::unique_ptr<Lease> lease(static_cast<Lease*>(p));
  lease->pool->Release(std::move(lease->buffer));
}

absl::Status Unparseable(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("unparseable frame: ", why));
}

// An AliasTracker's slice release: its count, one shared_ptr copy per slice.
void ReleaseAlias(void* held) {
  auto* count = static_cast<std::shared_ptr<std::atomic<int64_t>>*>(held);
  (*count)->fetch_sub(1, std::memory_order_acq_rel);
  delete count;
}

}  // namespace

// ---- BufferPool ---------------------------------------------------------------------------

std::shared_ptr<BufferPool> BufferPool::Create(size_t max_cached_bytes,
                                               DataPathCounters* counters) {
  return std::shared_ptr<BufferPool>(new BufferPool(max_cached_bytes, counters));
}

BufferPool::Buffer BufferPool::Acquire(size_t n) {
  {
    absl::MutexLock lock(&mu_);
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i) {
      if (idle_[i].capacity >= n &&
          (best == idle_.size() || idle_[i].capacity < idle_[best].capacity)) {
        best = i;
      }
    }
    if (best != idle_.size()) {
      Buffer b = std::move(idle_[best]);
      idle_[best] = std::move(idle_.back());
      idle_.pop_back();
      idle_bytes_ -= b.capacity;
      return b;
    }
  }
  if (counters_ != nullptr) counters_->buffers_allocated.fetch_add(1, std::memory_order_relaxed);
  Buffer b;
  b.capacity = std::max<size_t>(n, 64);
  b.data.reset(new char[b.capacity]);
  return b;
}

void BufferPool::Release(Buffer buffer) {
  if (buffer.data == nullptr) return;
  absl::MutexLock lock(&mu_);
  // Over the cap, the smallest idle buffers go first: the large ones are the ones whose
  // pages are expensive to map again.
  idle_bytes_ += buffer.capacity;
  idle_.push_back(std::move(buffer));
  while (idle_bytes_ > max_cached_bytes_ && !idle_.empty()) {
    auto smallest = std::min_element(idle_.begin(), idle_.end(), [](const Buffer& a,
                                                                     const Buffer& b) {
      return a.capacity < b.capacity;
    });
    idle_bytes_ -= smallest->capacity;
    *smallest = std::move(idle_.back());
    idle_.pop_back();
  }
}

grpc::Slice BufferPool::MakeSlice(Buffer buffer, size_t n) {
  char* data = buffer.data.get();
  auto* lease = new Lease{shared_from_this(), std::move(buffer)};
  return grpc::Slice(data, n, &ReturnLease, lease);
}

size_t BufferPool::idle_bytes() const {
  absl::MutexLock lock(&mu_);
  return idle_bytes_;
}

// ---- FrameBuilder -------------------------------------------------------------------------

FrameBuilder::FrameBuilder(const google::protobuf::MessageLite& header) {
  const size_t h = header.ByteSizeLong();
  std::string bytes(kLengthBytes + h, '\0');
  absl::little_endian::Store32(bytes.data(), static_cast<uint32_t>(h));
  header.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(bytes.data() + kLengthBytes));
  slices_.emplace_back(bytes);
}

grpc::Slice AliasTracker::Alias(absl::string_view bytes) const {
  held_->fetch_add(1, std::memory_order_relaxed);
  return grpc::Slice(const_cast<char*>(bytes.data()), bytes.size(), &ReleaseAlias,
                     new std::shared_ptr<std::atomic<int64_t>>(held_));
}

void FrameBuilder::AddAliased(absl::string_view bytes, const AliasTracker& tracker) {
  if (bytes.empty()) return;
  slices_.push_back(tracker.Alias(bytes));
}

void FrameBuilder::AddSlice(grpc::Slice slice) {
  if (slice.size() > 0) slices_.push_back(std::move(slice));
}

grpc::ByteBuffer FrameBuilder::Build() { return grpc::ByteBuffer(slices_.data(), slices_.size()); }

// ---- FrameReader --------------------------------------------------------------------------

absl::Status FrameReader::Open(const grpc::ByteBuffer& buffer, size_t max_header_bytes,
                               google::protobuf::Message* header, FrameReader* reader,
                               DataPathCounters* counters, size_t max_parsed_header_bytes) {
  FrameReader r;
  r.counters_ = counters;
  if (!buffer.Valid() || !buffer.Dump(&r.slices_).ok()) return Unparseable("no message");
  for (const grpc::Slice& s : r.slices_) r.remaining_ += s.size();
  if (r.remaining_ < kLengthBytes) {
    return Unparseable(absl::StrCat(r.remaining_, " bytes, fewer than a header length"));
  }
  char length[kLengthBytes];
  r.Consume(kLengthBytes, length);
  const uint32_t h = absl::little_endian::Load32(length);
  if (h > max_header_bytes || h > r.remaining_) {
    return Unparseable(absl::StrCat("header of ", h, " bytes in a frame of ",
                                    r.remaining_ + kLengthBytes, " (at most ", max_header_bytes,
                                    ")"));
  }
  std::string bytes(h, '\0');
  r.Consume(h, bytes.data());
  // No more parsed than `max_header_bytes` either: empty entries take tens of times their
  // wire size parsed (found in review, 2026-12-06: a 256 MiB header of them, about 10 GB).
  const size_t max_parsed =
      max_parsed_header_bytes != 0 ? max_parsed_header_bytes : max_header_bytes;
  if (absl::Status parsed = ParseWithin(bytes, max_parsed, header); !parsed.ok()) {
    return Unparseable(absl::StrCat("the header (", parsed.message(), ")"));
  }
  *reader = std::move(r);
  return absl::OkStatus();
}

void FrameReader::Consume(size_t n, char* dest) {
  Walk(n, [&dest](const char* bytes, size_t size) {
    if (dest == nullptr) return;
    std::memcpy(dest, bytes, size);
    dest += size;
  });
}

void FrameReader::Walk(size_t n, absl::FunctionRef<void(const char*, size_t)> visit) {
  remaining_ -= n;
  while (n > 0) {
    const grpc::Slice& s = slices_[slice_];
    const size_t take = std::min(n, s.size() - offset_);
    visit(reinterpret_cast<const char*>(s.begin()) + offset_, take);
    n -= take;
    offset_ += take;
    if (offset_ == s.size()) {
      ++slice_;
      offset_ = 0;
    }
  }
  // Land on a non-empty slice (or the end), so that Next sees where the bytes are.
  while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
    ++slice_;
    offset_ = 0;
  }
}

absl::string_view FrameReader::Next(size_t n, size_t align, char* scratch) {
  if (n == 0) return absl::string_view();
  const grpc::Slice& s = slices_[slice_];
  const char* p = reinterpret_cast<const char*>(s.begin()) + offset_;
  if (s.size() - offset_ >= n && reinterpret_cast<uintptr_t>(p) % align == 0) {
    if (counters_ != nullptr) counters_->bytes_in_place.fetch_add(n, std::memory_order_relaxed);
    Consume(n, nullptr);
    return absl::string_view(p, n);
  }
  if (counters_ != nullptr) counters_->bytes_gathered.fetch_add(n, std::memory_order_relaxed);
  Consume(n, scratch);
  return absl::string_view(scratch, n);
}

void FrameReader::Pieces(size_t n, std::vector<absl::string_view>* pieces) {
  if (counters_ != nullptr) counters_->bytes_in_place.fetch_add(n, std::memory_order_relaxed);
  Walk(n, [pieces](const char* bytes, size_t size) { pieces->emplace_back(bytes, size); });
}

void FrameReader::CopyTo(size_t n, char* dest) { Consume(n, dest); }

void FrameReader::Skip(size_t n) { Consume(n, nullptr); }

void FrameReader::Append(absl::string_view bytes) {
  if (bytes.empty()) return;
  slices_.emplace_back(bytes.data(), bytes.size(), grpc::Slice::STATIC_SLICE);
  remaining_ += bytes.size();
  while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
    ++slice_;
    offset_ = 0;
  }
}

}  // namespace ps::common
