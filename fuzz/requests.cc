#include "fuzz/requests.h"

#include <limits>
#include <string>
#include <vector>

#include "common/codec.h"
#include "fuzz/fuzz_env.h"

namespace ps::fuzz {

std::string TableName(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
    case 1:
    case 2:
      return "w";
    case 3:
    case 4:
    case 5:
      return "emb";
    case 6:
      return "nope";
    default:
      return in.ConsumeRandomLengthString(8);
  }
}

Encoding PickEncoding(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 8)) {
    case 6:
      return ENCODING_FP16;
    case 7:
      return ENCODING_BF16;
    case 8:
      return static_cast<Encoding>(in.ConsumeIntegral<int32_t>());
    default:
      return ENCODING_FLOAT32;
  }
}

RequestHeader PickHeader(FuzzedDataProvider& in, uint64_t* next_sequence) {
  const Layout& layout = GetLayout();
  RequestHeader h;
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0:
      h.set_worker_id(-1);
      break;
    case 1:
    case 2:
      h.set_worker_id(0);
      break;
    case 3:
      h.set_worker_id(1);
      break;
    case 4:
      h.set_worker_id(2);
      break;  // beyond num_workers
    default:
      h.set_worker_id(in.ConsumeIntegral<int32_t>());
      break;
  }
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0:
      h.set_worker_incarnation(0);
      break;
    case 1:
      h.set_worker_incarnation(2);
      break;
    case 2:
      h.set_worker_incarnation(in.ConsumeIntegral<uint64_t>());
      break;
    default:
      h.set_worker_incarnation(1);
      break;
  }
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0:
      h.set_sequence(0);
      break;
    case 1:
      h.set_sequence(*next_sequence > 1 ? *next_sequence - 1 : 1);
      break;  // a retry
    case 2:
      h.set_sequence(in.ConsumeIntegral<uint64_t>());
      break;
    default:
      h.set_sequence((*next_sequence)++);
      break;
  }
  switch (in.ConsumeIntegralInRange(0, 6)) {
    case 0:
      h.set_clock(in.ConsumeIntegral<int64_t>());
      break;
    case 1:
      h.set_clock(std::numeric_limits<int64_t>::min());
      break;
    case 2:
      h.set_clock(std::numeric_limits<int64_t>::max());
      break;
    case 3:
      h.set_clock(-1);
      break;
    default:
      h.set_clock(in.ConsumeIntegralInRange<int64_t>(0, 3));
      break;
  }
  h.set_layout_fingerprint(in.ConsumeIntegralInRange(0, 15) == 0 ? in.ConsumeIntegral<uint64_t>()
                                                                 : layout.fingerprint);
  if (in.ConsumeBool()) h.set_server_incarnation(in.ConsumeIntegral<uint64_t>());
  return h;
}

uint32_t PickBlock(FuzzedDataProvider& in) {
  const Layout& layout = GetLayout();
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      return Pick(in, layout.other_blocks);
    case 1:
      return layout.num_blocks;
    case 2:
      return in.ConsumeIntegral<uint32_t>();
    default:
      return Pick(in, layout.my_blocks);
  }
}

uint64_t PickKey(FuzzedDataProvider& in) {
  const Layout& layout = GetLayout();
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      return Pick(in, layout.other_keys);
    case 1:
      return in.ConsumeIntegral<uint64_t>();
    default:
      return Pick(in, layout.my_keys);
  }
}

// A payload meant to hold `n` values in `encoding`: mostly the right size, sometimes not;
// the values are one constant (finite or not) or raw bytes from the input.
std::string Payload(FuzzedDataProvider& in, size_t n, Encoding encoding) {
  const size_t bpv = common::IsKnownEncoding(encoding) ? common::BytesPerValue(encoding) : 4;
  size_t bytes = n * bpv;
  switch (in.ConsumeIntegralInRange(0, 9)) {
    case 0:
      bytes = 0;
      break;
    case 1:
      bytes += 1;
      break;
    case 2:
      bytes += bpv;
      break;
    case 3:
      bytes = bytes >= bpv ? bytes - bpv : 0;
      break;
    case 4:
      bytes = in.ConsumeIntegralInRange<size_t>(0, 4 * n * bpv + 8);
      break;
    default:
      break;
  }
  if (in.ConsumeBool() || !common::IsKnownEncoding(encoding) || bytes % bpv != 0) {
    std::string raw = in.ConsumeBytesAsString(bytes);
    raw.resize(bytes, '\0');
    return raw;
  }
  const float value = Pick(in, std::vector<float>{0.5f, -1.f, 0.f, 1e30f, -1e-40f, 65520.f,
                                                  std::numeric_limits<float>::quiet_NaN(),
                                                  std::numeric_limits<float>::infinity()});
  std::string out;
  common::EncodeFloats(std::vector<float>(bytes / bpv, value), encoding, &out);
  return out;
}

PushRequest StructuredPush(FuzzedDataProvider& in, uint64_t* next_sequence) {
  const Layout& layout = GetLayout();
  PushRequest request;
  *request.mutable_header() = PickHeader(in, next_sequence);
  request.set_is_delta(in.ConsumeIntegralInRange(0, 7) == 0);
  const int tables = in.ConsumeIntegralInRange(0, 3);
  for (int i = 0; i < tables; ++i) {
    TableValues* t = request.add_tables();
    t->set_table(TableName(in));
    t->set_encoding(PickEncoding(in));
    const bool as_dense = t->table() == "w" ? in.ConsumeIntegralInRange(0, 15) != 0
                                            : in.ConsumeIntegralInRange(0, 15) == 0;
    if (as_dense) {
      const int blocks = in.ConsumeIntegralInRange(0, 3);
      for (int b = 0; b < blocks; ++b) {
        DenseBlock* block = t->add_blocks();
        block->set_block_id(PickBlock(in));
        const size_t n =
            block->block_id() < layout.num_blocks ? layout.block_sizes[block->block_id()] : 4;
        *block->mutable_values() = Payload(in, n, t->encoding());
      }
    } else {
      const int keys = in.ConsumeIntegralInRange(0, 4);
      for (int k = 0; k < keys; ++k) t->add_keys(PickKey(in));
      *t->mutable_rows() = Payload(in, keys * layout.dim, t->encoding());
    }
  }
  return request;
}

PullRequest StructuredPull(FuzzedDataProvider& in, uint64_t* next_sequence) {
  PullRequest request;
  *request.mutable_header() = PickHeader(in, next_sequence);
  const int tables = in.ConsumeIntegralInRange(0, 3);
  for (int i = 0; i < tables; ++i) {
    TablePullRequest* t = request.add_tables();
    t->set_table(TableName(in));
    t->set_encoding(PickEncoding(in));
    const bool as_dense = t->table() == "w" ? in.ConsumeIntegralInRange(0, 15) != 0
                                            : in.ConsumeIntegralInRange(0, 15) == 0;
    const int n = in.ConsumeIntegralInRange(0, 4);
    for (int j = 0; j < n; ++j) {
      if (as_dense) {
        t->add_block_ids(PickBlock(in));
      } else {
        t->add_keys(PickKey(in));
      }
    }
  }
  return request;
}

std::vector<uint64_t> KeysOf(const PushRequest& request) {
  std::vector<uint64_t> keys;
  for (const TableValues& t : request.tables())
    keys.insert(keys.end(), t.keys().begin(), t.keys().end());
  return keys;
}

void CheckPullAnswer(const google::protobuf::RepeatedPtrField<TablePullRequest>& asked_tables,
                     const PullResponse& response, bool keys_echoed) {
  const absl::Status ok = absl::OkStatus();
  if (response.tables_size() != asked_tables.size()) Fail("pull answered other tables", ok);
  for (int i = 0; i < asked_tables.size(); ++i) {
    const TablePullRequest& asked = asked_tables[i];
    const TableValues& got = response.tables(i);
    const size_t bpv = common::BytesPerValue(asked.encoding());
    if (got.table() != asked.table() || got.blocks_size() != asked.block_ids_size() ||
        got.keys_size() != (keys_echoed ? asked.keys_size() : 0)) {
      Fail("pull answer does not match the request", ok);
    }
    if (got.rows().size() != static_cast<size_t>(asked.keys_size()) * GetLayout().dim * bpv) {
      Fail("sparse pull payload has the wrong size", ok);
    }
    for (const DenseBlock& block : got.blocks()) {
      if (block.block_id() >= GetLayout().num_blocks ||
          block.values().size() != GetLayout().block_sizes[block.block_id()] * bpv) {
        Fail("dense pull payload has the wrong size", ok);
      }
    }
  }
}

}  // namespace ps::fuzz
