#include "server/storage/spill_store.h"

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "server/storage/crc32c.h"
#include "server/storage/rocksdb_status.h"

namespace ps::server::storage {
namespace {

// Stored value: [uint32 crc, little-endian][value]; crc = CRC-32C(key as 8 bytes big-endian,
// then value). Keys are big-endian so that RocksDB's bytewise order is numeric order.
constexpr size_t kCrcBytes = 4;

std::string EncodeKey(uint64_t key) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(key >> (56 - 8 * i));
  return out;
}

uint64_t DecodeKey(absl::string_view bytes) {
  uint64_t key = 0;
  for (int i = 0; i < 8; ++i) key = (key << 8) | static_cast<uint8_t>(bytes[i]);
  return key;
}

uint32_t Checksum(absl::string_view key_bytes, absl::string_view value) {
  return crc32c::Extend(crc32c::Value(key_bytes), value);
}

std::string EncodeValue(absl::string_view key_bytes, absl::string_view value) {
  const uint32_t crc = Checksum(key_bytes, value);
  std::string out(kCrcBytes + value.size(), '\0');
  for (size_t i = 0; i < kCrcBytes; ++i) out[i] = static_cast<char>(crc >> (8 * i));
  if (!value.empty()) std::memcpy(out.data() + kCrcBytes, value.data(), value.size());
  return out;
}

// The value inside `stored`, or DATA_LOSS naming the key.
absl::StatusOr<absl::string_view> DecodeValue(absl::string_view context, uint64_t key,
                                              absl::string_view key_bytes,
                                              absl::string_view stored) {
  if (stored.size() < kCrcBytes) {
    return absl::DataLossError(absl::StrCat(context, " key ", key, ": stored value of ",
                                            stored.size(), " bytes has no checksum"));
  }
  uint32_t crc = 0;
  for (size_t i = 0; i < kCrcBytes; ++i)
    crc |= uint32_t{static_cast<uint8_t>(stored[i])} << (8 * i);
  absl::string_view value = stored.substr(kCrcBytes);
  if (Checksum(key_bytes, value) != crc) {
    return absl::DataLossError(
        absl::StrCat(context, " key ", key, ": checksum mismatch (the spilled row is corrupt)"));
  }
  return value;
}

rocksdb::Options MakeDbOptions(rocksdb::Env* env) {
  rocksdb::Options options;
  options.env = env;
  options.create_if_missing = true;
  options.error_if_exists = true;  // Always a fresh database (see the header).
  options.create_missing_column_families = true;
  options.max_open_files = 512;
  options.max_background_jobs = 2;
  options.keep_log_file_num = 2;
  options.avoid_flush_during_shutdown = true;  // The files are deleted right after.
  return options;
}

rocksdb::ColumnFamilyOptions MakeTableOptions(const SpillStoreOptions& o,
                                              std::shared_ptr<rocksdb::Cache> cache) {
  rocksdb::ColumnFamilyOptions options;
  // Rows are floats, which block compressors barely shrink; compressing costs CPU for nothing.
  options.compression = rocksdb::kNoCompression;
  options.write_buffer_size = o.write_buffer_bytes;
  options.max_write_buffer_number = 3;
  options.level_compaction_dynamic_level_bytes = true;
  // Most lookups are for rows that are not in the memtables (only recently evicted rows are):
  // a bloom filter over the memtables' keys skips searching them.
  options.memtable_whole_key_filtering = true;
  options.memtable_prefix_bloom_size_ratio = 0.05;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = std::move(cache);
  // Point lookups: a row that was never spilled (a new key) is ruled out by the filter without
  // reading a block.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return options;
}

rocksdb::WriteOptions SpillWriteOptions() {
  rocksdb::WriteOptions options;
  options.disableWAL = true;  // Never recovered: see the header.
  options.sync = false;
  return options;
}

// Creates `path` and its missing parents through `env`, so errors come back as rocksdb::Status.
rocksdb::Status CreateDirs(rocksdb::Env* env, const std::string& path) {
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    rocksdb::Status s = env->CreateDirIfMissing(path.substr(0, pos));
    if (!s.ok()) return s;
  }
  return env->CreateDirIfMissing(path);
}

}  // namespace

// ---- Snapshot and Table -----------------------------------------------------------------

namespace {

class RocksDbSpillSnapshot final : public SpillSnapshot {
 public:
  RocksDbSpillSnapshot(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* cf, std::string context)
      : db_(db), cf_(cf), snapshot_(db->GetSnapshot()), context_(std::move(context)) {}
  ~RocksDbSpillSnapshot() override { db_->ReleaseSnapshot(snapshot_); }

  absl::Status ForEach(
      const std::function<absl::Status(uint64_t, absl::string_view)>& visit) override {
    rocksdb::ReadOptions options;
    options.snapshot = snapshot_;
    options.verify_checksums = true;
    options.fill_cache = false;  // A full scan would only evict the blocks lookups need.
    options.readahead_size = 2 << 20;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(options, cf_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const rocksdb::Slice k = it->key();
      if (k.size() != 8) {
        return absl::DataLossError(
            absl::StrCat(context_, ": stored key of ", k.size(), " bytes (expected 8)"));
      }
      const absl::string_view key_bytes(k.data(), k.size());
      const uint64_t key = DecodeKey(key_bytes);
      ASSIGN_OR_RETURN(absl::string_view value,
                       DecodeValue(context_, key, key_bytes,
                                   absl::string_view(it->value().data(), it->value().size())));
      RETURN_IF_ERROR(visit(key, value));
    }
    return FromRocksDbStatus(it->status(), context_);
  }

 private:
  rocksdb::DB* const db_;                  // Not owned.
  rocksdb::ColumnFamilyHandle* const cf_;  // Not owned.
  const rocksdb::Snapshot* const snapshot_;
  const std::string context_;
};

}  // namespace

class SpillStore::Table final : public SpillTable {
 public:
  Table(rocksdb::DB* db, std::unique_ptr<rocksdb::ColumnFamilyHandle> cf, std::string name,
        const std::string& path)
      : db_(db),
        cf_(std::move(cf)),
        name_(std::move(name)),
        context_(absl::StrCat("spill store ", path, " table '", name_, "'")) {}

  const std::string& name() const override { return name_; }

  absl::StatusOr<bool> Get(uint64_t key, std::string* value) override {
    const std::string key_bytes = EncodeKey(key);
    std::string stored;
    rocksdb::ReadOptions options;
    options.verify_checksums = true;
    const rocksdb::Status s = db_->Get(options, cf_.get(), key_bytes, &stored);
    if (s.IsNotFound()) return false;
    RETURN_IF_ERROR(FromRocksDbStatus(s, absl::StrCat(context_, " key ", key)));
    ASSIGN_OR_RETURN(absl::string_view v, DecodeValue(context_, key, key_bytes, stored));
    value->assign(v.data(), v.size());
    return true;
  }

  absl::Status Put(uint64_t key, absl::string_view value) override {
    const std::string key_bytes = EncodeKey(key);
    return PutRaw(key, EncodeValue(key_bytes, value));
  }

  absl::Status PutRaw(uint64_t key, absl::string_view stored) {
    return FromRocksDbStatus(db_->Put(SpillWriteOptions(), cf_.get(), EncodeKey(key),
                                      rocksdb::Slice(stored.data(), stored.size())),
                             absl::StrCat(context_, " key ", key));
  }

  absl::Status Delete(uint64_t key) override {
    return FromRocksDbStatus(db_->Delete(SpillWriteOptions(), cf_.get(), EncodeKey(key)),
                             absl::StrCat(context_, " key ", key));
  }

  std::unique_ptr<SpillSnapshot> Snapshot() override {
    return std::make_unique<RocksDbSpillSnapshot>(db_, cf_.get(), context_);
  }

  rocksdb::ColumnFamilyHandle* cf() const { return cf_.get(); }

 private:
  rocksdb::DB* const db_;  // Not owned.
  const std::unique_ptr<rocksdb::ColumnFamilyHandle> cf_;
  const std::string name_;
  const std::string context_;
};

// ---- SpillStore -------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<SpillStore>> SpillStore::Open(
    const SpillStoreOptions& options, const std::vector<std::string>& tables) {
  return OpenImpl(options, tables, rocksdb::Env::Default());
}

absl::StatusOr<std::unique_ptr<SpillStore>> SpillStore::OpenWithEnvForTest(
    const SpillStoreOptions& options, const std::vector<std::string>& tables, rocksdb::Env* env) {
  return OpenImpl(options, tables, env);
}

SpillStore::SpillStore(const SpillStoreOptions& options, rocksdb::Env* env)
    : options_(options), env_(env) {}

absl::StatusOr<std::unique_ptr<SpillStore>> SpillStore::OpenImpl(
    const SpillStoreOptions& options, const std::vector<std::string>& tables, rocksdb::Env* env) {
  if (options.path.empty()) return absl::InvalidArgumentError("spill store: empty path");
  const std::string context = absl::StrCat("spill store ", options.path);
  if (tables.empty()) return absl::InvalidArgumentError(context + ": no tables");
  absl::flat_hash_set<std::string> names;
  for (const std::string& t : tables) {
    if (t.empty() || t == rocksdb::kDefaultColumnFamilyName || !names.insert(t).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, ": bad or repeated table name '", t, "'"));
    }
  }
  std::unique_ptr<SpillStore> store(new SpillStore(options, env));
  RETURN_IF_ERROR(FromRocksDbStatus(CreateDirs(env, options.path), context));
  // Held until the destructor: the files below are deleted only by their owner.
  RETURN_IF_ERROR(FromRocksDbStatus(env->LockFile(options.path + "/LOCK", &store->lock_),
                                    absl::StrCat(context, " (is another server using it?)")));
  rocksdb::Options db_options = MakeDbOptions(env);
  // Whatever a previous process left is stale (see the header).
  RETURN_IF_ERROR(FromRocksDbStatus(rocksdb::DestroyDB(store->db_path(), db_options),
                                    absl::StrCat(context, ": deleting the previous contents")));
  store->cache_ = rocksdb::NewLRUCache(options.block_cache_bytes);
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()}};
  for (const std::string& t : tables) {
    descriptors.emplace_back(t, MakeTableOptions(options, store->cache_));
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw_db = nullptr;
  RETURN_IF_ERROR(FromRocksDbStatus(
      rocksdb::DB::Open(db_options, store->db_path(), descriptors, &handles, &raw_db), context));
  store->db_.reset(raw_db);
  // The default column family is unused; the DB keeps its own reference to it.
  delete handles[0];
  for (size_t i = 0; i < tables.size(); ++i) {
    store->tables_.push_back(std::make_unique<Table>(
        raw_db, std::unique_ptr<rocksdb::ColumnFamilyHandle>(handles[i + 1]), tables[i],
        options.path));
  }
  return store;
}

SpillStore::~SpillStore() {
  tables_.clear();  // Column family handles go before the DB.
  if (db_ != nullptr) {
    const rocksdb::Status s = db_->Close();
    if (!s.ok()) LOG(WARNING) << "spill store " << options_.path << ": close: " << s.ToString();
    db_.reset();
    const rocksdb::Status destroyed = rocksdb::DestroyDB(db_path(), MakeDbOptions(env_));
    if (!destroyed.ok()) {
      LOG(WARNING) << "spill store " << options_.path
                   << ": deleting its files: " << destroyed.ToString();
    }
  }
  if (lock_ != nullptr) env_->UnlockFile(lock_).PermitUncheckedError();
}

SpillTable* SpillStore::table(size_t i) const { return tables_[i].get(); }

uint64_t SpillStore::ApproximateSizeBytes() {
  uint64_t total = 0;
  for (const auto& t : tables_) {
    for (const char* property :
         {"rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"}) {
      uint64_t v = 0;
      if (db_->GetIntProperty(t->cf(), property, &v)) total += v;
    }
  }
  return total;
}

absl::Status SpillStore::FlushForTest() {
  for (const auto& t : tables_) {
    RETURN_IF_ERROR(FromRocksDbStatus(db_->Flush(rocksdb::FlushOptions(), t->cf()),
                                      absl::StrCat("spill store ", options_.path, ": flush")));
  }
  return absl::OkStatus();
}

absl::Status SpillStore::PutRawForTest(size_t i, uint64_t key, absl::string_view stored) {
  return tables_[i]->PutRaw(key, stored);
}

}  // namespace ps::server::storage
