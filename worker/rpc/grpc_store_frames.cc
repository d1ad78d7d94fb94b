// GrpcParameterStore's PushPull frames: building each server's frame of a call (pushes
// encoded or aliased, pulls split by server without duplicate keys) and reading the answers
// into the caller's buffers.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/hash.h"
#include "common/rpc/frame.h"
#include "common/rpc/shared_memory.h"
#include "common/startup/cores.h"
#include "common/status_macros.h"
#include "common/thread_cpu.h"
#include "common/thread_pool.h"
#include "glog/logging.h"
#include "worker/rpc/grpc_store.h"
#include "worker/rpc/grpc_store_exchange.h"

namespace ps::worker {
namespace {

Encoding EncodingOf(const common::TableInfo& t) { return t.config->wire_encoding(); }

// Whether pushes of `t` go through PushResiduals (16-bit encodings only: float32 is exact).
bool ErrorFeedback(const common::TableInfo& t) {
  return t.config->wire_encoding() != ENCODING_FLOAT32 && t.config->wire_error_feedback();
}

// A sparse pull's keys split by server without duplicates: positions[s] holds the positions
// (into `keys`, ascending) of the first occurrences of server s's keys, and `repeats` pairs
// each later occurrence's position with its first's. Only first occurrences are asked for;
// the answers land in the caller's rows at those positions, and repeats are copied from
// there, so no buffer of unique rows is needed.
//
// The keys seen are kept in an open-addressing table that the calling thread reuses (its
// entries carry the number of the call that wrote them, so a new call starts without clearing
// it): no per-call allocation or zero fill for the common sizes.
void SplitUniqueKeys(absl::Span<const uint64_t> keys, const common::Partitioner& partitioner,
                     std::vector<std::vector<uint32_t>>* positions,
                     std::vector<std::pair<uint32_t, uint32_t>>* repeats) {
  // An entry names the key by its position in `keys`: 8 bytes, so that the table of a large
  // pull stays in the L2 cache (the keys themselves are read there too).
  struct Seen {
    uint32_t position;
    uint32_t call;  // 0: never written
  };
  // Tables up to this many entries (8 MB) are kept per thread; bigger ones are per call.
  constexpr size_t kKeptEntries = size_t{1} << 20;
  thread_local std::vector<Seen> kept;
  thread_local uint32_t kept_call = 0;
  size_t capacity = 16;  // at most 5/8 full
  while (capacity * 5 < keys.size() * 8) capacity *= 2;
  std::vector<Seen> local;
  std::vector<Seen>* table = &local;
  uint32_t call = 1;
  if (capacity <= kKeptEntries) {
    table = &kept;
    if (kept.size() < capacity || ++kept_call == 0) {
      kept.assign(std::max(capacity, kept.size()), Seen{0, 0});
      kept_call = 1;
    }
    call = kept_call;
  } else {
    local.assign(capacity, Seen{0, 0});
  }
  const size_t mask = capacity - 1;
  const uint32_t servers = partitioner.num_servers();
  positions->resize(servers);
  for (std::vector<uint32_t>& p : *positions) {
    p.clear();
    p.reserve(keys.size() / servers + 16);
  }
  repeats->clear();
  Seen* seen = table->data();
  // The entry of the key this far ahead is prefetched: the table outgrows the L1 cache.
  constexpr size_t kAhead = 8;
  for (uint32_t i = 0; i < keys.size(); ++i) {
    if (i + kAhead < keys.size()) {
      __builtin_prefetch(&seen[common::Mix64(keys[i + kAhead]) & mask]);
    }
    const uint64_t key = keys[i];
    for (size_t h = common::Mix64(key) & mask;; h = (h + 1) & mask) {
      Seen& e = seen[h];
      if (e.call != call) {
        e = Seen{i, call};
        (*positions)[servers == 1 ? 0 : partitioner.ServerForKey(key)].push_back(i);
        break;
      }
      if (keys[e.position] == key) {
        repeats->emplace_back(i, e.position);
        break;
      }
    }
  }
}

absl::Status BadResponse(uint32_t server, absl::string_view what) {
  return absl::InternalError(absl::StrCat("server ", server, " answered a pull wrongly: ", what));
}

// The largest answer header an honest server sends for `asked`: its tables' names, encodings
// and blocks' ids and lengths (bounds on their protobuf encoding, as the server's
// AnswerHeaderBytes), and room for the rest (the push's result, a shared-memory offer). An
// answer's header is parsed before anything in it is checked, and a header of empty entries
// grows about 28 times when parsed: a larger one is refused unread.
size_t AnswerHeaderLimit(const PushPullRequest& asked) {
  constexpr size_t kRest = 64 << 10, kPerTable = 32, kPerBlock = 24;
  size_t bytes = kRest;
  for (const TablePullRequest& tr : asked.pull()) {
    bytes += kPerTable + tr.table().size() + kPerBlock * static_cast<size_t>(tr.block_ids_size());
  }
  return bytes;
}

// An answer's tables are the frame's pull entries in their order, as the server's ReadPull
// writes them: every table and block asked for, each once, in the encoding asked for, a dense
// entry with no rows and a sparse one with no blocks, values only in the payload (keys are
// not echoed). Without this
// an answer that left a table or block out, or sent rows with a dense table's blocks, was read
// as OK with the caller's buffers partly unwritten or shifted.
absl::Status CheckAnswerShape(uint32_t s, const PushPullRequest& asked,
                              const PullResponse& answer) {
  if (answer.tables_size() != asked.pull_size()) {
    return BadResponse(
        s, absl::StrCat(answer.tables_size(), " tables for the ", asked.pull_size(), " asked for"));
  }
  for (int i = 0; i < asked.pull_size(); ++i) {
    const TablePullRequest& tr = asked.pull(i);
    const TableValues& tv = answer.tables(i);
    if (tv.table() != tr.table() || tv.encoding() != tr.encoding()) {
      return BadResponse(
          s, absl::StrCat("table '", tv.table(), "' in encoding ", tv.encoding(), " where '",
                          tr.table(), "' in encoding ", tr.encoding(), " was asked for"));
    }
    if (tv.blocks_size() != tr.block_ids_size()) {
      return BadResponse(s, absl::StrCat(tv.blocks_size(), " blocks of '", tv.table(), "' for the ",
                                         tr.block_ids_size(), " asked for"));
    }
    for (int j = 0; j < tv.blocks_size(); ++j) {
      if (tv.blocks(j).block_id() != tr.block_ids(j) || !tv.blocks(j).values().empty()) {
        return BadResponse(s, absl::StrCat("block ", tv.blocks(j).block_id(), " of '", tv.table(),
                                           "' where block ", tr.block_ids(j), " was asked for"));
      }
    }
    if (!tv.rows().empty() || tv.keys_size() != 0 ||
        (tr.keys_size() == 0 && tv.rows_bytes() != 0)) {
      return BadResponse(s, absl::StrCat("rows of '", tv.table(), "' that were not asked for"));
    }
  }
  return absl::OkStatus();
}

// One sparse table's rows of an answer (checked for size) into the caller's rows `out`, row j
// at position pos[j].
absl::Status ReadRows(Encoding encoding, absl::Span<const uint32_t> pos, size_t dim, float* out,
                      common::FrameReader* reader, std::string* scratch) {
  const size_t row_bytes = dim * sizeof(float);
  if (encoding == ENCODING_FLOAT32) {
    // The one copy: from gRPC's receive slices into the caller's rows.
    // Runs of consecutive positions (all of them when one server has every key, which
    // then has no repeats) are copied at once.
    for (size_t j = 0; j < pos.size();) {
      size_t end = j + 1;
      while (end < pos.size() && pos[end] == pos[end - 1] + 1) ++end;
      reader->CopyTo((end - j) * row_bytes, reinterpret_cast<char*>(out + size_t{pos[j]} * dim));
      j = end;
    }
    return absl::OkStatus();
  }
  scratch->resize(pos.size() * dim * common::BytesPerValue(encoding));
  reader->CopyTo(scratch->size(), scratch->data());
  std::vector<float> decoded(pos.size() * dim);
  RETURN_IF_ERROR(common::DecodeFloats(*scratch, encoding, absl::MakeSpan(decoded)));
  for (size_t j = 0; j < pos.size(); ++j) {
    std::memcpy(out + size_t{pos[j]} * dim, decoded.data() + j * dim, row_bytes);
  }
  return absl::OkStatus();
}

}  // namespace

std::string GrpcParameterStore::TakeBuffer() {
  absl::MutexLock lock(&buffers_mu_);
  if (spare_buffers_.empty()) return std::string();
  std::string b = std::move(spare_buffers_.back());
  spare_buffers_.pop_back();
  return b;
}

void GrpcParameterStore::GiveBuffer(std::string buffer) {
  buffer.clear();  // keeps its capacity: the pages stay mapped for the next call
  absl::MutexLock lock(&buffers_mu_);
  if (spare_buffers_.size() < 64) spare_buffers_.push_back(std::move(buffer));
}

absl::Status GrpcParameterStore::CheckPush(const common::PushBatch& batch) const {
  for (const common::DensePush& p : batch.dense) {
    const common::TableInfo* t = partitioner_.FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_DENSE || p.values.size() != t->numel) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': ", p.values.size(),
                                                     " values for a dense table of ", t->numel));
    }
  }
  for (const common::SparsePush& p : batch.sparse) {
    const common::TableInfo* t = partitioner_.FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_SPARSE || p.values.size() != p.keys.size() * t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': ", p.values.size(),
                                                     " values for ", p.keys.size(),
                                                     " sparse rows"));
    }
  }
  return absl::OkStatus();
}

// Float32 blocks go out as slices of the caller's gradient; 16-bit encodings (and error
// feedback) are encoded into buffers the exchange owns.
void GrpcParameterStore::AddDensePush(const common::DensePush& p, Exchange* x) {
  const common::TableInfo* t = partitioner_.FindTable(p.table);
  std::vector<TableValues*> per_server(data_stubs_.size(), nullptr);
  for (uint32_t b = 0; b < t->num_blocks; ++b) {
    const uint32_t s = partitioner_.ServerForBlock(*t, b);
    if (per_server[s] == nullptr) {
      per_server[s] = x->headers[s].add_push();
      per_server[s]->set_table(p.table);
      per_server[s]->set_encoding(EncodingOf(*t));
    }
    DenseBlock* block = per_server[s]->add_blocks();
    block->set_block_id(b);
    auto [begin, end] = partitioner_.BlockRange(*t, b);
    const absl::Span<const float> values = p.values.subspan(begin, end - begin);
    absl::string_view bytes(reinterpret_cast<const char*>(values.data()),
                            values.size() * sizeof(float));
    if (EncodingOf(*t) != ENCODING_FLOAT32) {
      std::string& out = x->encoded.emplace_back(TakeBuffer());
      if (ErrorFeedback(*t)) {
        residuals_.AppendDense(p.table, t->numel, begin, values, EncodingOf(*t), &out);
      } else {
        common::AppendFloats(values, EncodingOf(*t), &out);
      }
      bytes = out;
    }
    block->set_payload_bytes(bytes.size());
    x->payloads[s].push_back(bytes);
    x->sent += bytes.size();
  }
}

// Each server's rows are gathered (and encoded) into one buffer the exchange owns.
void GrpcParameterStore::AddSparsePush(const common::SparsePush& p,
                                       std::vector<std::vector<uint32_t>>* positions,
                                       Exchange* x) {
  const common::TableInfo* t = partitioner_.FindTable(p.table);
  partitioner_.SplitKeysByServer(p.keys, positions);
  for (uint32_t s = 0; s < data_stubs_.size(); ++s) {
    if ((*positions)[s].empty()) continue;
    TableValues* tv = x->headers[s].add_push();
    tv->set_table(p.table);
    tv->set_encoding(EncodingOf(*t));
    if ((*positions)[s].size() == p.keys.size() && EncodingOf(*t) == ENCODING_FLOAT32) {
      // Every row goes to this server, in order: the caller's keys and gradient as they are.
      tv->mutable_keys()->Add(p.keys.begin(), p.keys.end());
      absl::string_view rows(reinterpret_cast<const char*>(p.values.data()),
                             p.values.size() * sizeof(float));
      tv->set_rows_bytes(rows.size());
      x->payloads[s].push_back(rows);
      x->sent += rows.size();
      continue;
    }
    std::string& rows = x->encoded.emplace_back(TakeBuffer());
    rows.reserve((*positions)[s].size() * t->dim * common::BytesPerValue(EncodingOf(*t)));
    tv->mutable_keys()->Reserve(static_cast<int>((*positions)[s].size()));
    for (uint32_t i : (*positions)[s]) {
      tv->mutable_keys()->AddAlreadyReserved(p.keys[i]);
      auto row = p.values.subspan(size_t{i} * t->dim, t->dim);
      if (ErrorFeedback(*t)) {
        residuals_.AppendSparseRow(p.table, p.keys[i], row, EncodingOf(*t), &rows);
      } else {
        common::AppendFloats(row, EncodingOf(*t), &rows);
      }
    }
    tv->set_rows_bytes(rows.size());
    x->payloads[s].push_back(rows);
    x->sent += rows.size();
  }
}

absl::Status GrpcParameterStore::AddPush(const common::PushBatch& batch,
                                         const common::PushOptions& options, Exchange* x) {
  // Resolve and check everything before taking sequences or moving residuals.
  RETURN_IF_ERROR(CheckPush(batch));
  pushed_.store(true, std::memory_order_relaxed);
  {
    // Encoding happens here, once per call; FanOut's retries resend the same frames.
    absl::MutexLock residuals_lock(&residuals_mu_);
    for (const common::DensePush& p : batch.dense) AddDensePush(p, x);
    std::vector<std::vector<uint32_t>> positions;
    for (const common::SparsePush& p : batch.sparse) AddSparsePush(p, &positions, x);
  }
  // A push with nothing in it is a clock tick: every server hears it.
  const bool tick = batch.dense.empty() && batch.sparse.empty();
  for (uint32_t s = 0; s < data_stubs_.size(); ++s) {
    PushPullRequest& h = x->headers[s];
    if (h.push_size() == 0 && !push_to_all_ && !tick) continue;
    h.set_has_push(true);
    h.set_is_delta(options.is_delta);
    *h.mutable_header() = Header(options.clock, next_sequence_[s].fetch_add(1));
  }
  return absl::OkStatus();
}

absl::Status GrpcParameterStore::AddPull(const common::PullBatch& batch,
                                         const common::PullOptions& options, Exchange* x) {
  const size_t n = data_stubs_.size();
  for (const common::DensePull& p : batch.dense) {
    const common::TableInfo* t = partitioner_.FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_DENSE || p.out.size() != t->numel) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': buffer of ",
                                                     p.out.size(), " floats for a dense table of ",
                                                     t->numel));
    }
    x->dense_pull_bytes += p.out.size() * sizeof(float);
    for (uint32_t s = 0; s < n; ++s) {
      std::vector<uint32_t> blocks = partitioner_.BlocksOnServer(*t, s);
      if (blocks.empty()) continue;
      TablePullRequest* tr = x->headers[s].add_pull();
      tr->set_table(p.table);
      tr->set_encoding(EncodingOf(*t));
      tr->mutable_block_ids()->Add(blocks.begin(), blocks.end());
      x->pull_out[s].push_back(Exchange::PullOut{&p, 0});
    }
  }
  x->sparse_out.reserve(batch.sparse.size());
  for (const common::SparsePull& p : batch.sparse) {
    const common::TableInfo* t = partitioner_.FindTable(p.table);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("unknown table '", p.table, "'"));
    if (t->kind != TABLE_KIND_SPARSE || p.out.size() != p.keys.size() * t->dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", p.table, "': buffer of ",
                                                     p.out.size(), " floats for ",
                                                     p.keys.size(), " sparse rows"));
    }
    const size_t index = x->sparse_out.size();
    Exchange::SparseOut& so = x->sparse_out.emplace_back();
    so.pull = &p;
    so.info = t;
    SplitUniqueKeys(p.keys, partitioner_, &so.positions, &so.repeats);
    for (uint32_t s = 0; s < n; ++s) {
      if (so.positions[s].empty()) continue;
      TablePullRequest* tr = x->headers[s].add_pull();
      tr->set_table(p.table);
      tr->set_encoding(EncodingOf(*t));
      x->pull_out[s].push_back(Exchange::PullOut{nullptr, index});
      auto* keys = tr->mutable_keys();
      if (so.positions[s].size() == p.keys.size()) {  // every key, in order
        keys->Add(p.keys.begin(), p.keys.end());
        continue;
      }
      keys->Reserve(static_cast<int>(so.positions[s].size()));
      for (uint32_t i : so.positions[s]) keys->AddAlreadyReserved(p.keys[i]);
    }
  }
  return absl::OkStatus();
}

void GrpcParameterStore::SplitPullPieces(Exchange* x) const {
  const size_t piece = options_.pull_piece_bytes;
  if (piece == 0 || options_.max_pull_pieces < 2) return;
  for (uint32_t s = 0; s < x->servers; ++s) {
    // The server's dense blocks in frame order: (table entry, block, bytes).
    struct Part {
      int table;
      uint32_t block;
      uint64_t bytes;
    };
    std::vector<Part> parts;
    uint64_t total = 0;
    const auto& tables = x->headers[s].pull();  // (no frame is added before the parts are listed)
    for (int i = 0; i < tables.size(); ++i) {
      const common::TableInfo* t = partitioner_.FindTable(tables[i].table());
      if (t->kind != TABLE_KIND_DENSE) continue;
      for (uint32_t b : tables[i].block_ids()) {
        auto [begin, end] = partitioner_.BlockRange(*t, b);
        parts.push_back(Part{i, b, (end - begin) * common::BytesPerValue(tables[i].encoding())});
        total += parts.back().bytes;
      }
    }
    const uint64_t pieces = std::min<uint64_t>(
        {total / piece, options_.max_pull_pieces, static_cast<uint64_t>(parts.size())});
    if (pieces < 2) continue;
    // Piece k takes the blocks that start in its k-th of the bytes; piece 0 stays in frame s
    // (with the sparse tables), the others become frames of their own.
    const PushPullRequest whole = x->headers[s];
    for (auto& t : *x->headers[s].mutable_pull()) t.clear_block_ids();
    std::vector<size_t> frames = {s};
    for (uint64_t k = 1; k < pieces; ++k) {
      frames.push_back(x->headers.size());
      x->headers.emplace_back();
      x->payloads.emplace_back();
      x->pull_out.emplace_back();
      x->piece_server.push_back(s);
    }
    // entries[k][i]: piece k's entry for the frame's table entry i.
    std::vector<std::vector<TablePullRequest*>> entries(
        pieces, std::vector<TablePullRequest*>(whole.pull_size(), nullptr));
    uint64_t before = 0;
    for (const Part& p : parts) {
      const uint64_t k = std::min(pieces - 1, before * pieces / total);
      before += p.bytes;
      TablePullRequest*& e = entries[k][p.table];
      if (e == nullptr && k == 0) e = x->headers[s].mutable_pull(p.table);
      if (e == nullptr) {
        e = x->headers[frames[k]].add_pull();
        e->set_table(whole.pull(p.table).table());
        e->set_encoding(whole.pull(p.table).encoding());
        // (Frame s's entries are dropped only below: its list still matches `whole`.)
        x->pull_out[frames[k]].push_back(x->pull_out[s][p.table]);
      }
      e->add_block_ids(p.block);
    }
    // Dense tables left without blocks in piece 0 are dropped from it.
    auto* first = x->headers[s].mutable_pull();
    for (int i = first->size() - 1; i >= 0; --i) {
      if (first->Get(i).block_ids().empty() && first->Get(i).keys().empty()) {
        first->DeleteSubrange(i, 1);
        x->pull_out[s].erase(x->pull_out[s].begin() + i);
      }
    }
  }
}

uint64_t GrpcParameterStore::AnswerBytes(const PushPullRequest& h) const {
  uint64_t bytes = 0;
  for (const TablePullRequest& tr : h.pull()) {
    const common::TableInfo* t = partitioner_.FindTable(tr.table());
    const uint64_t bpv = common::BytesPerValue(tr.encoding());
    if (t == nullptr) continue;
    for (uint32_t b : tr.block_ids()) {
      auto [begin, end] = partitioner_.BlockRange(*t, b);
      bytes += (end - begin) * bpv;
    }
    bytes += uint64_t{static_cast<uint64_t>(tr.keys_size())} * t->dim * bpv;
  }
  return bytes;
}

grpc::ByteBuffer GrpcParameterStore::BuildFrame(uint32_t f, const Exchange& x) const {
  common::FrameBuilder frame(x.headers[f]);
  if (!x.shared[f].valid()) {
    for (absl::string_view bytes : x.payloads[f]) frame.AddAliased(bytes, x.aliases);
  }
  return frame.Build();
}

absl::Status GrpcParameterStore::ReadAnswer(uint32_t f, const grpc::ByteBuffer& answer,
                                            Exchange* x) {
  const uint32_t s = x->ServerOf(f);
  PushPullResponse header;
  common::FrameReader reader;
  // Parsed, an honest header's entries take up to about ten times their wire bytes.
  const size_t limit = AnswerHeaderLimit(x->headers[f]);
  if (absl::Status st = common::FrameReader::Open(answer, limit, &header, &reader,
                                                  /*counters=*/nullptr, 32 * limit);
      !st.ok()) {
    return BadResponse(s, st.message());
  }
  RETURN_IF_ERROR(CheckAnswerShape(s, x->headers[f], header.pull()));
  if (header.shared_answer_bytes() > 0) {
    const SharedPayload& sp = x->headers[f].shared();
    if (!x->shared[f].valid() || header.shared_answer_bytes() > sp.answer_capacity() ||
        reader.remaining() > 0) {
      return BadResponse(s, absl::StrCat("an answer of ", header.shared_answer_bytes(),
                                         " bytes in shared memory, with room for ",
                                         x->shared[f].valid() ? sp.answer_capacity() : 0));
    }
    reader.Append(
        absl::string_view(x->shared[f].data() + (sp.answer_offset() - x->shared[f].offset()),
                          header.shared_answer_bytes()));
    x->shared_bytes += header.shared_answer_bytes();
  }
  if (x->shared[f].valid()) {
    x->shared_bytes += x->headers[f].shared().push_bytes();
    if (x->handoff[f].lent) x->lent_bytes += x->headers[f].shared().push_bytes();
  }
  if (x->headers[f].has_push() && header.push().duplicate()) ++x->duplicates;
  // The lengths must cut the payload exactly (a lying server's could wrap around to its size),
  // before anything is read.
  const uint64_t total = reader.remaining();
  common::PayloadLengths lengths(total);
  for (const TableValues& tv : header.pull().tables()) {
    for (const DenseBlock& block : tv.blocks()) lengths.Add(block.payload_bytes());
    lengths.Add(tv.rows_bytes());
  }
  if (!lengths.Exact()) {
    return BadResponse(
        s, absl::StrCat("payload lengths that do not add up to the ", total, " payload bytes"));
  }
  std::string scratch;
  // Float32 blocks are copied after every part is checked, possibly in parallel.
  const common::FrameReader start = reader;
  std::vector<BlockCopy> copies;
  // One table per pull entry of the frame, in its order (CheckAnswerShape): entry i's values
  // go where pull_out[f][i] says, whichever other entry names the same table.
  const std::vector<Exchange::PullOut>& outs = x->pull_out[f];
  DCHECK_EQ(outs.size(), static_cast<size_t>(header.pull().tables_size()));
  for (int i = 0; i < header.pull().tables_size(); ++i) {
    const TableValues& tv = header.pull().tables(i);
    const size_t bpv = common::BytesPerValue(tv.encoding());
    if (bpv == 0) return BadResponse(s, "unknown encoding");
    if (const common::DensePull* pull = outs[i].dense; pull != nullptr) {
      const common::TableInfo* t = partitioner_.FindTable(tv.table());
      for (const DenseBlock& block : tv.blocks()) {
        // The block is one this frame asked for (CheckAnswerShape): a block of this server.
        auto [begin, end] = partitioner_.BlockRange(*t, block.block_id());
        if (block.payload_bytes() != (end - begin) * bpv) {
          return BadResponse(s, absl::StrCat(block.payload_bytes(), " bytes for block ",
                                             block.block_id(), " of '", tv.table(), "'"));
        }
        float* out = pull->out.data() + begin;
        if (tv.encoding() == ENCODING_FLOAT32) {
          // The one copy (below): from gRPC's receive slices into the caller's buffer.
          copies.push_back(BlockCopy{total - reader.remaining(), block.payload_bytes(),
                                     reinterpret_cast<char*>(out)});
          reader.Skip(block.payload_bytes());
        } else {
          scratch.resize(block.payload_bytes());
          reader.CopyTo(scratch.size(), scratch.data());
          RETURN_IF_ERROR(common::DecodeFloats(scratch, tv.encoding(),
                                               absl::MakeSpan(out, end - begin)));
        }
        x->received += block.payload_bytes();
      }
    } else {
      Exchange::SparseOut& so = x->sparse_out[outs[i].sparse];
      const auto& pos = so.positions[s];
      const size_t dim = so.info->dim;
      // Rows come in the order of the keys asked for; the keys are not echoed.
      if (tv.keys_size() != 0 || tv.rows_bytes() != pos.size() * dim * bpv) {
        return BadResponse(s, absl::StrCat(tv.rows_bytes(), " bytes and ", tv.keys_size(),
                                           " keys of '", tv.table(), "' for ", pos.size(),
                                           " rows"));
      }
      RETURN_IF_ERROR(ReadRows(tv.encoding(), pos, dim, so.pull->out.data(), &reader, &scratch));
      x->received += tv.rows_bytes();
    }
  }
  // Only an answer taken whole steers the link (found in review, 2026-12-06: an offer in an
  // answer refused for its lengths was mapped and used by the next calls). A refused one
  // leaves the ask to OnSharedFailure, which lets the next call ask again.
  if (x->asked[f] != 0) TakeOffer(f, header, x);
  if (x->shared[f].valid()) {
    // Whether the next push to this server may follow its call (GrpcStoreOptions::
    // overlap_push_copy): as the server's latest answer through its segment said.
    absl::MutexLock lock(&shared_mu_);
    SharedLink& link = shared_[s];
    if (link.state == SharedLink::kActive && link.arena->memory() == x->shared[f].memory()) {
      link.follow_now = header.push_may_follow();
    }
  }
  // Streamed when the whole pull, all servers' parts, is larger than the cache.
  Exchange::Handoff& h = x->handoff[f];
  const bool timed = h.timed && x->shared[f].valid();
  const int64_t cpu = timed && h.costed ? common::ThreadCpuNanos() : 0;
  CopyBlocks(start, copies, /*stream=*/x->dense_pull_bytes > options_.stream_copy_bytes);
  if (timed) {
    // (Counted in any mode: a server told nothing to time says nothing.)
    if (header.served_cpu_ns() > 0) ++handoffs_served_cpu_;
    if (h.costed) {
      h.copy_cpu_ns += common::ThreadCpuNanos() - cpu;
      handoff_[h.chooser]->Record(h.stream, common::HandoffChooser::CallCost(
                                                h.copy_cpu_ns, header.served_cpu_ns(),
                                                absl::GetCurrentTimeNanos() - h.start_ns, h.bytes));
    }
    CountHandoff(h.stream);
  }
  if (const Exchange::Following& w = x->following[f]; w.could && x->shared[f].valid()) {
    ++following_[w.follows ? 1 : 0];
  }
  return absl::OkStatus();
}

void GrpcParameterStore::CopyBlocks(const common::FrameReader& reader,
                                    absl::Span<const BlockCopy> copies, bool stream) const {
  // Each run of blocks walks its own copy of the reader (the slices are shared, refcounted).
  auto copy_run = [&reader, stream](absl::Span<const BlockCopy> run) {
    common::FrameReader r = reader;
    size_t at = 0;
    std::vector<absl::string_view> pieces;
    for (const BlockCopy& c : run) {
      r.Skip(c.offset - at);
      if (stream) {
        pieces.clear();
        r.Pieces(c.n, &pieces);
        char* dest = c.dest;
        for (absl::string_view piece : pieces) {
          common::StreamCopy(dest, piece.data(), piece.size());
          dest += piece.size();
        }
      } else {
        r.CopyTo(c.n, c.dest);
      }
      at = c.offset + c.n;
    }
  };
  size_t bytes = 0;
  for (const BlockCopy& c : copies) bytes += c.n;
  if (options_.parallel_copy_bytes == 0 || bytes < options_.parallel_copy_bytes ||
      copies.size() < 2) {
    copy_run(copies);
    return;
  }
  // The cores this process may use (its affinity mask and cgroup CPU quota: a container
  // allowed 2 cores on a 64-core node copies with 2 threads, not 4), read once per process:
  // the cgroup files are too dear to read for every answer.
  static const unsigned cores = common::UsableCores();
  const size_t threads = std::min<size_t>({4, cores, copies.size()});
  if (threads < 2) {
    copy_run(copies);
    return;
  }
  // The helpers are kept, and watch for the next answer's copy as long as the calling thread
  // polls for answers (GrpcStoreOptions::busy_poll): no thread is started or woken per copy
  // while answers keep coming.
  absl::call_once(copy_out_once_, [this] {
    const int helpers = static_cast<int>(std::min<unsigned>(3, cores - 1));
    copy_out_ = std::make_unique<common::ThreadPool>(
        helpers, common::ThreadPool::Spin{helpers, options_.busy_poll});
  });
  // Contiguous runs of about equal bytes, whole blocks each: each run walks its own reader.
  std::vector<absl::Span<const BlockCopy>> runs;
  size_t begin = 0;
  size_t left = bytes;
  for (size_t t = threads; t > 0 && begin < copies.size(); --t) {
    const size_t share = left / t;
    size_t end = begin;
    size_t run = 0;
    while (end < copies.size() && (run < share || end == begin)) run += copies[end++].n;
    if (t == 1) end = copies.size();
    runs.push_back(copies.subspan(begin, end - begin));
    left -= run;
    begin = end;
  }
  copy_out_->ParallelFor(runs.size(), static_cast<int>(threads) - 1,
                         [&](size_t k) { copy_run(runs[k]); });
}

}  // namespace ps::worker
