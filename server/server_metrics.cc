#include "server/server_metrics.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::server {
namespace {

using common::metrics::CollectedFamily;
using common::metrics::MetricType;
using common::metrics::Sample;

// Appends a family and returns it, for samples to be added.
CollectedFamily* Add(std::vector<CollectedFamily>* out, const char* name, const char* help,
                     MetricType type, std::vector<std::string> label_names = {}) {
  CollectedFamily& f = out->emplace_back();
  f.name = name;
  f.help = help;
  f.type = type;
  f.label_names = std::move(label_names);
  return &f;
}

void AddOne(std::vector<CollectedFamily>* out, const char* name, const char* help, MetricType type,
            double value) {
  Add(out, name, help, type)->samples.push_back(Sample{{}, value});
}

void AppendTables(const StatsResponse& stats, std::vector<CollectedFamily>* out) {
  out->reserve(out->size() + 4);  // the pointers below stay valid while the others are added
  CollectedFamily* rows =
      Add(out, "ps_server_table_rows",
          "Rows this server holds per table (dense: blocks; sparse: rows, in memory and on disk).",
          MetricType::kGauge, {"table", "kind"});
  CollectedFamily* in_memory =
      Add(out, "ps_server_table_rows_in_memory", "Rows of each table held in memory.",
          MetricType::kGauge, {"table"});
  CollectedFamily* bytes = Add(out, "ps_server_table_bytes",
                               "Memory of each table's part on this server (values and "
                               "optimizer slots), bytes.",
                               MetricType::kGauge, {"table"});
  CollectedFamily* updates =
      Add(out, "ps_server_table_updates_applied_total",
          "Updates applied to each table's part on this server.", MetricType::kCounter, {"table"});
  for (const TableStats& t : stats.tables()) {
    const std::string kind = t.kind() == TABLE_KIND_SPARSE ? "sparse" : "dense";
    rows->samples.push_back(Sample{{t.name(), kind}, static_cast<double>(t.rows())});
    in_memory->samples.push_back(Sample{{t.name()}, static_cast<double>(t.rows_in_memory())});
    bytes->samples.push_back(Sample{{t.name()}, static_cast<double>(t.bytes())});
    updates->samples.push_back(Sample{{t.name()}, static_cast<double>(t.updates_applied())});
  }
}

void AppendWorkers(const StatsResponse& stats, std::vector<CollectedFamily>* out) {
  out->reserve(out->size() + 4);  // the pointers below stay valid while the others are added
  CollectedFamily* clock = Add(out, "ps_server_worker_clock",
                               "Each worker's clock (steps pushed) as this server saw it.",
                               MetricType::kGauge, {"worker"});
  CollectedFamily* staleness =
      Add(out, "ps_server_worker_staleness",
          "Clocks each worker is behind the fastest live worker (0 for the fastest).",
          MetricType::kGauge, {"worker"});
  CollectedFamily* live = Add(out, "ps_server_worker_live",
                              "1 while a worker is live (heard from within its lease and not "
                              "finished), else 0.",
                              MetricType::kGauge, {"worker"});
  CollectedFamily* since =
      Add(out, "ps_server_worker_seconds_since_seen",
          "Seconds since each worker was last heard from.", MetricType::kGauge, {"worker"});
  int64_t fastest = std::numeric_limits<int64_t>::min();
  for (const WorkerClock& w : stats.worker_clocks()) {
    if (w.live()) fastest = std::max(fastest, w.clock());
  }
  for (const WorkerClock& w : stats.worker_clocks()) {
    const std::string id = absl::StrCat(w.worker_id());
    clock->samples.push_back(Sample{{id}, static_cast<double>(w.clock())});
    const int64_t behind = fastest == std::numeric_limits<int64_t>::min()
                               ? 0
                               : std::max<int64_t>(0, fastest - w.clock());
    staleness->samples.push_back(Sample{{id}, static_cast<double>(behind)});
    live->samples.push_back(Sample{{id}, w.live() ? 1.0 : 0.0});
    since->samples.push_back(Sample{{id}, w.seconds_since_seen()});
  }
  AddOne(out, "ps_server_max_staleness_seen",
         "Largest gap between the fastest and slowest live worker's clocks a pull has seen.",
         MetricType::kGauge, static_cast<double>(stats.max_staleness_seen()));
}

void AppendCheckpoints(const StatsResponse& stats, std::vector<CollectedFamily>* out) {
  AddOne(out, "ps_server_last_checkpoint_id",
         "Id of the newest checkpoint written or restored (0 = none).", MetricType::kGauge,
         static_cast<double>(stats.last_checkpoint_id()));
  CollectedFamily* age = Add(out, "ps_server_last_checkpoint_age_seconds",
                             "Seconds since the newest checkpoint was written (absent while "
                             "there is none).",
                             MetricType::kGauge);
  if (stats.last_checkpoint_id() != 0)
    age->samples.push_back(Sample{{}, stats.last_checkpoint_age_s()});
  AddOne(out, "ps_server_last_checkpoint_duration_seconds",
         "How long the last checkpoint this process wrote took, seconds.", MetricType::kGauge,
         stats.last_checkpoint_duration_s());
  AddOne(out, "ps_server_checkpoints_written_total", "Checkpoints written by this process.",
         MetricType::kCounter, static_cast<double>(stats.checkpoints_written()));
  AddOne(out, "ps_server_checkpoints_failed_total",
         "Checkpoints that failed in this process (training goes on).", MetricType::kCounter,
         static_cast<double>(stats.checkpoints_failed()));
  AddOne(out, "ps_server_rocksdb_size_bytes",
         "Size of the checkpoint database (live SST files and memtables), bytes.",
         MetricType::kGauge, static_cast<double>(stats.storage_bytes()));
}

}  // namespace

void AppendStatsFamilies(const StatsResponse& stats, bool checkpoints,
                         std::vector<CollectedFamily>* out) {
  Add(out, "ps_server_info", "Constant 1, labelled with the server's index and incarnation.",
      MetricType::kGauge, {"server_index", "incarnation"})
      ->samples.push_back(Sample{
          {absl::StrCat(stats.server_index()), absl::StrCat(stats.server_incarnation())}, 1});
  AddOne(out, "ps_server_incarnation",
         "This process's incarnation (start time, ns since the Unix epoch); it changes on "
         "every restart.",
         MetricType::kGauge, static_cast<double>(stats.server_incarnation()));
  AddOne(out, "ps_server_uptime_seconds", "Seconds since this server process started.",
         MetricType::kGauge, stats.uptime_s());
  AddOne(out, "ps_server_pulls_total", "Pulls served.", MetricType::kCounter,
         static_cast<double>(stats.pulls()));
  AddOne(out, "ps_server_pushes_total", "Pushes applied (duplicates not included).",
         MetricType::kCounter, static_cast<double>(stats.pushes()));
  AddOne(out, "ps_server_updates_applied_total",
         "Updates (pushes) applied to this server's tables since the job started; restored "
         "from checkpoints.",
         MetricType::kCounter, static_cast<double>(stats.updates_applied()));
  CollectedFamily* phases =
      Add(out, "ps_server_data_path_seconds_total",
          "Seconds spent checking pushes, applying them and reading pulls' values out of the "
          "tables, summed over calls (the rest of a call's latency is transport and waiting).",
          MetricType::kCounter, {"phase"});
  phases->samples.push_back(Sample{{"push_check"}, stats.push_check_s()});
  phases->samples.push_back(Sample{{"push_apply"}, stats.push_apply_s()});
  phases->samples.push_back(Sample{{"pull_read"}, stats.pull_read_s()});
  AddOne(out, "ps_server_push_duplicates_total",
         "Pushes answered as duplicates (a retried push already applied) and not applied again.",
         MetricType::kCounter, static_cast<double>(stats.duplicate_pushes()));
  auto nonfinite = stats.rejected().find("nonfinite_values");
  AddOne(out, "ps_server_nonfinite_values_total",
         "NaN and Inf gradient values received (refused or not, see server.reject_nonfinite).",
         MetricType::kCounter,
         nonfinite == stats.rejected().end() ? 0.0 : static_cast<double>(nonfinite->second));
  AppendTables(stats, out);
  AppendWorkers(stats, out);
  if (checkpoints) AppendCheckpoints(stats, out);
}

common::metrics::CollectorHandle RegisterServerStats(common::metrics::Registry* registry,
                                                     std::function<void(StatsResponse*)> fill,
                                                     bool checkpoints) {
  return registry->AddCollector(
      [fill = std::move(fill), checkpoints](std::vector<CollectedFamily>* out) {
        StatsResponse stats;
        fill(&stats);
        AppendStatsFamilies(stats, checkpoints, out);
      });
}

}  // namespace ps::server
