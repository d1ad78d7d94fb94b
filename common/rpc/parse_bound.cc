#include "common/rpc/parse_bound.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace ps::common {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

constexpr int kMaxDepth = 100;  // protobuf's own recursion limit
// What a repeated element adds beyond its own bytes: its pointer, and room the field grows
// into (a repeated field doubles as it is appended to).
constexpr size_t kElementOverhead = 16;
// An unknown field, kept: its entry in the unknown field set.
constexpr size_t kUnknownField = 32;

size_t ScalarBytes(const FieldDescriptor& f) {
  switch (f.cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL:
      return 1;
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT64:
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return 8;
    default:
      return 4;  // int32, uint32, float, enum
  }
}

// The generated object of `type`, empty (as SpaceUsedLong of its default instance says).
// Cached per thread: asked for every entry of every message walked.
size_t ObjectBytes(const Descriptor& type) {
  thread_local absl::flat_hash_map<const Descriptor*, size_t> cache;
  auto [it, inserted] = cache.try_emplace(&type, 0);
  if (inserted) {
    const google::protobuf::Message* prototype =
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(&type);
    it->second = prototype != nullptr ? prototype->SpaceUsedLong() : 64;
  }
  return it->second;
}

// The most a wire byte of a `type` can take parsed, by the estimate's own rules: an entry of
// the largest message type within it in two bytes, an unknown field in two, a packed 8-byte
// scalar in one. A message whose size times this fits a bound needs no walk.
size_t MostPerWireByteOf(const Descriptor& type) {
  thread_local absl::flat_hash_map<const Descriptor*, size_t> cache;
  if (auto it = cache.find(&type); it != cache.end()) return it->second;
  size_t largest = 0;
  std::vector<const Descriptor*> todo = {&type};
  absl::flat_hash_map<const Descriptor*, bool> seen = {{&type, true}};
  while (!todo.empty()) {
    const Descriptor* d = todo.back();
    todo.pop_back();
    largest = std::max(largest, ObjectBytes(*d));
    for (int i = 0; i < d->field_count(); ++i) {
      const Descriptor* m = d->field(i)->message_type();
      if (m != nullptr && seen.emplace(m, true).second) todo.push_back(m);
    }
  }
  const size_t most = std::max<size_t>({(largest + kElementOverhead + 1) / 2 + 1,
                                        (sizeof(std::string) + kElementOverhead) / 2 + 1,
                                        kUnknownField / 2 + 1, 8 * 3 / 2 + 1});
  cache.emplace(&type, most);
  return most;
}

class Estimator {
 public:
  explicit Estimator(size_t stop_above) : stop_above_(stop_above) {}

  // The whole message `in` holds, a `type`.
  bool Root(CodedInputStream* in, const Descriptor& type) {
    total_ += ObjectBytes(type);
    return Message(in, type, 0);
  }

  // Adds the message of `type` that `in` holds up to its limit; false when it is not wire
  // format (or the estimate passed stop_above_: then total() says so).
  bool Message(CodedInputStream* in, const Descriptor& type, int depth) {
    if (depth > kMaxDepth) return false;
    while (true) {
      if (total_ > stop_above_) return true;
      const uint32_t tag = in->ReadTag();
      // 0: the end of the bytes or of the submessage's limit, or an invalid tag 0 before it.
      if (tag == 0) return in->BytesUntilLimit() == 0;
      const int number = WireFormatLite::GetTagFieldNumber(tag);
      if (number == 0) return false;
      const WireFormatLite::WireType wire = WireFormatLite::GetTagWireType(tag);
      const FieldDescriptor* f = type.FindFieldByNumber(number);
      if (f != nullptr) {
        // A field sent with another wire type than its own (or, for repeated scalars, the
        // packed one) is kept by the parser as an unknown field: counted as one (found in
        // review, 2026-12-06: "08 00", a message field as a varint, was counted as nothing,
        // and half a GB of them made 268M unknown fields).
        const WireFormatLite::WireType own =
            WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(f->type()));
        const bool packed = f->is_packable() && wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
        if (wire != own && !packed) f = nullptr;
      }
      const bool repeated = f != nullptr && f->is_repeated();
      switch (wire) {
        case WireFormatLite::WIRETYPE_VARINT: {
          uint64_t ignored;
          if (!in->ReadVarint64(&ignored)) return false;
          total_ += f == nullptr ? kUnknownField : repeated ? ScalarBytes(*f) + 1 : 0;
          break;
        }
        case WireFormatLite::WIRETYPE_FIXED64:
          if (!in->Skip(8)) return false;
          total_ += f == nullptr ? kUnknownField : repeated ? 8 + 1 : 0;
          break;
        case WireFormatLite::WIRETYPE_FIXED32:
          if (!in->Skip(4)) return false;
          total_ += f == nullptr ? kUnknownField : repeated ? 4 + 1 : 0;
          break;
        case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
          uint32_t length;
          if (!in->ReadVarint32(&length) || static_cast<int>(length) < 0 ||
              static_cast<int>(length) > in->BytesUntilLimit()) {
            return false;
          }
          if (f != nullptr && f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
            total_ += ObjectBytes(*f->message_type()) + (repeated ? kElementOverhead : 0);
            const CodedInputStream::Limit limit = in->PushLimit(static_cast<int>(length));
            if (!Message(in, *f->message_type(), depth + 1)) return false;
            in->PopLimit(limit);
          } else if (f != nullptr && f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
            total_ += length + (repeated ? sizeof(std::string) + kElementOverhead : 0);
            if (!in->Skip(static_cast<int>(length))) return false;
          } else if (f != nullptr) {  // packed scalars (is_packable: repeated)
            if (!Packed(in, *f, length)) return false;
          } else {
            total_ += kUnknownField + length;
            if (!in->Skip(static_cast<int>(length))) return false;
          }
          break;
        }
        default:  // groups (no proto3 message has one) and invalid wire types
          return false;
      }
    }
  }

  size_t total() const { return total_; }

 private:
  // Counts the elements of a packed field (varints by their last bytes) without decoding.
  bool Packed(CodedInputStream* in, const FieldDescriptor& f, uint32_t length) {
    const void* data;
    int size;
    size_t elements = 0;
    uint32_t left = length;
    while (left > 0) {
      if (!in->GetDirectBufferPointer(&data, &size) || size <= 0) return false;
      const uint32_t n = std::min<uint32_t>(left, static_cast<uint32_t>(size));
      const auto* p = static_cast<const uint8_t*>(data);
      switch (f.type()) {
        case FieldDescriptor::TYPE_FIXED32:
        case FieldDescriptor::TYPE_SFIXED32:
        case FieldDescriptor::TYPE_FLOAT:
        case FieldDescriptor::TYPE_FIXED64:
        case FieldDescriptor::TYPE_SFIXED64:
        case FieldDescriptor::TYPE_DOUBLE:
          break;
        default:
          for (uint32_t i = 0; i < n; ++i) elements += (p[i] & 0x80) == 0;
      }
      if (!in->Skip(static_cast<int>(n))) return false;
      left -= n;
    }
    switch (f.type()) {
      case FieldDescriptor::TYPE_FIXED32:
      case FieldDescriptor::TYPE_SFIXED32:
      case FieldDescriptor::TYPE_FLOAT:
        elements = length / 4;
        break;
      case FieldDescriptor::TYPE_FIXED64:
      case FieldDescriptor::TYPE_SFIXED64:
      case FieldDescriptor::TYPE_DOUBLE:
        elements = length / 8;
        break;
      default:
        break;
    }
    // Fixed-width elements are reserved at once; varints are appended one by one, and the
    // field grows to up to about half as much again.
    const bool varint =
        WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(f.type())) ==
        WireFormatLite::WIRETYPE_VARINT;
    total_ += elements * ScalarBytes(f) * (varint ? 3 : 2) / 2;
    return true;
  }

  const size_t stop_above_;
  size_t total_ = 0;
};

// Walks the `size` bytes `in` reads as a `type`, stopping once the estimate passes
// `stop_above`.
absl::StatusOr<size_t> Walk(CodedInputStream* in, size_t size, const Descriptor& type,
                            size_t stop_above) {
  if (size > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("a message of ", size, " bytes"));
  }
  in->PushLimit(static_cast<int>(size));
  Estimator estimator(stop_above);
  if (!estimator.Root(in, type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", type.full_name(), " of ", size, " bytes does not parse"));
  }
  return std::max(estimator.total(), size);
}

absl::Status Refusal(const google::protobuf::Message& message, size_t size, size_t max) {
  return absl::ResourceExhaustedError(absl::StrCat("a ", message.GetDescriptor()->full_name(),
                                                   " of ", size, " bytes would take more than ",
                                                   max, " bytes parsed"));
}

absl::Status NotParsed(google::protobuf::Message* message, size_t size) {
  message->Clear();
  return absl::InvalidArgumentError(absl::StrCat("a ", message->GetDescriptor()->full_name(),
                                                 " of ", size, " bytes does not parse"));
}

}  // namespace

size_t MostParsedPerWireByte(const Descriptor& type) { return MostPerWireByteOf(type); }

absl::StatusOr<size_t> ParsedBytes(absl::string_view bytes, const Descriptor& type) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                      static_cast<int>(std::min<size_t>(bytes.size(), INT32_MAX)));
  return Walk(&in, bytes.size(), type, SIZE_MAX);
}

absl::Status ParseWithin(absl::string_view bytes, size_t max_parsed_bytes,
                         google::protobuf::Message* message) {
  message->Clear();
  // Small messages (every call's header) go straight to the parse: even at the most a byte
  // can take, they fit.
  if (bytes.size() > max_parsed_bytes / MostPerWireByteOf(*message->GetDescriptor())) {
    CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                        static_cast<int>(std::min<size_t>(bytes.size(), INT32_MAX)));
    absl::StatusOr<size_t> parsed =
        Walk(&in, bytes.size(), *message->GetDescriptor(), max_parsed_bytes);
    if (!parsed.ok()) return parsed.status();
    if (*parsed > max_parsed_bytes) return Refusal(*message, bytes.size(), max_parsed_bytes);
  }
  if (!message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return NotParsed(message, bytes.size());
  }
  return absl::OkStatus();
}

absl::Status ParseWithin(
    absl::FunctionRef<std::unique_ptr<google::protobuf::io::ZeroCopyInputStream>()> open,
    size_t size, size_t max_parsed_bytes, google::protobuf::Message* message) {
  message->Clear();
  if (size > max_parsed_bytes / MostPerWireByteOf(*message->GetDescriptor())) {
    std::unique_ptr<google::protobuf::io::ZeroCopyInputStream> stream = open();
    CodedInputStream in(stream.get());
    absl::StatusOr<size_t> parsed = Walk(&in, size, *message->GetDescriptor(), max_parsed_bytes);
    if (!parsed.ok()) return parsed.status();
    if (*parsed > max_parsed_bytes) return Refusal(*message, size, max_parsed_bytes);
  }
  std::unique_ptr<google::protobuf::io::ZeroCopyInputStream> stream = open();
  if (!message->ParseFromZeroCopyStream(stream.get())) return NotParsed(message, size);
  return absl::OkStatus();
}

absl::Status ParseWithin(grpc::ByteBuffer* bytes, size_t max_parsed_bytes,
                         google::protobuf::Message* message) {
  return ParseWithin([bytes] { return std::make_unique<grpc::ProtoBufferReader>(bytes); },
                     bytes->Length(), max_parsed_bytes, message);
}

}  // namespace ps::common
