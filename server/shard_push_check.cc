// Shard's checks of a push before anything is applied: the parts' structure, their payloads
// as values (in place where they lie, in pieces, or decoded) and the finite check.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/shard.h"

namespace ps::server {

absl::Status Shard::AwaitPayload(common::FollowingPayload* following, const void* end) {
  if (following == nullptr || following->complete()) return absl::OkStatus();
  absl::Status s = end == nullptr ? following->WaitAll() : following->WaitUntil(end);
  if (!s.ok()) return Reject("payload_late", std::move(s));
  return absl::OkStatus();
}

absl::Status Shard::CheckFinite(absl::Span<const PendingUpdate> updates,
                                common::FollowingPayload* following) {
  // One count per part, in parallel for a large push; the verdict, in push order, here.
  std::vector<size_t> bad(updates.size(), 0);
  size_t values = 0;
  for (const PendingUpdate& u : updates) values += u.num_values();
  // A following payload's values are counted in runs of kFollowingChunkBytes, each once the
  // worker has written it (its first read, which takes the lines from the worker's core, then
  // overlaps the worker's copy of the rest).
  absl::Status late;
  auto count_run = [&](const void* data, size_t n) -> size_t {
    if (following == nullptr || following->complete() ||
        !following->Holds(data, n * sizeof(float))) {
      return common::CountNonFinite(data, n);
    }
    constexpr size_t kRun = common::kFollowingChunkBytes / sizeof(float);
    const auto* at = static_cast<const char*>(data);
    size_t bad_values = 0;
    for (size_t done = 0; done < n; done += kRun) {
      const size_t k = std::min(kRun, n - done);
      const char* run = at + done * sizeof(float);
      if (late = AwaitPayload(following, run + k * sizeof(float)); !late.ok()) return 0;
      bad_values += common::CountNonFinite(run, k);
    }
    return bad_values;
  };
  auto count = [&](const PendingUpdate& u) {
    if (u.pieces.empty()) return count_run(u.values.data(), u.values.size());
    size_t n = 0;
    for (const BlockPiece& p : u.pieces) {
      n += count_run(p.values.data, static_cast<size_t>(p.values.n));
      if (!late.ok()) break;
    }
    return n;
  };
  // A following payload still being written is counted on this thread as it comes: one
  // thread keeps up with the worker's copy, and helpers would only wait for it.
  if (apply_pool_ != nullptr && values >= options_.parallel_apply_values &&
      (following == nullptr || following->complete())) {
    // In ranges of the apply's size (RangeValues), so that a push of few large blocks keeps
    // every thread busy here too.
    struct Unit {
      size_t update, begin, end;
    };
    std::vector<Unit> units;
    const size_t range = RangeValues(values);
    for (size_t i = 0; i < updates.size(); ++i) {
      const size_t n = updates[i].num_values();
      for (size_t begin = 0; begin < n; begin += range) {
        units.push_back(Unit{i, begin, std::min(n, begin + range)});
      }
    }
    std::vector<size_t> counts(units.size(), 0);
    apply_pool_->ParallelFor(units.size(), apply_pool_->num_threads(), [&](size_t k) {
      for (const BlockPiece& p : updates[units[k].update].Pieces(units[k].begin, units[k].end)) {
        counts[k] += common::CountNonFinite(p.values.data, static_cast<size_t>(p.values.n));
      }
    });
    for (size_t k = 0; k < units.size(); ++k) bad[units[k].update] += counts[k];
  } else {
    for (size_t i = 0; i < updates.size(); ++i) {
      bad[i] = count(updates[i]);
      RETURN_IF_ERROR(late);
      if (bad[i] != 0 && options_.reject_nonfinite) break;  // the parts after are not needed
    }
  }
  for (size_t i = 0; i < updates.size(); ++i) {
    if (bad[i] == 0) continue;
    const PendingUpdate& u = updates[i];
    const size_t first = u.FirstNonFinite();
    {
      absl::MutexLock lock(&stats_mu_);
      nonfinite_values_ += bad[i];
    }
    if (!options_.reject_nonfinite) continue;
    const std::string part = u.table->info().kind == TABLE_KIND_DENSE
                                 ? absl::StrCat("block ", u.block)
                                 : std::string("rows");
    // The search reads the payload again: a worker that rewrites its shared payload meanwhile
    // can leave none to find.
    const std::string where =
        first < u.num_values()
            ? absl::StrCat("first at index ", first, ", value ", u.value(first))
            : std::string("none left when looked for: the payload changed while checked");
    return Reject("nonfinite", absl::InvalidArgumentError(
                                   absl::StrCat("table '", u.table->name(), "' ", part, ": ",
                                                bad[i], " non-finite values (", where, ")")));
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const float>> Shard::PayloadValues(absl::string_view bytes,
                                                             Encoding encoding, size_t n,
                                                             CheckedPush* push, bool may_change) {
  static_assert(absl::little_endian::IsLittleEndian(), "the wire format is little-endian");
  if (n == 0) return absl::Span<const float>();
  // Float32 payloads are used where they lie (protobuf's heap strings, the in-process
  // store's spans and gather buffers are aligned for float): no copy.
  if (encoding == ENCODING_FLOAT32 && !may_change &&
      reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) == 0) {
    return absl::Span<const float>(reinterpret_cast<const float*>(bytes.data()), n);
  }
  // Decoded now: a following payload's bytes must be there first.
  if (push->following_ != nullptr && push->following_->Holds(bytes.data(), bytes.size())) {
    RETURN_IF_ERROR(AwaitPayload(push->following_, bytes.data() + bytes.size()));
  }
  auto& buffer = push->decoded_.emplace_back(n);
  RETURN_IF_ERROR(common::DecodeFloats(bytes, encoding, absl::MakeSpan(buffer)));
  return absl::Span<const float>(buffer);
}

absl::Status Shard::CheckDensePush(DenseTablePart* table, const PushTable& t, CheckedPush* push) {
  if (!t.keys.empty() || !t.rows.empty()) {
    return Reject("wrong_kind", absl::InvalidArgumentError(absl::StrCat(
                                    "table '", t.table, "' is dense: push blocks, not keyed rows")));
  }
  const size_t bpv = common::BytesPerValue(t.encoding);
  for (const PushTable::Block& block : t.blocks) {
    size_t bytes = block.bytes.size();
    for (absl::string_view piece : block.pieces) bytes += piece.size();
    if (bytes % bpv != 0) {
      return Reject("bad_size", absl::InvalidArgumentError(absl::StrCat(
                                    "table '", t.table, "' block ", block.id, ": payload of ",
                                    bytes, " bytes is not a whole number of ",
                                    common::EncodingName(t.encoding), " values")));
    }
    RETURN_IF_ERROR(CheckBlock(*table, block.id, bytes / bpv));
    const size_t n = table->BlockSize(block.id);
    absl::Span<const absl::string_view> pieces = block.pieces;
    if (pieces.empty()) pieces = absl::MakeConstSpan(&block.bytes, 1);
    // Float32 values are used where they lie, unless clip_norm sums the block (one span keeps
    // the sum, and so the result, bit for bit the in-process store's) or a peer cut the
    // payload into tiny HTTP/2 frames (each piece costs more bookkeeping than its bytes).
    const bool in_place = t.encoding == ENCODING_FLOAT32 && table->optimizer().clip_norm == 0 &&
                          pieces.size() <= kFreePieces + bytes / kMinPieceBytes;
    const bool aligned = reinterpret_cast<uintptr_t>(pieces[0].data()) % alignof(float) == 0;
    // A payload that may change is read once by the update: as pieces (zero_nonfinite).
    if (pieces.size() == 1 && (aligned || !in_place) && !(in_place && t.payload_may_change)) {
      ASSIGN_OR_RETURN(absl::Span<const float> values,
                       PayloadValues(pieces[0], t.encoding, n, push, t.payload_may_change));
      push->updates_.push_back(PendingUpdate{table, block.id, {}, values, {}});
    } else if (in_place) {
      // Values cut between pieces are put together now (one piece has none).
      if (pieces.size() > 1) RETURN_IF_ERROR(AwaitPayload(push->following_));
      push->updates_.push_back(PieceUpdate(table, block.id, pieces, push, t.payload_may_change));
    } else {
      RETURN_IF_ERROR(AwaitPayload(push->following_));  // gathered now
      // Gathered into one span (16-bit values are decoded from it).
      std::string joined;
      std::vector<float>& out = push->decoded_.emplace_back(n);
      char* to = reinterpret_cast<char*>(out.data());
      if (t.encoding != ENCODING_FLOAT32) {
        joined.resize(bytes);
        to = joined.data();
      }
      for (absl::string_view piece : pieces) {
        std::memcpy(to, piece.data(), piece.size());
        to += piece.size();
      }
      if (t.encoding != ENCODING_FLOAT32) {
        RETURN_IF_ERROR(common::DecodeFloats(joined, t.encoding, absl::MakeSpan(out)));
      }
      push->updates_.push_back(PendingUpdate{table, block.id, {}, out, {}});
    }
    push->bytes_in_ += bytes;
  }
  return absl::OkStatus();
}

absl::InlinedVector<BlockPiece, 4> PendingUpdate::Pieces(size_t begin, size_t end) const {
  absl::InlinedVector<BlockPiece, 4> out;
  if (pieces.empty()) {
    out.push_back(BlockPiece{
        begin, kernels::FloatBytes{values.data() + begin, static_cast<int64_t>(end - begin)}});
    return out;
  }
  // The pieces cover the block in order: from the first that ends after `begin`.
  auto first = std::partition_point(pieces.begin(), pieces.end(), [begin](const BlockPiece& p) {
    return p.offset + static_cast<size_t>(p.values.n) <= begin;
  });
  for (auto it = first; it != pieces.end() && it->offset < end; ++it) {
    const BlockPiece& p = *it;
    const size_t from = std::max(begin, p.offset);
    const size_t to = std::min(end, p.offset + static_cast<size_t>(p.values.n));
    if (from >= to) continue;  // an empty piece
    const auto* bytes = static_cast<const unsigned char*>(p.values.data);
    out.push_back(BlockPiece{
        from, kernels::FloatBytes{bytes + (from - p.offset) * sizeof(float),
                                  static_cast<int64_t>(to - from), p.values.zero_nonfinite}});
  }
  return out;
}

size_t PendingUpdate::num_values() const {
  if (pieces.empty()) return values.size();
  return pieces.back().offset + static_cast<size_t>(pieces.back().values.n);
}

float PendingUpdate::value(size_t i) const {
  if (pieces.empty()) return values[i];
  // The piece holding value i: the last one starting at or before it.
  auto it = std::upper_bound(pieces.begin(), pieces.end(), i,
                             [](size_t v, const BlockPiece& p) { return v < p.offset; });
  CHECK(it != pieces.begin() && i < num_values()) << "value " << i << " of " << num_values();
  --it;
  float v;
  std::memcpy(&v, static_cast<const char*>(it->values.data) + (i - it->offset) * sizeof(float),
              sizeof(float));
  return v;
}

size_t PendingUpdate::FirstNonFinite() const {
  size_t i = 0;
  const size_t n = num_values();
  if (pieces.empty()) {
    while (i < n && std::isfinite(values[i])) ++i;
    return i;
  }
  // Piece by piece (not value(i) by value(i): a push may hold many pieces).
  for (const BlockPiece& p : pieces) {
    const auto* bytes = static_cast<const char*>(p.values.data);
    for (int64_t k = 0; k < p.values.n; ++k, ++i) {
      float v;
      std::memcpy(&v, bytes + k * sizeof(float), sizeof(float));
      if (!std::isfinite(v)) return i;
    }
  }
  return i;
}

PendingUpdate Shard::PieceUpdate(DenseTablePart* table, uint32_t block,
                                 absl::Span<const absl::string_view> pieces, CheckedPush* push,
                                 bool may_change) {
  // Whole values in place; a value cut between two pieces is put together in straddles_.
  // CheckPush reserved 2 entries per piece (k pieces make at most k views and k - 1 cut
  // values): the spans into pieces_ and straddles_ must never move.
  CHECK_LE(push->pieces_.size() + 2 * pieces.size(), push->pieces_.capacity());
  CHECK_LE(push->straddles_.size() + pieces.size(), push->straddles_.capacity());
  const size_t first = push->pieces_.size();
  size_t offset = 0;  // values of the block so far
  char partial[4];    // the start of a value cut at the end of the previous piece
  size_t have = 0;    // bytes of it
  for (absl::string_view piece : pieces) {
    size_t at = 0;
    if (have > 0) {
      const size_t take = std::min(sizeof(float) - have, piece.size());
      std::memcpy(partial + have, piece.data(), take);
      have += take;
      at = take;
      if (have < sizeof(float)) continue;
      float& v = push->straddles_.emplace_back();
      std::memcpy(&v, partial, sizeof(float));
      push->pieces_.push_back(BlockPiece{offset, kernels::FloatBytes{&v, 1}});
      ++offset;
      have = 0;
    }
    const size_t whole = (piece.size() - at) / sizeof(float);
    if (whole > 0) {
      push->pieces_.push_back(BlockPiece{
          offset, kernels::FloatBytes{piece.data() + at, static_cast<int64_t>(whole), may_change}});
      offset += whole;
    }
    have = piece.size() - at - whole * sizeof(float);
    std::memcpy(partial, piece.data() + at + whole * sizeof(float), have);
  }
  DCHECK_EQ(have, 0u);
  DCHECK_EQ(offset, table->BlockSize(block));
  return PendingUpdate{table, block, {}, {}, absl::MakeConstSpan(push->pieces_).subspan(first)};
}

absl::Status Shard::CheckSparsePush(SparseTablePart* table, const PushTable& t,
                                    CheckedPush* push) {
  if (!t.blocks.empty()) {
    return Reject("wrong_kind", absl::InvalidArgumentError(absl::StrCat(
                                    "table '", t.table, "' is sparse: push keyed rows, not blocks")));
  }
  const size_t bpv = common::BytesPerValue(t.encoding);
  if (t.rows.size() % bpv != 0) {
    return Reject("bad_size", absl::InvalidArgumentError(absl::StrCat(
                                  "table '", t.table, "': rows payload of ", t.rows.size(),
                                  " bytes is not a whole number of ",
                                  common::EncodingName(t.encoding), " values")));
  }
  const size_t n = t.rows.size() / bpv;
  RETURN_IF_ERROR(CheckKeys(*table, t.keys, n));
  ASSIGN_OR_RETURN(absl::Span<const float> values,
                   PayloadValues(t.rows, t.encoding, n, push, t.payload_may_change));
  push->updates_.push_back(PendingUpdate{table, 0, t.keys, values});
  push->bytes_in_ += t.rows.size();
  return absl::OkStatus();
}

absl::StatusOr<CheckedPush> Shard::CheckPush(const PushView& push) {
  Timed timed(&push_check_ns_);
  RETURN_IF_ERROR(CheckLayout(push.info));
  RETURN_IF_ERROR(CheckPusher(push.info));
  RETURN_IF_ERROR(CheckWorkerAndClock(push.info));
  CheckedPush checked;
  checked.info_ = push.info;
  checked.following_ = push.following;
  checked.options_.kind = push.is_delta ? UpdateKind::kDelta : UpdateKind::kGradient;
  checked.options_.delta_scale = delta_scale();
  size_t count = 0, pieces = 0;
  for (const PushTable& t : push.tables) {
    count += t.blocks.size() + 1;
    // A block of k pieces makes at most k in place and k - 1 cut values; a whole payload at
    // an unaligned address, or one that may change, is one piece.
    for (const PushTable::Block& b : t.blocks) {
      if (!b.pieces.empty()) {
        pieces += 2 * b.pieces.size();
      } else if (t.payload_may_change ||
                 reinterpret_cast<uintptr_t>(b.bytes.data()) % alignof(float) != 0) {
        pieces += 2;
      }
    }
  }
  checked.updates_.reserve(count);
  checked.decoded_.reserve(count);
  if (pieces > 0) {
    checked.pieces_.reserve(pieces);
    checked.straddles_.reserve(pieces);
  }
  const absl::Status parts = CheckPushTables(push, &checked);
  if (parts.ok() && OnePassFits(checked)) {
    RETURN_IF_ERROR(AwaitPayload(checked.following_));  // read by the update
    checked.one_pass_ = true;  // the update checks the values as it reads them
    return checked;
  }
  // Values are checked after the parts' structure, all at once (in parallel for a large push),
  // but reported as if each part had been checked in turn: the parts found before a
  // structural error are exactly those checked, and the first non-finite one among them wins
  // (and is the one refusal counted). Gradients and deltas alike.
  if (absl::Status values = CheckFinite(checked.updates_, checked.following_); !values.ok()) {
    if (!parts.ok()) UncountRejection(RejectionReason(parts));
    return values;
  }
  RETURN_IF_ERROR(parts);
  return checked;
}

bool Shard::OnePassFits(const CheckedPush& push) const {
  if (!options_.reject_nonfinite || push.options_.kind != UpdateKind::kGradient ||
      push.updates_.empty()) {
    return false;
  }
  size_t values = 0;
  for (const PendingUpdate& u : push.updates_) {
    if (u.table->info().kind != TABLE_KIND_DENSE ||
        !static_cast<const DenseTablePart*>(u.table)->SupportsOnePass()) {
      return false;
    }
    values += u.num_values();
  }
  return values <= kOnePassMaxValues;
}

absl::Status Shard::CheckPushTables(const PushView& push, CheckedPush* checked) {
  for (const PushTable& t : push.tables) {
    RETURN_IF_ERROR(CheckEncoding(t.encoding));
    ASSIGN_OR_RETURN(TablePart * part, FindTable(t.table));
    if (part->info().kind == TABLE_KIND_DENSE) {
      RETURN_IF_ERROR(CheckDensePush(static_cast<DenseTablePart*>(part), t, checked));
    } else {
      RETURN_IF_ERROR(CheckSparsePush(static_cast<SparseTablePart*>(part), t, checked));
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::server
