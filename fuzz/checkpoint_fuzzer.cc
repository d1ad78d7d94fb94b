// libFuzzer target: the restore path of a server, from checkpoint records and metadata
// (Shard::BeginRestore / RestoreRecord / EndRestore) and from a damaged checkpoint store on
// disk (CheckpointStore::Open / Latest / Verify / Read through Checkpointer::Restore).
//
// At start the fuzzer builds a real checkpoint of the fuzz_env.h server after a few pushes:
// its records and metadata in memory, and a store with two checkpoints in a template
// directory under $TMPDIR.
//
// Input: byte 0 picks the mode, the rest (FuzzedDataProvider) drives it.
//   mode 0..2 (records): metadata that is either the input's bytes parsed as CheckpointMeta
//     or the real metadata with fields replaced (layout, server index, tables, optimizer
//     slots, workers' exactly-once state and clocks), then up to 16 records that are real
//     ones damaged (bytes flipped, truncated, extended, step replaced), records with a valid
//     key and an input-made value, or arbitrary bytes.
//   mode 3 (store): the template store copied, then 1..4 damages to its files (flip bits of a
//     byte, truncate, overwrite a range) at positions taken from the input, then
//     Checkpointer::Restore of the newest and of the oldest checkpoint into fresh shards.
// Invariants: every call returns a status (no crash, CHECK failure, sanitizer report or
// hang); a RestoreRecord that fails changes nothing; a shard whose restore succeeded serves
// pushes and pulls (whatever they return) without crashing.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fuzz/fuzz_env.h"
#include "glog/logging.h"
#include "server/checkpointer.h"

namespace ps::fuzz {
namespace {

namespace fs = std::filesystem;
using Record = std::pair<std::string, std::string>;

struct Template {
  std::vector<Record> records;           // of a real snapshot
  CheckpointMeta meta;                   // its metadata
  fs::path store_dir;                    // a store holding two complete checkpoints
  fs::path work_dir;                     // where mode 3 copies it to
  std::vector<std::string> store_files;  // relative names, sorted
  // Per file: bytes from 0 up to this offset may be overwritten (see SafePrefix).
  std::vector<uintmax_t> damage_limit;
};

// Pushes and pulls from both workers so that the snapshot holds dense blocks, sparse rows in
// several records and exactly-once state.
void Train(Server& s, uint64_t first_sequence) {
  const Layout& layout = GetLayout();
  for (int32_t worker = 0; worker < 2; ++worker) {
    for (uint64_t seq = first_sequence; seq < first_sequence + 2; ++seq) {
      const PushRequest push = ValidPush(worker, seq, static_cast<int64_t>(seq),
                                         0.25f * (worker + 1), layout.my_keys.size(), -0.5f);
      PushResponse response;
      CHECK(s.service->HandlePush(push, &response).ok());
    }
  }
}

// How much of a store file may be overwritten with arbitrary bytes: all of it, except in SST
// files, where only the data, filter and index blocks (everything up to the end of the index
// block) may be. Flips and truncation reach every byte of every file.
//
// Why: RocksDB 7.8 parses an SST's properties block before it checks that block's checksum,
// and Debian's librocksdb is built with assertions, so a damaged properties block would abort
// the process in DataBlockHashIndex::Initialize (found by this fuzzer). CheckpointStore::Open
// therefore checks the checksum of every table-structure block itself first (sst_check.h),
// which catches any flip. An overwrite, though, lets the fuzzer write a block together with
// a matching checksum (libFuzzer learns compared values), i.e. forge a well-formed but
// hostile block that no checksum can refuse; that is not damage but an attack on the local
// disk, which the store does not claim to resist. The properties, metaindex block and footer
// follow the index block (BlockBasedTableBuilder::Finish), and the footer says where the
// index block ends: its last 53 bytes are a checksum type byte, the metaindex and index
// BlockHandles (varint64 offset and size each), padding to 41 bytes, a 4-byte format version
// and the 8-byte magic number.
uintmax_t SafePrefix(const fs::path& file) {
  std::ifstream f(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (file.extension() != ".sst") return bytes.size();
  constexpr size_t kFooter = 53;
  constexpr uint64_t kBlockBasedTableMagic = 0x88e241b785f4cff7ull;
  constexpr uintmax_t kBlockTrailer = 5;  // compression type + checksum
  uint64_t magic = 0;
  if (bytes.size() < kFooter) return 0;
  std::memcpy(&magic, bytes.data() + bytes.size() - 8, 8);
  if (magic != kBlockBasedTableMagic) return 0;  // unknown layout: leave the file alone
  const char* p = bytes.data() + bytes.size() - kFooter + 1;
  auto varint = [&p]() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t byte = static_cast<uint8_t>(*p++);
      v |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) break;
    }
    return v;
  };
  varint();  // metaindex offset
  varint();  // metaindex size
  const uint64_t index_offset = varint();
  const uint64_t index_size = varint();
  const uintmax_t end = index_offset + index_size + kBlockTrailer;
  return end <= bytes.size() - kFooter ? end : 0;
}

const Template& GetTemplate() {
  static const Template* t = [] {
    auto* t = new Template;
    Server s = NewServer();
    Train(s, 1);
    auto meta = s.shard->Snapshot(
        [&](absl::string_view key, absl::string_view value) {
          t->records.emplace_back(std::string(key), std::string(value));
          return absl::OkStatus();
        },
        /*record_bytes=*/64);
    CHECK(meta.ok()) << meta.status();
    t->meta = *meta;
    const char* tmp = std::getenv("TMPDIR");
    const fs::path root = fs::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") /
                          absl::StrCat("ps_checkpoint_fuzzer.", getpid());
    t->store_dir = root / "template";
    t->work_dir = root / "work";
    fs::remove_all(root);
    {
      server::CheckpointerOptions options;
      options.data_dir = t->store_dir.string();
      options.interval = absl::ZeroDuration();
      options.record_bytes = 64;
      auto checkpointer = server::Checkpointer::Create(s.shard.get(), options);
      CHECK(checkpointer.ok()) << checkpointer.status();
      CHECK((*checkpointer)->CheckpointNow().ok());
      Train(s, 3);
      CHECK((*checkpointer)->CheckpointNow().ok());
    }
    for (const auto& entry : fs::recursive_directory_iterator(t->store_dir)) {
      if (!entry.is_regular_file()) continue;
      const std::string name = fs::relative(entry.path(), t->store_dir).string();
      if (name == "LOCK" || name.rfind("LOG", 0) == 0) continue;  // not read by Open
      t->store_files.push_back(name);
    }
    std::sort(t->store_files.begin(), t->store_files.end());
    for (const std::string& name : t->store_files) {
      t->damage_limit.push_back(SafePrefix(t->store_dir / name));
    }
    std::atexit([] { fs::remove_all(GetTemplate().store_dir.parent_path()); });
    return t;
  }();
  return *t;
}

// A restored shard must serve: a push from a worker and pulls of everything it holds.
void Exercise(Server& s, FuzzedDataProvider& in) {
  const Layout& layout = GetLayout();
  const int32_t worker = in.ConsumeIntegralInRange(0, 1);
  const uint64_t sequence = in.ConsumeIntegralInRange<uint64_t>(1, 6);
  const int64_t clock = in.ConsumeIntegralInRange<int64_t>(0, 8);
  const PushRequest push = ValidPush(worker, sequence, clock, 0.5f, layout.my_keys.size(), 0.5f);
  PushResponse push_response;
  s.service->HandlePush(push, &push_response).IgnoreError();  // any status; no crash

  const PullRequest pull = ValidPull(worker, clock, layout.my_keys.size(), ENCODING_FLOAT32);
  PullResponse pull_response;
  s.service->HandlePull(pull, absl::Now(), &pull_response).IgnoreError();
  StatsResponse stats;
  s.shard->FillStats(&stats);
}

// ---- mode 0..2: records and metadata ------------------------------------------------------

CheckpointMeta MutatedMeta(FuzzedDataProvider& in) {
  CheckpointMeta meta = GetTemplate().meta;
  const int changes = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < changes; ++i) {
    switch (in.ConsumeIntegralInRange(0, 11)) {
      case 0:
        meta.set_layout_fingerprint(in.ConsumeIntegral<uint64_t>());
        break;
      case 1:
        meta.set_num_servers(in.ConsumeIntegralInRange<uint32_t>(0, 3));
        break;
      case 2:
        meta.set_server_index(in.ConsumeIntegralInRange<uint32_t>(0, 2));
        break;
      case 3:
        meta.set_updates_applied(in.ConsumeIntegral<uint64_t>());
        break;
      case 4: {
        if (meta.tables_size() == 0) break;
        TableCheckpoint* t =
            meta.mutable_tables(in.ConsumeIntegralInRange(0, meta.tables_size() - 1));
        t->set_num_slots(in.ConsumeIntegralInRange(-1, 3));
        t->set_optimizer_kind(in.ConsumeIntegralInRange(-1, 5));
        break;
      }
      case 5:
        if (meta.tables_size() > 0) {
          meta.mutable_tables(in.ConsumeIntegralInRange(0, meta.tables_size() - 1))
              ->set_name(in.ConsumeRandomLengthString(8));
        }
        break;
      case 6:
        *meta.add_tables() = meta.tables(0);
        break;
      default: {
        // Exactly-once state and clocks of a (possibly new) worker.
        WorkerCheckpoint* w =
            meta.workers_size() > 0 && in.ConsumeBool()
                ? meta.mutable_workers(in.ConsumeIntegralInRange(0, meta.workers_size() - 1))
                : meta.add_workers();
        switch (in.ConsumeIntegralInRange(0, 6)) {
          case 0:
            w->set_worker_id(in.ConsumeIntegralInRange(-2, 3));
            break;
          case 1:
            w->set_incarnation(in.ConsumeIntegralInRange<uint64_t>(0, 3));
            break;
          case 2:
            w->set_clock(in.ConsumeIntegral<int64_t>());
            break;
          case 3:
            w->set_clock(in.ConsumeBool() ? std::numeric_limits<int64_t>::min()
                                          : std::numeric_limits<int64_t>::max());
            break;
          case 4:
            w->set_applied_floor(in.ConsumeIntegral<uint64_t>());
            break;
          case 5:
            w->add_applied_above(in.ConsumeIntegralInRange<uint64_t>(0, 8));
            break;
          default:
            w->set_finished(in.ConsumeBool());
            break;
        }
        break;
      }
    }
  }
  return meta;
}

Record MakeRecord(FuzzedDataProvider& in) {
  const Template& t = GetTemplate();
  const Layout& layout = GetLayout();
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0: {  // arbitrary
      std::string key = in.ConsumeRandomLengthString(16);
      return {key, in.ConsumeRandomLengthString(256)};
    }
    case 1: {  // a dense block key (any id) with a value of the right size for a block
      uint32_t id = in.ConsumeBool() ? in.ConsumeIntegral<uint32_t>()
                                     : in.ConsumeIntegralInRange<uint32_t>(0, layout.num_blocks);
      std::string key("w");
      key.push_back('\0');
      for (int shift = 24; shift >= 0; shift -= 8) key.push_back(static_cast<char>(id >> shift));
      const size_t size = sizeof(int64_t) + 4 * 3 * sizeof(float);  // Adam: params + 2 slots
      std::string value = in.ConsumeBytesAsString(size);
      value.resize(size, '\0');
      return {key, value};
    }
    case 2: {  // sparse rows with input-made keys, steps and values
      std::string key("emb");
      key.push_back('\0');
      key += in.ConsumeBytesAsString(8);
      const size_t entry = 2 * sizeof(uint64_t) + layout.dim * sizeof(float);  // SGD: no slots
      std::string value = in.ConsumeBytesAsString(entry * in.ConsumeIntegralInRange(1, 3));
      if (in.ConsumeBool()) value.resize((value.size() / entry + 1) * entry, '\0');
      return {key, value};
    }
    default: {  // a real record, damaged
      Record r = t.records[in.ConsumeIntegralInRange<size_t>(0, t.records.size() - 1)];
      std::string& target = in.ConsumeBool() ? r.second : r.first;
      switch (in.ConsumeIntegralInRange(0, 4)) {
        case 0:
          if (!target.empty()) {
            target[in.ConsumeIntegralInRange<size_t>(0, target.size() - 1)] ^=
                static_cast<char>(in.ConsumeIntegralInRange(1, 255));
          }
          break;
        case 1:
          target.resize(in.ConsumeIntegralInRange<size_t>(0, target.size()));
          break;
        case 2:
          target += in.ConsumeRandomLengthString(32);
          break;
        case 3:
          // The step field of a dense block or of the first sparse row.
          if (r.second.size() >= 16) {
            const int64_t step = in.ConsumeBool() ? in.ConsumeIntegral<int64_t>()
                                                  : in.ConsumeIntegralInRange<int64_t>(-2, 2);
            const size_t at = r.first[0] == 'w' ? 0 : 8;
            std::memcpy(&r.second[at], &step, sizeof(step));
          }
          break;
        default:
          break;  // unchanged
      }
      return r;
    }
  }
}

void RecordsMode(FuzzedDataProvider& in) {
  CheckpointMeta meta;
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    if (!meta.ParseFromString(in.ConsumeRandomLengthString(512))) return;
  } else {
    meta = MutatedMeta(in);
  }
  Server s = NewServer();
  if (!s.shard->BeginRestore(meta).ok()) return;
  const int records = in.ConsumeIntegralInRange(0, 16);
  for (int i = 0; i < records; ++i) {
    const Record r = MakeRecord(in);
    const std::string before = State(*s.shard, {});
    const absl::Status status = s.shard->RestoreRecord(r.first, r.second);
    if (!status.ok()) {
      if (State(*s.shard, {}) != before) Fail("a failed RestoreRecord changed the shard", status);
      return;  // the server refuses the checkpoint
    }
  }
  s.shard->EndRestore(meta);
  Exercise(s, in);
}

// ---- mode 3: a damaged store -------------------------------------------------------------

// PS_FUZZ_VERBOSE=1 prints each damage and restore status (to look at one input).
bool Verbose() {
  static const bool verbose = std::getenv("PS_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

// Truncates, overwrites or flips bytes of `file`; overwrites stay below `limit`.
void Damage(const fs::path& file, uintmax_t limit, FuzzedDataProvider& in) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(file, ec);
  if (ec || size == 0) return;
  const int kind = in.ConsumeIntegralInRange(0, 3);
  limit = kind == 1 ? std::min(limit, size) : size;
  if (limit == 0) return;
  const uintmax_t at = in.ConsumeIntegralInRange<uintmax_t>(0, limit - 1);
  if (Verbose()) {
    std::fprintf(stderr, "damage %s (%ju bytes, damage below %ju) at %ju: %s\n",
                 file.filename().c_str(), size, limit, at,
                 kind == 0   ? "truncate"
                 : kind == 1 ? "overwrite"
                             : "flip");
  }
  switch (kind) {
    case 0:
      fs::resize_file(file, at, ec);
      break;
    case 1: {  // overwrite a range with input bytes
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      const std::string bytes = in.ConsumeRandomLengthString(16);
      f.seekp(static_cast<std::streamoff>(at));
      f.write(bytes.data(),
              static_cast<std::streamsize>(std::min<uintmax_t>(bytes.size(), limit - at)));
      break;
    }
    default: {  // flip bits of one byte
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      char c = 0;
      f.seekg(static_cast<std::streamoff>(at));
      f.get(c);
      c ^= static_cast<char>(in.ConsumeIntegralInRange(1, 255));
      f.seekp(static_cast<std::streamoff>(at));
      f.put(c);
      break;
    }
  }
}

void StoreMode(FuzzedDataProvider& in) {
  const Template& t = GetTemplate();
  fs::remove_all(t.work_dir);
  fs::copy(t.store_dir, t.work_dir, fs::copy_options::recursive);
  const int damages = in.ConsumeIntegralInRange(1, 4);
  for (int i = 0; i < damages; ++i) {
    const size_t file = in.ConsumeIntegralInRange<size_t>(0, t.store_files.size() - 1);
    Damage(t.work_dir / t.store_files[file], t.damage_limit[file], in);
  }
  server::CheckpointerOptions options;
  options.data_dir = t.work_dir.string();
  options.interval = absl::ZeroDuration();
  for (const std::optional<uint64_t> id : {std::optional<uint64_t>(), std::optional<uint64_t>(1)}) {
    Server s = NewServer();
    auto checkpointer = server::Checkpointer::Create(s.shard.get(), options);
    if (Verbose()) std::fprintf(stderr, "open: %s\n", checkpointer.status().ToString().c_str());
    if (!checkpointer.ok()) return;
    auto restored = (*checkpointer)->Restore(id);
    if (Verbose()) std::fprintf(stderr, "restore: %s\n", restored.status().ToString().c_str());
    if (restored.ok()) Exercise(s, in);
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> Seeds() {
  std::vector<std::pair<std::string, std::string>> seeds;
  for (int i = 0; i < 6; ++i) {
    std::string body(1, static_cast<char>(i % 4));
    for (int j = 0; j < 64; ++j) body.push_back(static_cast<char>((j * 53 + i * 29) & 0xff));
    seeds.emplace_back("seed_" + std::to_string(i), body);
  }
  // The real metadata as the input's bytes: mode 0; the last byte (read first, from the end)
  // 0 picks "parse the input"; ConsumeRandomLengthString reads up to a backslash that is not
  // doubled, so backslashes in the metadata are doubled.
  std::string raw(1, '\0');
  for (char c : GetTemplate().meta.SerializeAsString()) {
    raw += c;
    if (c == '\\') raw += c;
  }
  raw += "\\x";
  raw += '\0';
  seeds.emplace_back("meta_raw", raw);
  return seeds;
}

}  // namespace ps::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  ps::fuzz::QuietLogging();
  ps::fuzz::GetTemplate();
  if (ps::fuzz::MaybeWriteSeeds(ps::fuzz::Seeds())) std::exit(0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  FuzzedDataProvider in(data + 1, size - 1);
  if ((data[0] & 3) == 3) {
    ps::fuzz::StoreMode(in);
  } else {
    ps::fuzz::RecordsMode(in);
  }
  return 0;
}
