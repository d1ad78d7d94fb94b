// FakeParameterStore: an in-memory ParameterStore (a map table -> values) for model tests
// and benchmarks. Test-only.
//
// Pull copies the requested tables/rows out; sparse rows are created on first touch with the
// table's initializer, as a server would. Push records a copy of every gradient (last_push)
// and, with a learning rate set, applies plain SGD (value -= learning_rate * gradient), so a
// test can train a model end to end without a server. No clocks, no consistency bound.
#ifndef PS_WORKER_MODELS_FAKE_PARAMETER_STORE_H_
#define PS_WORKER_MODELS_FAKE_PARAMETER_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/parameter_store.h"
#include "proto/config.pb.h"

namespace ps::worker {

// Thread-safe.
class FakeParameterStore final : public common::ParameterStore {
 public:
  // A copy of one Push.
  struct RecordedPush {
    std::map<std::string, std::vector<float>> dense;
    // Per sparse table: (key, gradient row) in push order.
    std::map<std::string, std::vector<std::pair<uint64_t, std::vector<float>>>> sparse;
  };

  FakeParameterStore() = default;

  // A store holding `tables` (dense: initialized now; sparse: rows initialized on first
  // touch), each with its initializer. Errors: INVALID_ARGUMENT for an invalid initializer
  // or a table without shape (dense) or dim (sparse).
  static absl::StatusOr<std::unique_ptr<FakeParameterStore>> ForTables(
      absl::Span<const ps::TableConfig> tables);

  // Adds (or replaces) a dense table holding `values`.
  void AddDenseTable(const std::string& name, std::vector<float> values);
  // Adds (or replaces) a sparse table of rows of `dim` floats, each initialized with `init`
  // (common::InitializeSparseRow) when its key is first pulled or pushed.
  void AddSparseTable(const std::string& name, int64_t dim, ps::InitializerConfig init);
  // SGD step of every Push: value -= learning_rate * gradient. 0 (the default) records
  // pushes without applying them.
  void set_learning_rate(float learning_rate);

  // Errors: NOT_FOUND (unknown table), INVALID_ARGUMENT (wrong kind or buffer size).
  absl::Status Pull(const common::PullBatch& batch, const common::PullOptions& options) override;
  // Errors as Pull. A failed push applies and records nothing.
  absl::Status Push(const common::PushBatch& batch, const common::PushOptions& options) override;
  absl::Status Finish() override { return absl::OkStatus(); }

  // The values of dense table `name` (nullptr if unknown). The test may change them.
  std::vector<float>* MutableDenseForTest(const std::string& name);
  // The row of `key` of sparse table `name` (created if new); nullptr if no such table.
  float* MutableRowForTest(const std::string& name, uint64_t key);
  // The last successful Push.
  RecordedPush last_push() const;
  int64_t num_pushes() const;
  // The keys of the last pull of sparse table `name`, in request order.
  std::vector<uint64_t> last_pulled_keys(const std::string& name) const;

 private:
  struct SparseTable {
    int64_t dim = 0;
    ps::InitializerConfig init;
    absl::flat_hash_map<uint64_t, std::vector<float>> rows;
  };

  absl::Status CheckPull(const common::PullBatch& batch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckPush(const common::PushBatch& batch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<float>& Row(const std::string& name, SparseTable& table, uint64_t key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  float learning_rate_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::vector<float>> dense_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, SparseTable> sparse_ ABSL_GUARDED_BY(mu_);
  RecordedPush last_push_ ABSL_GUARDED_BY(mu_);
  int64_t num_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::vector<uint64_t>> last_pulled_keys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::worker

#endif  // PS_WORKER_MODELS_FAKE_PARAMETER_STORE_H_
