// The ps_server_ metric families read at scrape time from a Stats snapshot: the same facts
// `psctl status` shows (tables, workers, totals, checkpoints), so they cost nothing on the
// request path. The request metrics (latencies, bytes, refusals) live in the service
// (server/rpc/service.h); ps_server_up is set by the binary.
#ifndef PS_SERVER_SERVER_METRICS_H_
#define PS_SERVER_SERVER_METRICS_H_

#include <functional>
#include <vector>

#include "common/metrics/metrics.h"
#include "proto/ps.pb.h"

namespace ps::server {

// Registers a collector that calls `fill` once per scrape (on the metrics thread) and
// exports what it filled. `fill` is typically Shard::FillStats followed by
// Checkpointer::FillStats; it must be thread-safe. With `checkpoints` false (a server
// without a data dir) the checkpoint families are left out.
common::metrics::CollectorHandle RegisterServerStats(common::metrics::Registry* registry,
                                                     std::function<void(StatsResponse*)> fill,
                                                     bool checkpoints);

// The families of one snapshot (what the collector appends; exposed for tests).
void AppendStatsFamilies(const StatsResponse& stats, bool checkpoints,
                         std::vector<common::metrics::CollectedFamily>* out);

}  // namespace ps::server

#endif  // PS_SERVER_SERVER_METRICS_H_
