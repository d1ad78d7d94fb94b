#include "server/storage/internal/data_dir.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "rocksdb/db.h"
#include "server/storage/rocksdb_status.h"
#include "server/storage/sst_check.h"

namespace ps::server::storage::internal {
namespace {
// SST files whose table structure is damaged (see sst_check.h) are renamed with this suffix
// while RocksDB opens the store, so that it does not parse them.
constexpr absl::string_view kUncheckedSuffix = ".damaged";

}  // namespace

// Checks the table structure of every SST file in `path` before RocksDB parses any (see
// sst_check.h) and moves the damaged ones aside (+kUncheckedSuffix). Returns one DATA_LOSS per
// file moved. First moves back files left aside by an Open() that did not finish.
absl::StatusOr<std::vector<std::pair<std::string, absl::Status>>> MoveDamagedSstFilesAside(
    rocksdb::Env* env, const std::string& path) {
  std::vector<std::string> children;
  RETURN_IF_ERROR(FromRocksDbStatus(env->GetChildren(path, &children), "list files"));
  for (std::string& child : children) {
    if (!absl::EndsWith(child, absl::StrCat(".sst", kUncheckedSuffix))) continue;
    const std::string original(absl::StripSuffix(child, kUncheckedSuffix));
    RETURN_IF_ERROR(FromRocksDbStatus(
        env->RenameFile(absl::StrCat(path, "/", child), absl::StrCat(path, "/", original)),
        "move back " + child));
    child = original;
  }
  std::vector<std::pair<std::string, absl::Status>> damaged;
  for (const std::string& child : children) {
    if (!absl::EndsWith(child, ".sst")) continue;
    const std::string file = absl::StrCat(path, "/", child);
    absl::StatusOr<SstCheck> check = CheckSstFile(file);
    if (check.ok()) continue;
    if (!absl::IsDataLoss(check.status())) return check.status();
    RETURN_IF_ERROR(FromRocksDbStatus(env->RenameFile(file, file + std::string(kUncheckedSuffix)),
                                      "move aside " + child));
    damaged.emplace_back(file, check.status());
  }
  return damaged;
}

// After DB::Open: a damaged file that the store could do without was not one of its live
// files (typically a table file a killed process was still writing): it is moved into
// kSetAsideDir, never deleted. If the store needed one, the damaged files are moved back and
// their damage is the error.
absl::Status SettleDamagedSstFiles(rocksdb::Env* env,
                                   const std::vector<std::pair<std::string, absl::Status>>& damaged,
                                   bool opened, absl::string_view context) {
  std::vector<std::string> messages;
  for (const auto& [file, status] : damaged) {
    const std::string aside = file + std::string(kUncheckedSuffix);
    if (opened) {
      const std::string dir = std::string(file.substr(0, file.rfind('/') + 1)) +
                              std::string(kSetAsideDir);
      const std::string target = dir + file.substr(file.rfind('/'));
      rocksdb::Status moved = env->CreateDirIfMissing(dir);
      if (moved.ok()) moved = env->RenameFile(aside, target);
      LOG(WARNING) << context << ": " << file << " is not part of the store (" << status.message()
                   << "): "
                   << (moved.ok() ? "moved to " + target : "left as " + aside + ": " +
                                                              moved.ToString());
    } else {
      env->RenameFile(aside, file).PermitUncheckedError();
      messages.emplace_back(status.message());
    }
  }
  if (opened || damaged.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(context, ": ", absl::StrJoin(messages, "; ")));
}

namespace {

// Where `file` (a path) goes in the set-aside directory beside it: its name, with ".N"
// added when that name is taken (nothing there is overwritten).
std::string SetAsideTarget(rocksdb::Env* env, const std::string& dir, absl::string_view name) {
  std::string target = absl::StrCat(dir, "/", name);
  for (int n = 1; env->FileExists(target).ok(); ++n) target = absl::StrCat(dir, "/", name, ".", n);
  return target;
}

}  // namespace

// RocksDB's read-write open deletes the table, blob and MANIFEST files of the directory that
// its MANIFEST does not list, taking them for its own leftovers; but nothing in a data dir may
// be deleted that the store did not mark obsolete itself. So the store is opened read-only
// first (that deletes nothing) to learn its live files, and every other *.sst, *.blob and
// MANIFEST-* file is moved into kSetAsideDir (logged). If the read-only open fails, nothing is
// moved: the read-write open then meets (and reports) the same problem.
absl::Status SetAsideFilesTheStoreDoesNotList(
    rocksdb::Env* env, const rocksdb::DBOptions& db_options, const std::string& path,
    const std::vector<rocksdb::ColumnFamilyDescriptor>& descriptors, absl::string_view context) {
  std::vector<std::string> live;
  {
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw_db = nullptr;
    const rocksdb::Status opened =
        rocksdb::DB::OpenForReadOnly(db_options, path, descriptors, &handles, &raw_db);
    if (!opened.ok()) return absl::OkStatus();
    std::unique_ptr<rocksdb::DB> db(raw_db);
    uint64_t manifest_size = 0;
    const rocksdb::Status listed = db->GetLiveFiles(live, &manifest_size, /*flush_memtable=*/false);
    for (rocksdb::ColumnFamilyHandle* h : handles) {
      db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    }
    db->Close().PermitUncheckedError();
    RETURN_IF_ERROR(FromRocksDbStatus(listed, "list live files"));
  }
  absl::flat_hash_set<std::string> live_names;
  for (const std::string& file : live) {
    live_names.insert(std::string(absl::StripPrefix(file, "/")));
  }
  std::vector<std::string> children;
  RETURN_IF_ERROR(FromRocksDbStatus(env->GetChildren(path, &children), "list files"));
  const std::string dir = absl::StrCat(path, "/", kSetAsideDir);
  for (const std::string& child : children) {
    const bool ours = absl::EndsWith(child, ".sst") || absl::EndsWith(child, ".blob") ||
                      absl::StartsWith(child, "MANIFEST-");
    if (!ours || live_names.contains(child)) continue;
    RETURN_IF_ERROR(FromRocksDbStatus(env->CreateDirIfMissing(dir), "create " + dir));
    const std::string target = SetAsideTarget(env, dir, child);
    RETURN_IF_ERROR(FromRocksDbStatus(env->RenameFile(absl::StrCat(path, "/", child), target),
                                      "move aside " + child));
    LOG(WARNING) << context << ": " << child << " is not one of the store's files (its MANIFEST "
                 << "does not list it): moved to " << target << " (RocksDB would delete it)";
  }
  return absl::OkStatus();
}

// A directory without CURRENT is new only if it holds no other RocksDB file: opening one that
// lost its CURRENT would create a fresh, empty store over the old files, and RocksDB would then
// delete them as obsolete. DATA_LOSS naming what is missing and what is there; nothing touched.
absl::Status RefuseStoreWithoutCurrent(rocksdb::Env* env, const std::string& path) {
  std::vector<std::string> children;
  RETURN_IF_ERROR(FromRocksDbStatus(env->GetChildren(path, &children), "list files"));
  std::vector<std::string> found;
  for (const std::string& child : children) {
    // IDENTITY, LOCK and OPTIONS files hold no data: a process killed while RocksDB created
    // the store leaves them, and opening creates it afresh.
    if (absl::StartsWith(child, "MANIFEST-") || absl::EndsWith(child, ".sst") ||
        absl::EndsWith(child, ".log") || absl::EndsWith(child, ".damaged")) {
      found.push_back(child);
    }
  }
  if (found.empty()) return absl::OkStatus();
  std::sort(found.begin(), found.end());
  return absl::DataLossError(absl::StrCat(
      "checkpoint store ", path, ": the file CURRENT is missing, yet the directory holds ",
      absl::StrJoin(found, ", "),
      ": refusing to open it (that would start a new, empty store and delete these files). "
      "Nothing was changed. Restore CURRENT (it names the newest MANIFEST file, followed by a "
      "newline), or move the directory away to start from initial values"));
}

// Creates `path` and its missing parents through `env`, so errors come back as rocksdb::Status.
rocksdb::Status CreateDirs(rocksdb::Env* env, const std::string& path) {
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    rocksdb::Status s = env->CreateDirIfMissing(path.substr(0, pos));
    if (!s.ok()) return s;
  }
  return env->CreateDirIfMissing(path);
}

}  // namespace ps::server::storage::internal
