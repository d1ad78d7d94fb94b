// Rows of a benchmark report, printed as an aligned text table and as JSON lines.
//
// Units: MB = 2^20 bytes (the payload sizes 4 KB, 1 MB, 64 MB are powers of two as well);
// latencies in milliseconds.
#ifndef PS_BENCH_BENCH_REPORT_H_
#define PS_BENCH_BENCH_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps::bench {

// One measurement. Plain data.
struct BenchRow {
  // "grpc" (GrpcParameterStore against ps_server) or "tcp" (the raw-socket baseline).
  std::string mode;
  // "push", "pull" (dense), "sparse_pull", "req_reply", "stream".
  std::string op;
  // Human-readable payload per call: "4KB", "64MB", "10k keys".
  std::string payload;
  // Payload bytes per call (parameter values only, no keys or framing).
  uint64_t payload_bytes = 0;
  // Sparse rows per call; 0 for dense and tcp rows.
  uint64_t rows_per_call = 0;
  int clients = 1;
  int window = 1;
  uint64_t calls = 0;
  double seconds = 0;
  double calls_per_second = 0;
  // payload_bytes * calls_per_second, in MB/s.
  double mb_per_second = 0;
  // rows_per_call * calls_per_second; 0 for dense and tcp rows.
  double rows_per_second = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  // mb_per_second / that of the raw-TCP request/reply with the same payload.
  std::optional<double> vs_tcp;
  // Client retries during the measurement (should be 0 on loopback).
  uint64_t retries = 0;
  // Spill rows: the share of the table's rows the servers may keep in memory (1 = no budget),
  // and the share of pulled rows served from memory (not read back from the spill store).
  std::optional<double> in_memory;
  std::optional<double> hit_ratio;
  // Cost per call over the whole run (warm-up included): CPU microseconds, minor page faults
  // and context switches (voluntary + involuntary) of this (client) process and of the
  // servers together. Unset when not measured (tcp rows, --connect servers).
  struct Usage {
    double cpu_us = 0;
    double minor_faults = 0;
    double context_switches = 0;
  };
  std::optional<Usage> client_per_call;
  std::optional<Usage> server_per_call;
};

// "4KB", "1MB", "64MB", "1.5MB", "100B".
std::string FormatBytes(uint64_t bytes);

// A size flag's value: "4KB" (or 4K), "1MB" (1M), "100B" (100), case-insensitive, 1 B ..
// `max` bytes; INVALID_ARGUMENT naming --`flag` otherwise.
absl::StatusOr<uint64_t> ParseSize(absl::string_view flag, absl::string_view text, uint64_t max);

// The rows as an aligned table with a header line.
std::string FormatTable(const std::vector<BenchRow>& rows);

// One JSON object (no trailing newline) with every field of `row`; vs_tcp is null when unset.
std::string ToJsonLine(const BenchRow& row);

}  // namespace ps::bench

#endif  // PS_BENCH_BENCH_REPORT_H_
