#include "fuzz/fuzz_env.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "common/config/config.h"
#include "glog/logging.h"

namespace ps::fuzz {
namespace {

constexpr char kConfig[] = R"pb(
  cluster { num_servers: 2 num_workers: 2 dense_block_floats: 4 num_virtual_shards: 64 }
  training { staleness: 1 }
  security { plaintext: true }
  tables {
    name: "w"
    kind: TABLE_KIND_DENSE
    shape: 3
    shape: 7
    initializer { kind: UNIFORM low: -1 high: 1 }
    optimizer { kind: ADAM clip_norm: 1 }
  }
  tables {
    name: "emb"
    kind: TABLE_KIND_SPARSE
    dim: 3
    initializer { kind: NORMAL stddev: 0.1 }
    optimizer { kind: SGD learning_rate: 0.1 weight_decay: 0.01 }
  }
)pb";

void AppendBytes(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}

}  // namespace

const JobConfig& Config() {
  static const JobConfig* config = [] {
    auto parsed = common::ParseJobConfigText(kConfig, "fuzz_env");
    CHECK(parsed.ok()) << parsed.status();
    auto* c = new JobConfig(*std::move(parsed));
    const absl::Status valid = common::ValidateJobConfig(*c);
    CHECK(valid.ok()) << valid;
    return c;
  }();
  return *config;
}

const Layout& GetLayout() {
  static const Layout* layout = [] {
    auto* l = new Layout;
    Server s = NewServer();
    const common::Partitioner& p = s.shard->partitioner();
    l->fingerprint = p.layout_fingerprint();
    const common::TableInfo* w = p.FindTable("w");
    l->num_blocks = w->num_blocks;
    for (uint32_t b = 0; b < w->num_blocks; ++b) {
      auto [begin, end] = p.BlockRange(*w, b);
      l->block_sizes.push_back(end - begin);
      (p.ServerForBlock(*w, b) == 0 ? l->my_blocks : l->other_blocks).push_back(b);
    }
    for (uint64_t k = 0; l->my_keys.size() < 8 || l->other_keys.size() < 8; ++k) {
      auto& keys = p.ServerForKey(k) == 0 ? l->my_keys : l->other_keys;
      if (keys.size() < 8) keys.push_back(k);
    }
    l->dim = p.FindTable("emb")->dim;
    CHECK(!l->my_blocks.empty() && !l->other_blocks.empty());
    return l;
  }();
  return *layout;
}

Server NewServer(size_t max_shared_bytes_per_worker) {
  Server s;
  auto shard = server::Shard::Create(Config(), server::ShardOptions{});
  CHECK(shard.ok()) << shard.status();
  s.shard = *std::move(shard);
  server::ServiceOptions options;
  options.num_threads = 1;
  options.max_shared_bytes_per_worker = max_shared_bytes_per_worker;
  s.service = std::make_unique<server::ParameterServerService>(s.shard.get(), options,
                                                               server::ServiceHooks{});
  return s;
}

std::string State(server::Shard& shard, absl::Span<const uint64_t> extra_keys, bool with_workers) {
  const Layout& layout = GetLayout();
  std::string out;
  std::vector<uint64_t> keys = layout.my_keys;
  for (uint64_t k : extra_keys) {
    if (keys.size() >= layout.my_keys.size() + 64) break;
    if (shard.partitioner().ServerForKey(k) == 0) keys.push_back(k);
  }
  const server::PullTable tables[] = {{"w", ENCODING_FLOAT32, layout.my_blocks, {}},
                                      {"emb", ENCODING_FLOAT32, {}, keys}};
  std::vector<float> buffer;
  const absl::Status read = shard.ReadPull(  // in memory: no I/O
      tables,
      [&](size_t, size_t, size_t n, absl::FunctionRef<absl::Status(absl::Span<float>)> fill) {
        buffer.resize(n);
        if (absl::Status s = fill(absl::MakeSpan(buffer)); !s.ok()) return s;
        AppendBytes(&out, buffer.data(), buffer.size() * sizeof(float));
        return absl::OkStatus();
      });
  CHECK(read.ok()) << read;
  const uint64_t updates = shard.updates_applied();
  AppendBytes(&out, &updates, sizeof(updates));
  if (!with_workers) return out;
  for (const WorkerCheckpoint& w : shard.workers().Save()) out += w.SerializeAsString();
  return out;
}

RequestHeader Header(int32_t worker, uint64_t sequence, int64_t clock) {
  RequestHeader h;
  h.set_worker_id(worker);
  h.set_worker_incarnation(1);
  h.set_sequence(sequence);
  h.set_clock(clock);
  h.set_layout_fingerprint(GetLayout().fingerprint);
  return h;
}

std::string Floats(size_t n, float value) {
  std::string out;
  for (size_t i = 0; i < n; ++i) AppendBytes(&out, &value, sizeof(value));
  return out;
}

PushRequest ValidPush(int32_t worker, uint64_t sequence, int64_t clock, float dense, size_t keys,
                      float row) {
  const Layout& layout = GetLayout();
  PushRequest push;
  *push.mutable_header() = Header(worker, sequence, clock);
  TableValues* w = push.add_tables();
  w->set_table("w");
  for (uint32_t b : layout.my_blocks) {
    DenseBlock* block = w->add_blocks();
    block->set_block_id(b);
    *block->mutable_values() = Floats(layout.block_sizes[b], dense);
  }
  TableValues* e = push.add_tables();
  e->set_table("emb");
  for (size_t i = 0; i < keys; ++i) e->add_keys(layout.my_keys[i]);
  *e->mutable_rows() = Floats(keys * layout.dim, row);
  return push;
}

PullRequest ValidPull(int32_t worker, int64_t clock, size_t keys, Encoding encoding) {
  const Layout& layout = GetLayout();
  PullRequest pull;
  *pull.mutable_header() = Header(worker, 0, clock);
  TablePullRequest* w = pull.add_tables();
  w->set_table("w");
  for (uint32_t b : layout.my_blocks) w->add_block_ids(b);
  TablePullRequest* e = pull.add_tables();
  e->set_table("emb");
  e->set_encoding(encoding);
  for (size_t i = 0; i < keys; ++i) e->add_keys(layout.my_keys[i]);
  return pull;
}

void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "INVARIANT VIOLATED: %s (status: %s)\n", what, status.ToString().c_str());
  std::abort();
}

void QuietLogging() {
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 2;  // ERROR
}

bool MaybeWriteSeeds(const std::vector<std::pair<std::string, std::string>>& seeds) {
  const char* dir = std::getenv("PS_FUZZ_WRITE_SEEDS");
  if (dir == nullptr || *dir == '\0') return false;
  for (const auto& [name, bytes] : seeds) {
    std::ofstream f(std::string(dir) + "/" + name, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    CHECK(f.good()) << "cannot write seed " << name << " to " << dir;
  }
  return true;
}

void InitializeFuzzer(const std::vector<std::pair<std::string, std::string>>& seeds) {
  QuietLogging();
  if (MaybeWriteSeeds(seeds)) std::exit(0);
}

}  // namespace ps::fuzz
