#include "common/rpc/frame_testing.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/rpc/frame.h"
#include "common/status_macros.h"

namespace ps::common {
namespace {

// Moves the payload fields of `t` into `payload` and sets their lengths.
void MovePayloads(TableValues* t, std::string* payload) {
  for (DenseBlock& b : *t->mutable_blocks()) {
    b.set_payload_bytes(b.values().size());
    payload->append(b.values());
    b.clear_values();
  }
  t->set_rows_bytes(t->rows().size());
  payload->append(t->rows());
  t->clear_rows();
}

// The inverse: takes each payload's bytes from `reader` into the fields.
void TakePayloads(TableValues* t, FrameReader* reader) {
  for (DenseBlock& b : *t->mutable_blocks()) {
    std::string v(std::min<uint64_t>(b.payload_bytes(), reader->remaining()), '\0');
    reader->CopyTo(v.size(), v.data());
    b.set_values(v);
    b.set_payload_bytes(0);
  }
  std::string rows(std::min<uint64_t>(t->rows_bytes(), reader->remaining()), '\0');
  reader->CopyTo(rows.size(), rows.data());
  t->set_rows(rows);
  t->set_rows_bytes(0);
}

}  // namespace

grpc::ByteBuffer FrameOf(const PushRequest* push, const PullRequest* pull, size_t cut_every) {
  PushPullRequest header;
  std::string payload;
  if (push != nullptr) {
    *header.mutable_header() = push->header();
    header.set_has_push(true);
    header.set_is_delta(push->is_delta());
    for (const TableValues& t : push->tables()) {
      TableValues* copy = header.add_push();
      *copy = t;
      MovePayloads(copy, &payload);
    }
  }
  if (pull != nullptr) {
    if (push == nullptr) *header.mutable_header() = pull->header();
    header.set_pull_clock(pull->header().clock());
    *header.mutable_pull() = pull->tables();
  }
  FrameBuilder frame(header);
  if (cut_every == 0) {
    // Copied into a slice of its own: the frame outlives this function.
    frame.AddSlice(grpc::Slice(payload));
    return frame.Build();
  }
  for (size_t at = 0; at < payload.size(); at += cut_every) {
    const size_t n = std::min(cut_every, payload.size() - at);
    // One byte more, and the view past it: the piece starts at an odd address.
    std::string bytes = "." + payload.substr(at, n);
    frame.AddSlice(grpc::Slice(bytes).sub(1, n + 1));
  }
  return frame.Build();
}

absl::StatusOr<PushRequest> PushOfFrame(const grpc::ByteBuffer& frame) {
  PushPullRequest header;
  FrameReader reader;
  RETURN_IF_ERROR(FrameReader::Open(frame, size_t{1} << 30, &header, &reader));
  PushRequest push;
  *push.mutable_header() = header.header();
  push.set_is_delta(header.is_delta());
  for (const TableValues& t : header.push()) {
    TableValues* out = push.add_tables();
    *out = t;
    TakePayloads(out, &reader);
  }
  return push;
}

absl::StatusOr<PushPullResponse> AnswerOfFrame(const grpc::ByteBuffer& frame) {
  PushPullResponse answer;
  FrameReader reader;
  RETURN_IF_ERROR(FrameReader::Open(frame, size_t{1} << 30, &answer, &reader));
  for (TableValues& t : *answer.mutable_pull()->mutable_tables()) TakePayloads(&t, &reader);
  return answer;
}

FrameParts PartsOf(const grpc::ByteBuffer& frame) {
  std::vector<grpc::Slice> slices;
  if (!frame.Dump(&slices).ok()) return {};
  std::string whole;
  for (const auto& sl : slices) whole.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  if (whole.size() < 4) return {};
  const uint64_t h = static_cast<uint8_t>(whole[0]) | static_cast<uint8_t>(whole[1]) << 8 |
                     static_cast<uint8_t>(whole[2]) << 16 |
                     static_cast<uint64_t>(static_cast<uint8_t>(whole[3])) << 24;
  if (h > whole.size() - 4) return {};
  return FrameParts{whole.substr(4, h), whole.substr(4 + h)};
}

std::string RawFrameBytes(const std::string& header, const std::string& payload) {
  std::string bytes(4, '\0');
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return bytes + header + payload;
}

grpc::ByteBuffer RawFrame(const std::string& header, const std::string& payload) {
  grpc::Slice slice(RawFrameBytes(header, payload));
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace ps::common
