// ps_bench --modes=tcp: the raw-socket baseline (bench/raw_tcp.h) the gRPC rows compare with.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/ps_bench.h"
#include "bench/raw_tcp.h"
#include "common/status_macros.h"

namespace ps::bench {

absl::StatusOr<std::vector<BenchRow>> RunTcp(BenchEnv* env) {
  ASSIGN_OR_RETURN(auto server, RawTcpServer::Start());
  // One connection always (the gRPC rows' baseline), then each larger --clients count: that
  // many connections at once, each served by its own server thread, so that the gRPC rows
  // with several servers and clients have the same machine's raw aggregate to compare with.
  std::vector<int> counts = {1};
  for (int c : env->flags->clients) {
    if (c > 1) counts.push_back(c);
  }
  std::vector<BenchRow> rows;
  for (uint64_t bytes : env->flags->payloads) {
    const std::string payload(bytes, 'p');
    for (int c : counts) {
      std::vector<std::unique_ptr<RawTcpClient>> clients;
      for (int i = 0; i < c; ++i) {
        ASSIGN_OR_RETURN(auto client, RawTcpClient::Connect(server->port()));
        clients.push_back(std::move(client));
      }
      // The server's threads are this process's: the client's costs per call are both ends'.
      BenchRow usage;
      ASSIGN_OR_RETURN(LoadResult r,
                       RunChecked(*env, c, [&](int t) { return clients[t]->Call(payload); },
                                  absl::StrCat("raw tcp ", FormatBytes(bytes), ", ", c,
                                               " clients"),
                                  &usage));
      rows.push_back(MakeRow("tcp", "req_reply", FormatBytes(bytes), bytes, 0, c, 1, r));
      rows.back().client_per_call = usage.client_per_call;
      env->tcp_mb_per_s[{bytes, c}] = rows.back().mb_per_second;
    }
  }
  const size_t write = env->flags->tcp_stream_write;
  std::vector<double> bandwidths;
  for (int i = 0; i < env->flags->repeat; ++i) {
    ASSIGN_OR_RETURN(double b,
                     MeasureStreamBandwidth(server->port(), write, env->flags->load.duration));
    bandwidths.push_back(b);
  }
  std::sort(bandwidths.begin(), bandwidths.end());
  const double bandwidth = bandwidths[bandwidths.size() / 2];
  BenchRow stream;
  stream.mode = "tcp";
  stream.op = "stream";
  stream.payload = absl::StrCat(FormatBytes(write), " writes");
  stream.payload_bytes = write;
  stream.seconds = absl::ToDoubleSeconds(env->flags->load.duration);
  stream.mb_per_second = bandwidth / (1 << 20);
  rows.push_back(stream);
  return rows;
}

}  // namespace ps::bench
