#include "worker/trainer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/data/metrics.h"
#include "worker/data/shard_iterator.h"
#include "worker/serial_executor.h"

namespace ps::worker {
namespace {

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.6g", v);
}

enum Phase { kData = 0, kPull, kCompute, kPush, kWait, kNumPhases };
constexpr const char* kPhaseNames[kNumPhases] = {"data", "pull", "compute", "push", "wait"};

}  // namespace

namespace internal {

// A pull or push issued ahead (prefetch) for a model with one set of buffers: the tables,
// keys and values it names, copied into buffers of its own so that the model may move on to
// another batch meanwhile. The vectors keep their capacity from step to step.
struct Staged {
  std::vector<std::string> dense_tables, sparse_tables;
  std::vector<std::vector<uint64_t>> keys;     // per sparse entry
  std::vector<std::vector<float>> dense, sparse;  // values per entry
  common::PullBatch pull;  // spans into the vectors above
  common::PushBatch push;
};

}  // namespace internal

namespace {

using internal::Staged;

template <typename Entry>
void CopyInto(const Entry& from, std::vector<float>* to) {
  to->assign(from.begin(), from.end());
}

// Copies the shape of `spec` (tables, keys, value sizes) into `staged` and points
// staged->pull at its buffers.
void StagePull(const common::PullBatch& spec, Staged* staged) {
  staged->dense_tables.resize(spec.dense.size());
  staged->dense.resize(spec.dense.size());
  for (size_t i = 0; i < spec.dense.size(); ++i) {
    staged->dense_tables[i] = spec.dense[i].table;
    staged->dense[i].resize(spec.dense[i].out.size());
  }
  staged->sparse_tables.resize(spec.sparse.size());
  staged->keys.resize(spec.sparse.size());
  staged->sparse.resize(spec.sparse.size());
  for (size_t i = 0; i < spec.sparse.size(); ++i) {
    staged->sparse_tables[i] = spec.sparse[i].table;
    staged->keys[i].assign(spec.sparse[i].keys.begin(), spec.sparse[i].keys.end());
    staged->sparse[i].resize(spec.sparse[i].out.size());
  }
  staged->pull = common::PullBatch();
  for (size_t i = 0; i < spec.dense.size(); ++i) {
    staged->pull.dense.push_back({staged->dense_tables[i], absl::MakeSpan(staged->dense[i])});
  }
  for (size_t i = 0; i < spec.sparse.size(); ++i) {
    staged->pull.sparse.push_back({staged->sparse_tables[i], absl::MakeConstSpan(staged->keys[i]),
                                   absl::MakeSpan(staged->sparse[i])});
  }
}

// Copies the values of a completed staged pull into the buffers `spec` names. The model
// asked for the same batch both times, so the requests match; INTERNAL if they do not.
absl::Status UnstagePull(const Staged& staged, const common::PullBatch& spec) {
  if (spec.dense.size() != staged.pull.dense.size() ||
      spec.sparse.size() != staged.pull.sparse.size()) {
    return absl::InternalError("prefetch: the model asked for other tables the second time");
  }
  for (size_t i = 0; i < spec.dense.size(); ++i) {
    const common::DensePull& a = staged.pull.dense[i];
    const common::DensePull& b = spec.dense[i];
    if (a.table != b.table || a.out.size() != b.out.size()) {
      return absl::InternalError(absl::StrCat("prefetch: table '", b.table, "' differs"));
    }
    std::copy(a.out.begin(), a.out.end(), b.out.begin());
  }
  for (size_t i = 0; i < spec.sparse.size(); ++i) {
    const common::SparsePull& a = staged.pull.sparse[i];
    const common::SparsePull& b = spec.sparse[i];
    if (a.table != b.table || a.out.size() != b.out.size() ||
        !std::equal(a.keys.begin(), a.keys.end(), b.keys.begin(), b.keys.end())) {
      return absl::InternalError(absl::StrCat("prefetch: keys of table '", b.table, "' differ"));
    }
    std::copy(a.out.begin(), a.out.end(), b.out.begin());
  }
  return absl::OkStatus();
}

// Copies the gradients `spec` names into `staged` and points staged->push at them.
void StagePush(const common::PushBatch& spec, Staged* staged) {
  staged->dense_tables.resize(spec.dense.size());
  staged->dense.resize(spec.dense.size());
  for (size_t i = 0; i < spec.dense.size(); ++i) {
    staged->dense_tables[i] = spec.dense[i].table;
    CopyInto(spec.dense[i].values, &staged->dense[i]);
  }
  staged->sparse_tables.resize(spec.sparse.size());
  staged->keys.resize(spec.sparse.size());
  staged->sparse.resize(spec.sparse.size());
  for (size_t i = 0; i < spec.sparse.size(); ++i) {
    staged->sparse_tables[i] = spec.sparse[i].table;
    staged->keys[i].assign(spec.sparse[i].keys.begin(), spec.sparse[i].keys.end());
    CopyInto(spec.sparse[i].values, &staged->sparse[i]);
  }
  staged->push = common::PushBatch();
  for (size_t i = 0; i < spec.dense.size(); ++i) {
    staged->push.dense.push_back({staged->dense_tables[i], absl::MakeConstSpan(staged->dense[i])});
  }
  for (size_t i = 0; i < spec.sparse.size(); ++i) {
    staged->push.sparse.push_back({staged->sparse_tables[i], absl::MakeConstSpan(staged->keys[i]),
                                   absl::MakeConstSpan(staged->sparse[i])});
  }
}

}  // namespace

struct Trainer::Metrics {
  explicit Metrics(common::metrics::Registry* r)
      : steps(r->AddCounter("ps_worker_steps_total", "Training steps done by this worker.")),
        samples(r->AddCounter("ps_worker_samples_total", "Training samples processed.")),
        samples_per_second(r->AddGauge(
            "ps_worker_samples_per_second",
            "Training samples per second since the run started, evaluation time excluded.")),
        epoch(r->AddGauge("ps_worker_epoch", "Epoch being trained (1-based).")),
        clock(
            r->AddGauge("ps_worker_clock", "This worker's clock: steps pushed, resumes included.")),
        loss(r->AddGauge("ps_worker_loss", "Training loss of the last step (batch mean).")),
        loss_smoothed(r->AddGauge("ps_worker_loss_smoothed",
                                  "Training loss, exponential moving average (0.98) over steps.")),
        eval(r->AddGaugeFamily("ps_worker_eval_metric",
                               "Last evaluation on the test set: accuracy (classification), auc "
                               "(binary), loss (mean).",
                               {"metric"})) {
    auto* phases = r->AddHistogramFamily(
        "ps_worker_step_phase_seconds",
        "Time of each training step's phases: data (batch assembly), pull, compute (forward "
        "and backward), push, wait (blocked on the overlapped pull and push of "
        "training.prefetch); seconds.",
        {"phase"}, common::metrics::LatencyBuckets());
    for (int p = 0; p < kNumPhases; ++p) phase[p] = phases->WithLabels({kPhaseNames[p]});
  }

  common::metrics::Counter* const steps;
  common::metrics::Counter* const samples;
  common::metrics::Gauge* const samples_per_second;
  common::metrics::Gauge* const epoch;
  common::metrics::Gauge* const clock;
  common::metrics::Gauge* const loss;
  common::metrics::Gauge* const loss_smoothed;
  common::metrics::Family<common::metrics::Gauge>* const eval;
  common::metrics::Histogram* phase[kNumPhases];
};

Trainer::Trainer(Model* model, common::ParameterStore* store, const Dataset* train,
                 const Dataset* test, const TrainerOptions& options,
                 common::metrics::Registry* metrics)
    : model_(model),
      store_(store),
      train_(train),
      test_(test),
      options_(options),
      own_registry_(metrics == nullptr ? std::make_unique<common::metrics::Registry>() : nullptr),
      metrics_(std::make_unique<Metrics>(metrics != nullptr ? metrics : own_registry_.get())) {
  if (!options_.log_path.empty()) {
    log_ = std::fopen(options_.log_path.c_str(), "a");
    if (log_ == nullptr) log_errno_ = errno;
  }
}

Trainer::~Trainer() {
  if (log_ != nullptr) std::fclose(log_);
}

void Trainer::Log(const std::string& json) {
  if (log_ == nullptr) return;
  std::fprintf(log_, "{%s%s%s}\n", options_.log_tag.c_str(), options_.log_tag.empty() ? "" : ",",
               json.c_str());
  std::fflush(log_);
}

void Trainer::Progress(bool force, uint32_t epoch, uint64_t step, double loss) {
  if (options_.progress == nullptr) return;
  const absl::Time now = absl::Now();
  const absl::Duration since = now - last_progress_;
  if (!force && since < (options_.progress_tty ? absl::Milliseconds(200)
                                               : options_.progress_interval)) {
    return;
  }
  last_progress_ = now;
  const double elapsed = absl::ToDoubleSeconds(now - start_);
  const double rate = elapsed > 0 ? samples_ / elapsed : 0;
  std::string eta = "?";
  if (total_steps_estimate_ > 0 && step > 0 && step <= total_steps_estimate_) {
    const double left = elapsed * (total_steps_estimate_ - step) / step;
    eta = absl::StrFormat("%dm%02ds", static_cast<int>(left) / 60, static_cast<int>(left) % 60);
  }
  const std::string line = absl::StrFormat(
      "worker %d  epoch %u/%u  step %d  loss %.4f  %.0f samples/s  ETA %s",
      options_.worker_index, epoch + 1, options_.epochs, step, loss, rate, eta);
  if (options_.progress_tty) {
    std::fprintf(options_.progress, "\r\033[K%s", line.c_str());
  } else {
    std::fprintf(options_.progress, "%s\n", line.c_str());
  }
  std::fflush(options_.progress);
  Log(absl::StrCat("\"type\":\"throughput\",\"worker\":", options_.worker_index,
                   ",\"epoch\":", epoch, ",\"step\":", step, ",\"time_s\":", JsonNumber(elapsed),
                   ",\"samples\":", samples_, ",\"samples_per_s\":", JsonNumber(rate),
                   ",\"loss\":", JsonNumber(loss)));
}

void Trainer::RecordStep(uint32_t epoch, int64_t clock, uint64_t batch_size, double loss,
                         const PhaseTimes& d, absl::Time end, absl::Duration eval_time) {
  Metrics& m = *metrics_;
  for (int p = 0; p < kNumPhases; ++p) {
    if (p == kWait && !options_.prefetch) continue;
    m.phase[p]->Observe(absl::ToDoubleSeconds(d[p]));
  }
  m.steps->Increment();
  m.samples->Increment(batch_size);
  const double training_s = absl::ToDoubleSeconds(end - start_ - eval_time);
  if (training_s > 0) m.samples_per_second->Set(samples_ / training_s);
  m.epoch->Set(epoch + 1);
  m.clock->Set(static_cast<double>(clock));
  m.loss->Set(loss);
  m.loss_smoothed->Set(loss_ema_);
}

absl::StatusOr<EvalMetrics> Trainer::Evaluate(int64_t clock) {
  if (test_ == nullptr) return absl::FailedPreconditionError("no test set");
  EvalAccumulator acc;
  Batch batch;
  std::vector<int64_t> indices;
  const int64_t n = test_->size();
  bool pulled = false;
  for (int64_t begin = 0; begin < n; begin += options_.batch_size) {
    const int64_t end = std::min<int64_t>(n, begin + options_.batch_size);
    indices.resize(end - begin);
    for (int64_t i = begin; i < end; ++i) indices[i - begin] = i;
    test_->FillBatch(indices, &batch);
    common::PullBatch pull;
    RETURN_IF_ERROR(model_->PreparePull(batch, &pull));
    // A pull of whole dense tables is the same for every batch: pulled once, so that the
    // whole test set is scored with one version of the parameters (pulled per batch, under
    // async or SSP other workers' pushes landed between batches), with one wait for the
    // bound. Sparse rows differ per batch and are still pulled with it.
    if (pulled && pull.sparse.empty()) {
      RETURN_IF_ERROR(model_->Evaluate(batch, &acc));
      continue;
    }
    common::PullOptions pull_options;
    pull_options.clock = clock;
    RETURN_IF_ERROR_CTX(store_->Pull(pull, pull_options), "evaluation pull");
    pulled = true;
    RETURN_IF_ERROR(model_->Evaluate(batch, &acc));
  }
  EvalMetrics m;
  m.examples = acc.examples;
  m.loss = acc.examples > 0 ? acc.loss_sum / acc.examples : 0;
  m.accuracy = acc.examples > 0 ? static_cast<double>(acc.correct) / acc.examples : 0;
  if (options_.binary) m.auc = Auc(acc.scores, acc.labels);
  return m;
}

void Trainer::EndStep(uint32_t epoch, uint64_t offset, uint64_t batch_size, double loss,
                      const PhaseTimes& d, RunState* state) {
  TrainResult& result = *state->result;
  ++state->clock;
  ++result.steps;
  samples_ += batch_size;
  result.breakdown.data += d[kData];
  result.breakdown.pull += d[kPull];
  result.breakdown.compute += d[kCompute];
  result.breakdown.push += d[kPush];
  result.breakdown.wait += d[kWait];
  state->loss = loss;
  loss_ema_ = result.steps == 1 ? loss : 0.98 * loss_ema_ + 0.02 * loss;
  RecordStep(epoch, state->clock, batch_size, loss, d, absl::Now(), result.eval_time);
  if (options_.on_step) options_.on_step(epoch, offset);
  Progress(false, epoch, result.steps, loss_ema_);
  if (options_.max_steps > 0 && static_cast<uint64_t>(state->clock) >= options_.max_steps) {
    state->stop = true;
  }
  if (StopRequested()) state->stop = result.stopped = true;
}

bool Trainer::StopRequested() const { return options_.stop_requested && options_.stop_requested(); }

absl::Status Trainer::TrainEpoch(uint32_t epoch, ShardIterator* it, RunState* state) {
  // One round trip per step: the first step pulls on its own; after that each step's push
  // and the next step's pull go out as one PushPull (the pull reads after the push, as a
  // Push then a Pull would). Its time counts as the step's push; the pull phase is then 0.
  Batch batches[2];
  // The gradients, copied when preparing the next pull may change the model's (sparse keys);
  // a model whose pushes survive the next pull (the MLP) sends its own buffers.
  Staged pushed;
  const bool stage_push = !model_->PushSurvivesNextPull();
  std::vector<int64_t> indices;
  absl::Time t0 = absl::Now();
  // A worker resumed at its last step trains none (before 2026-12-06, found in review: one
  // more, past max_steps, where the overlapped loop trained none).
  if (options_.max_steps > 0 && static_cast<uint64_t>(state->clock) >= options_.max_steps) {
    state->stop = true;
  }
  if (state->stop || !it->Next(&indices)) return absl::OkStatus();
  train_->FillBatch(indices, &batches[0]);
  uint64_t offset = it->offset();
  common::PullBatch pull;
  RETURN_IF_ERROR(model_->PreparePull(batches[0], &pull));
  const absl::Time t1 = absl::Now();
  RETURN_IF_ERROR_CTX(store_->Pull(pull, common::PullOptions{state->clock}),
                      absl::StrCat("step ", state->clock + 1, " pull"));
  absl::Duration data = t1 - t0, pulled = absl::Now() - t1;
  LendGradientsOnce();
  for (int cur = 0;; cur = 1 - cur) {
    const absl::Time c0 = absl::Now();
    ASSIGN_OR_RETURN(StepResult step, model_->ForwardBackward(batches[cur]));
    common::PushBatch push;
    RETURN_IF_ERROR(model_->PreparePush(&push));
    const absl::Time c1 = absl::Now();
    const common::PushOptions push_options{state->clock + 1, false};
    const std::string what = absl::StrCat("step ", state->clock + 1, " push");
    const bool has_next =
        (options_.max_steps == 0 || static_cast<uint64_t>(state->clock) + 1 < options_.max_steps) &&
        !StopRequested() && it->Next(&indices);
    absl::Duration next_data;
    uint64_t next_offset = 0;
    absl::Time p0 = c1;
    if (has_next) {
      train_->FillBatch(indices, &batches[1 - cur]);
      next_offset = it->offset();
      if (stage_push) StagePush(push, &pushed);
      common::PullBatch next_pull;
      RETURN_IF_ERROR(model_->PreparePull(batches[1 - cur], &next_pull));
      p0 = absl::Now();
      next_data = p0 - c1;
      RETURN_IF_ERROR_CTX(store_->PushPull(stage_push ? pushed.push : push, push_options,
                                           next_pull, common::PullOptions{state->clock + 1}),
                          what);
    } else {
      RETURN_IF_ERROR_CTX(store_->Push(push, push_options), what);
    }
    const absl::Duration pushed_for = absl::Now() - p0;
    state->result->breakdown.calls += pulled + pushed_for;  // every call blocked the step
    EndStep(epoch, offset, batches[cur].size, step.loss,
            {data, pulled, c1 - c0, pushed_for, absl::ZeroDuration()}, state);
    if (!has_next) break;
    offset = next_offset;
    data = next_data;
    pulled = absl::ZeroDuration();
  }
  return absl::OkStatus();
}

namespace internal {

// The background side of overlapped steps (prefetch): the batches each call reads and fills
// (two of each kind, used by step parity), their staging buffers when the model has only one
// set of buffers, the one thread that runs the store calls in submission order, and the calls'
// summed wall time. Thread-compatible: one step loop drives it.
class Pipeline {
 public:
  explicit Pipeline(common::ParameterStore* store) : store_(store) {}

  common::PullBatch& pull(int slot) { return pulls_[slot]; }
  common::PushBatch& push(int slot) { return pushes_[slot]; }
  Staged& staged_pull(int slot) { return staged_pulls_[slot]; }
  Staged& staged_push(int slot) { return staged_pushes_[slot]; }
  // Queues one store call: push(push_slot) (-1: none) at `push_clock`, and pull(pull_slot)
  // (-1: none) at `pull_clock`. Both at once go out as one PushPull (one round trip per
  // server; its pull reads after its push).
  void Submit(int push_slot, int64_t push_clock, int pull_slot, int64_t pull_clock);
  // Blocks until the call filling pull slot `slot` has run; the first error of any call.
  absl::Status WaitForPull(int slot) { return background_.Wait(pull_ticket_[slot]); }
  absl::Status Drain() { return background_.Drain(); }
  // Wall time of the calls run so far.
  absl::Duration calls() const { return absl::Nanoseconds(calls_ns_.load()); }

 private:
  common::ParameterStore* const store_;  // Not owned.
  common::PullBatch pulls_[2];
  common::PushBatch pushes_[2];
  Staged staged_pulls_[2], staged_pushes_[2];
  uint64_t pull_ticket_[2] = {0, 0};
  std::atomic<int64_t> calls_ns_{0};
  // Declared last: destroyed (joined) before the buffers its calls use.
  SerialExecutor background_;
};

void Pipeline::Submit(int push_slot, int64_t push_clock, int pull_slot, int64_t pull_clock) {
  const common::PushBatch* push = push_slot >= 0 ? &pushes_[push_slot] : nullptr;
  const common::PullBatch* pull = pull_slot >= 0 ? &pulls_[pull_slot] : nullptr;
  // Labels name steps as the step loop does: the pull at clock c is for step c+1.
  std::string label = push != nullptr ? absl::StrCat("step ", push_clock, " push") : "";
  if (pull != nullptr) {
    absl::StrAppend(&label, push != nullptr ? " + " : "", "step ", pull_clock + 1, " pull");
  }
  const uint64_t ticket =
      background_.Submit(std::move(label), [this, push, push_clock, pull, pull_clock] {
        const common::PushOptions push_options{push_clock, false};
        const common::PullOptions pull_options{pull_clock};
        const absl::Time start = absl::Now();
        absl::Status status;
        if (push != nullptr && pull != nullptr) {
          status = store_->PushPull(*push, push_options, *pull, pull_options);
        } else if (push != nullptr) {
          status = store_->Push(*push, push_options);
        } else {
          status = store_->Pull(*pull, pull_options);
        }
        calls_ns_ += absl::ToInt64Nanoseconds(absl::Now() - start);
        return status;
      });
  if (pull != nullptr) pull_ticket_[pull_slot] = ticket;
}

}  // namespace internal

absl::Status Trainer::PreparePrefetch(const Batch& batch, int slot, internal::Pipeline* pipe) {
  common::PullBatch& pull = pipe->pull(slot);
  pull = common::PullBatch();
  RETURN_IF_ERROR(model_->PreparePull(batch, &pull));
  if (!buffer_sets_) {
    // Into buffers of the pipeline's own: the model computes on its buffers meanwhile.
    StagePull(pull, &pipe->staged_pull(slot));
    pull = pipe->staged_pull(slot).pull;
  }
  return absl::OkStatus();
}

absl::Status Trainer::PrepareGradients(int slot, internal::Pipeline* pipe) {
  common::PushBatch& push = pipe->push(slot);
  push = common::PushBatch();
  RETURN_IF_ERROR(model_->PreparePush(&push));
  if (!buffer_sets_) {
    // Copied out: the next step's backward overwrites the model's gradients.
    StagePush(push, &pipe->staged_push(slot));
    push = pipe->staged_push(slot).push;
  }
  return absl::OkStatus();
}

absl::Status Trainer::TrainEpochOverlapped(uint32_t epoch, ShardIterator* it, RunState* state) {
  // Step i of the epoch (from 0) reads batch slot i % 3 (batches are read two steps ahead)
  // and pull and push slot i % 2; the class comment says why reuse is safe.
  Batch batches[3];
  uint64_t offsets[3] = {0, 0, 0};  // the iterator's offset after each batch
  std::vector<int64_t> indices;
  internal::Pipeline pipe(store_);
  const uint64_t before = static_cast<uint64_t>(state->clock);  // steps of this worker so far
  auto fetch = [&](uint64_t i) {  // batch i into its slot; false past the epoch or max_steps
    if ((options_.max_steps > 0 && before + i >= options_.max_steps) || StopRequested() ||
        !it->Next(&indices)) {
      return false;
    }
    train_->FillBatch(indices, &batches[i % 3]);
    offsets[i % 3] = it->offset();
    return true;
  };

  // The data position reported after each step is that of the latest step whose push is
  // applied: step i's call waits behind step i - 2's push (before 2026-12-06, found in review,
  // step i's own was reported as its push was queued, so a push that failed after it, as
  // retries end at SIGTERM, left the servers' position past steps never applied).
  const uint64_t start_offset = it->offset();
  uint64_t step_offsets[4] = {0, 0, 0, 0};  // step i's at i % 4
  absl::Time t0 = absl::Now();
  if (state->stop || !fetch(0)) return absl::OkStatus();
  // The first two steps' pulls go out alone; with two buffer sets, each into its own set.
  RETURN_IF_ERROR(PreparePrefetch(batches[0], 0, &pipe));
  pipe.Submit(-1, 0, 0, state->clock);
  if (buffer_sets_) model_->SwapBufferSets();
  bool has_next = fetch(1);
  if (has_next) {
    RETURN_IF_ERROR(PreparePrefetch(batches[1], 1, &pipe));
    pipe.Submit(-1, 0, 1, state->clock + 1);
  }
  absl::Duration carried = absl::Now() - t0;  // charged to step 0's data
  for (uint64_t i = 0;; ++i) {
    const int slot = static_cast<int>(i % 2);
    const Batch& batch = batches[i % 3];
    t0 = absl::Now();
    RETURN_IF_ERROR(pipe.WaitForPull(slot));
    if (i == 0) LendGradientsOnce();  // (the pull of step 2 may be running: params only)
    const absl::Time t1 = absl::Now();
    RETURN_IF_ERROR(UsePrefetched(batch, pipe.staged_pull(slot)));
    const absl::Time t2 = absl::Now();
    ASSIGN_OR_RETURN(StepResult step, model_->ForwardBackward(batch));
    const absl::Time t3 = absl::Now();
    RETURN_IF_ERROR(PrepareGradients(slot, &pipe));
    const absl::Time t4 = absl::Now();
    const bool has_after_next = has_next && fetch(i + 2);
    const absl::Time t5 = absl::Now();
    // One call, queued behind the one that pulls the next step's parameters and running while
    // the next step computes: this step's gradients out (clock c + 1) and the parameters of
    // the step after next in (clock c + 2), into the buffers this step is done with.
    if (has_after_next) RETURN_IF_ERROR(PreparePrefetch(batches[(i + 2) % 3], slot, &pipe));
    pipe.Submit(slot, state->clock + 1, has_after_next ? slot : -1, state->clock + 2);
    absl::Time t6 = absl::Now();
    absl::Duration wait = t1 - t0;
    if (!has_next) {
      // The end of the epoch (or of the run): every push is applied before anything else.
      RETURN_IF_ERROR(pipe.Drain());
      const absl::Time drained = absl::Now();
      wait += drained - t6;
      t6 = drained;
    }
    // The pull waited for above came with step i - 2's push (calls run in order, and the
    // first error of any sticks): that step's position, or this one's once all are drained.
    step_offsets[i % 4] = offsets[i % 3];
    const uint64_t applied = !has_next ? offsets[i % 3]
                             : i >= 2  ? step_offsets[(i - 2) % 4]
                                       : start_offset;
    EndStep(epoch, applied, batch.size, step.loss,
            {carried + (t5 - t4), (t2 - t1) + (t6 - t5), t3 - t2, t4 - t3, wait}, state);
    carried = absl::ZeroDuration();
    if (!has_next) break;
    has_next = has_after_next;
  }
  state->result->breakdown.calls += pipe.calls();
  return absl::OkStatus();
}

absl::Status Trainer::UsePrefetched(const Batch& batch, const internal::Staged& staged) {
  if (buffer_sets_) {
    // To the set this step's parameters were pulled into (the previous step used the other).
    model_->SwapBufferSets();
    return absl::OkStatus();
  }
  // The model is pointed back at this step's batch and given the values staged for it.
  common::PullBatch spec;
  RETURN_IF_ERROR(model_->PreparePull(batch, &spec));
  return UnstagePull(staged, spec);
}

uint64_t Trainer::EstimateTotalSteps() const {
  const uint64_t per_epoch =
      (train_->size() / std::max(1, options_.num_workers) + options_.batch_size - 1) /
      options_.batch_size;
  uint64_t total =
      per_epoch * (options_.epochs - std::min(options_.epochs, options_.start_epoch));
  if (options_.max_steps > 0) {
    const uint64_t done = static_cast<uint64_t>(std::max<int64_t>(0, options_.start_clock));
    total = std::min<uint64_t>(total, options_.max_steps - std::min(options_.max_steps, done));
  }
  return total;
}

absl::Status Trainer::EvaluateEpoch(uint32_t epoch, RunState* state) {
  TrainResult& result = *state->result;
  const absl::Time eval_start = absl::Now();
  ASSIGN_OR_RETURN(EvalMetrics m, Evaluate(state->clock));
  result.eval_time += absl::Now() - eval_start;
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start_);
  if (options_.progress != nullptr) {
    if (options_.progress_tty) std::fprintf(options_.progress, "\n");
    if (options_.binary) {
      std::fprintf(options_.progress,
                   "worker %d  epoch %u  test AUC %.4f  log-loss %.4f  (%.1f s)\n",
                   options_.worker_index, epoch + 1, m.auc, m.loss, elapsed);
    } else {
      std::fprintf(options_.progress,
                   "worker %d  epoch %u  test accuracy %.4f  loss %.4f  (%.1f s)\n",
                   options_.worker_index, epoch + 1, m.accuracy, m.loss, elapsed);
    }
    std::fflush(options_.progress);
  }
  Log(absl::StrCat("\"type\":\"eval\",\"worker\":", options_.worker_index,
                   ",\"epoch\":", epoch + 1, ",\"step\":", result.steps,
                   ",\"time_s\":", JsonNumber(elapsed), ",\"samples\":", samples_,
                   ",\"examples\":", m.examples, ",\"loss\":", JsonNumber(m.loss),
                   options_.binary ? absl::StrCat(",\"auc\":", JsonNumber(m.auc))
                                   : absl::StrCat(",\"accuracy\":", JsonNumber(m.accuracy))));
  result.final_eval = m;
  metrics_->eval->WithLabels({"loss"})->Set(m.loss);
  const double metric = options_.binary ? m.auc : m.accuracy;
  metrics_->eval->WithLabels({options_.binary ? "auc" : "accuracy"})->Set(metric);
  if (options_.target_metric > 0 && metric >= options_.target_metric) state->stop = true;
  return absl::OkStatus();
}

void Trainer::LendGradientsOnce() {
  if (lend_asked_) return;
  lend_asked_ = true;
  lent_gradients_ = model_->LendGradients(store_);  // in the "done" record
}

void Trainer::LogDone(const TrainResult& result) {
  Log(absl::StrCat(
      "\"type\":\"done\",\"worker\":", options_.worker_index, ",\"steps\":", result.steps,
      ",\"samples\":", result.samples,
      ",\"wall_s\":", JsonNumber(absl::ToDoubleSeconds(result.wall)),
      // When training began (Unix seconds, ms precision) and what evaluation took: a tool
      // puts the workers of a job on one time line (the job's rate: its samples over the time
      // its workers trained, not the sum of each worker's own rate).
      ",\"start_unix_s\":", absl::StrFormat("%.3f", absl::ToUnixMillis(start_) / 1e3),
      ",\"eval_s\":", JsonNumber(absl::ToDoubleSeconds(result.eval_time)),
      ",\"samples_per_s\":", JsonNumber(result.samples_per_s),
      ",\"pull_s\":", JsonNumber(absl::ToDoubleSeconds(result.breakdown.pull)),
      ",\"compute_s\":", JsonNumber(absl::ToDoubleSeconds(result.breakdown.compute)),
      ",\"push_s\":", JsonNumber(absl::ToDoubleSeconds(result.breakdown.push)),
      ",\"data_s\":", JsonNumber(absl::ToDoubleSeconds(result.breakdown.data)),
      ",\"wait_s\":", JsonNumber(absl::ToDoubleSeconds(result.breakdown.wait)),
      ",\"comm_s\":", JsonNumber(absl::ToDoubleSeconds(result.breakdown.calls)),
      ",\"exposed_comm_s\":", JsonNumber(absl::ToDoubleSeconds(result.breakdown.exposed())),
      ",\"prefetch\":", options_.prefetch ? "true" : "false",
      ",\"stopped\":", result.stopped ? "true" : "false",
      ",\"lent_gradients\":", lent_gradients_ ? "true" : "false"));
}

absl::Status Trainer::CheckStartPosition() const {
  // A restarted worker's position is what the servers remember of it (TrainingJob): one past
  // the job's end made it train nothing and exit 0, a clock near 2^63 overflowed.
  const uint64_t shard =
      (train_->size() + std::max(1, options_.num_workers) - 1) / std::max(1, options_.num_workers);
  const uint64_t per_epoch = (shard + options_.batch_size - 1) / options_.batch_size;
  const uint64_t most_steps = uint64_t{options_.epochs} * (per_epoch + 1);
  if (options_.start_epoch > options_.epochs || options_.start_clock < 0 ||
      static_cast<uint64_t>(options_.start_clock) > most_steps) {
    return absl::FailedPreconditionError(
        absl::StrCat("the servers remember this worker at epoch ", options_.start_epoch + 1,
                     ", clock ", options_.start_clock, ", past what this job can reach (",
                     options_.epochs, " epochs of at most ", per_epoch,
                     " steps): a server restored from another job's checkpoint, or training.epochs "
                     "lowered under a running job"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> Trainer::Run() {
  if (!options_.log_path.empty() && log_ == nullptr) {
    // (It was silent before 2026-12-05: a run without the records its tools read.)
    return absl::ErrnoToStatus(
        log_errno_, absl::StrCat("training.log_path ", options_.log_path, ": cannot open"));
  }
  RETURN_IF_ERROR(CheckStartPosition());
  TrainResult result;
  start_ = absl::Now();
  last_progress_ = start_;
  ShardIterator it(train_->size(), options_.worker_index, options_.num_workers,
                   options_.batch_size, options_.shuffle, options_.seed);
  total_steps_estimate_ = EstimateTotalSteps();
  if (options_.prefetch) {
    // Two buffer sets spare the overlapped steps their staging copies, where the model can.
    ASSIGN_OR_RETURN(buffer_sets_, model_->AddSecondBufferSet());
  }
  RunState state;
  state.result = &result;
  state.clock = options_.start_clock;
  for (uint32_t epoch = options_.start_epoch; epoch < options_.epochs && !state.stop; ++epoch) {
    if (epoch == options_.start_epoch && options_.start_offset > 0) {
      RETURN_IF_ERROR(it.Seek(epoch, options_.start_offset));
    } else {
      it.StartEpoch(epoch);
    }
    RETURN_IF_ERROR(options_.prefetch ? TrainEpochOverlapped(epoch, &it, &state)
                                      : TrainEpoch(epoch, &it, &state));
    const bool last = epoch + 1 == options_.epochs || state.stop;
    const bool due = options_.eval_every_epochs > 0 && (epoch + 1) % options_.eval_every_epochs == 0;
    if (options_.evaluate && test_ != nullptr && (due || last) && !result.stopped) {
      RETURN_IF_ERROR(EvaluateEpoch(epoch, &state));
    }
  }
  result.wall = absl::Now() - start_;
  result.samples = samples_;
  // Training throughput: evaluation time does not count.
  result.samples_per_s =
      samples_ / std::max(1e-9, absl::ToDoubleSeconds(result.wall - result.eval_time));
  Progress(true, options_.epochs - 1, result.steps, loss_ema_);
  if (options_.progress_tty && options_.progress != nullptr) {
    std::fprintf(options_.progress, "\n");
  }
  LogDone(result);
  return result;
}

}  // namespace ps::worker
