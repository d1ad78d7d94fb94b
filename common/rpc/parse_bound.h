// Parsing a peer's protobuf bytes within a bound on the memory the parse takes. Parsed, a
// message can take tens of times its wire size: an empty repeated entry is two bytes on the
// wire and a whole object (with its pointer) parsed, so 512 MiB of them would take tens of
// GB. The bound is checked on the wire form, before any object is made.
#ifndef PS_COMMON_RPC_PARSE_BOUND_H_
#define PS_COMMON_RPC_PARSE_BOUND_H_

#include <cstddef>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/message.h"

namespace grpc {
class ByteBuffer;
}  // namespace grpc

namespace ps::common {

// What parsing `bytes` as a message of `type` would allocate, about, read from the wire form
// alone: each message object (its generated size), each string's bytes, each repeated
// field's elements and pointers, unknown fields as their bytes. Never less than the wire
// size. INVALID_ARGUMENT when the bytes are not wire format (or nest deeper than 100).
absl::StatusOr<size_t> ParsedBytes(absl::string_view bytes,
                                   const google::protobuf::Descriptor& type);

// The most a wire byte of a `type` can take parsed, as ParsedBytes counts: a message of n
// bytes takes at most n times this (no walk needed to know that).
size_t MostParsedPerWireByte(const google::protobuf::Descriptor& type);

// Parses `bytes` into `message` (cleared first) if that takes at most `max_parsed_bytes`
// (ParsedBytes): RESOURCE_EXHAUSTED naming both figures otherwise, INVALID_ARGUMENT when the
// bytes do not parse. `message` is left empty on an error.
absl::Status ParseWithin(absl::string_view bytes, size_t max_parsed_bytes,
                         google::protobuf::Message* message);
// The same for `size` bytes in pieces: `open` gives a new stream of them from the start each
// time it is called (once for the estimate, once for the parse; a message small enough for
// its size alone to bound it is read once).
absl::Status ParseWithin(
    absl::FunctionRef<std::unique_ptr<google::protobuf::io::ZeroCopyInputStream>()> open,
    size_t size, size_t max_parsed_bytes, google::protobuf::Message* message);

// The same for a gRPC message's bytes, read from its slices where they lie (a request a
// service parses itself, a peer's answer).
absl::Status ParseWithin(grpc::ByteBuffer* bytes, size_t max_parsed_bytes,
                         google::protobuf::Message* message);

}  // namespace ps::common

#endif  // PS_COMMON_RPC_PARSE_BOUND_H_
