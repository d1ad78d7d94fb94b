// handoff_probe: what it costs on this host to hand a buffer from one core to another, with
// plain and with non-temporal stores (common/stream_copy.h, common/rpc/handoff_chooser.h).
//
//   bazel build //bench:handoff_probe && bazel-bin/bench/handoff_probe [--sizes=64KB,1MB]
//       [--cpus=0,1] [--seconds=1] [--rounds=3]
//
// Two threads take turns on one buffer, as a worker and a server take turns on a region of
// their shared memory: the writer copies a source buffer into it (memcpy, or common::StreamCopy),
// the reader sums it; a round is one write and one read. Prints microseconds per round for
// each size and way, --rounds times each, the ways alternated so that both see the same host.
// --cpus pins the writer and the reader (the same cpu twice: they take turns on one core);
// unpinned, the scheduler places them. On a host whose cores do not all share a cache (two
// dies, or a VM whose vCPUs the host moves between dies) the plain rounds vary with where the
// two threads run; the streamed ones go through memory either way.
#include <sched.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_report.h"
#include "common/stream_copy.h"

ABSL_FLAG(std::string, sizes, "16KB,64KB,256KB,1MB,4MB,16MB",
          "Buffer sizes (B, KB or MB; multiples of 64 bytes, at most 1024 MB).");
ABSL_FLAG(std::string, cpus, "", "writer,reader cpus to pin to (empty: not pinned).");
ABSL_FLAG(double, seconds, 1.0, "Seconds per measurement.");
ABSL_FLAG(int, rounds, 3, "Measurements per size and way.");

namespace {

void Pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) std::perror("sched_setaffinity");
}

// Microseconds per round of `n` bytes, written with streamed stores or plain ones.
double Measure(size_t n, bool stream, int writer_cpu, int reader_cpu, double seconds) {
  std::vector<uint64_t> source(n / 8, 0x0101010101010101u), buffer(n / 8, 0);
  std::atomic<int> turn{0};  // 0: the writer's, 1: the reader's, 2: stop
  std::atomic<uint64_t> sink{0};
  std::thread reader([&] {
    Pin(reader_cpu);
    for (;;) {
      int t;
      while ((t = turn.load(std::memory_order_acquire)) == 0) sched_yield();
      if (t == 2) return;
      uint64_t sum = 0;
      for (uint64_t v : buffer) sum += v;
      sink.fetch_add(sum, std::memory_order_relaxed);
      turn.store(0, std::memory_order_release);
    }
  });
  Pin(writer_cpu);
  const absl::Time start = absl::Now();
  int64_t rounds = 0;
  while (absl::Now() - start < absl::Seconds(seconds)) {
    while (turn.load(std::memory_order_acquire) != 0) sched_yield();
    if (stream) {
      ps::common::StreamCopy(buffer.data(), source.data(), n);
    } else {
      std::memcpy(buffer.data(), source.data(), n);
    }
    turn.store(1, std::memory_order_release);
    ++rounds;
  }
  while (turn.load(std::memory_order_acquire) != 0) sched_yield();
  const double us = absl::ToDoubleMicroseconds(absl::Now() - start) / static_cast<double>(rounds);
  turn.store(2, std::memory_order_release);
  reader.join();
  if (sink.load() == 0) std::printf("(nothing read)\n");
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  int writer_cpu = -1, reader_cpu = -1;
  if (const std::string cpus = absl::GetFlag(FLAGS_cpus); !cpus.empty()) {
    std::vector<std::string> parts = absl::StrSplit(cpus, ',');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &writer_cpu) ||
        !absl::SimpleAtoi(parts[1], &reader_cpu) || writer_cpu < 0 || reader_cpu < 0) {
      std::fprintf(stderr, "--cpus wants two cpu numbers, writer,reader\n");
      return 2;
    }
  }
  if (absl::GetFlag(FLAGS_rounds) < 1 || absl::GetFlag(FLAGS_rounds) > 1000) {
    std::fprintf(stderr, "--rounds=%d: expected 1..1000\n", absl::GetFlag(FLAGS_rounds));
    return 2;
  }
  if (!(absl::GetFlag(FLAGS_seconds) > 0) || absl::GetFlag(FLAGS_seconds) > 600) {
    std::fprintf(stderr, "--seconds=%g: expected more than 0, at most 600\n",
                 absl::GetFlag(FLAGS_seconds));
    return 2;
  }
  std::vector<std::pair<std::string, uint64_t>> sizes;
  for (const std::string& s :
       std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_sizes), ','))) {
    absl::StatusOr<uint64_t> n = ps::bench::ParseSize("sizes", s, uint64_t{1} << 30);
    if (!n.ok() || *n % 64 != 0) {
      const std::string error = n.ok() ? "--sizes: " + s + " is not a multiple of 64 bytes"
                                       : std::string(n.status().message());
      std::fprintf(stderr, "%s\n", error.c_str());
      return 2;
    }
    sizes.emplace_back(s, *n);
  }
  std::printf("%-8s %-8s  us per round (write + read), %d measurements of %.1f s\n", "size", "way",
              absl::GetFlag(FLAGS_rounds), absl::GetFlag(FLAGS_seconds));
  for (const auto& [s, n] : sizes) {
    std::vector<double> us[2];
    for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
      for (const bool stream : {false, true}) {
        us[stream].push_back(
            Measure(n, stream, writer_cpu, reader_cpu, absl::GetFlag(FLAGS_seconds)));
      }
    }
    for (const bool stream : {false, true}) {
      std::printf("%-8s %-8s ", s.c_str(), stream ? "streamed" : "plain");
      for (double u : us[stream]) std::printf(" %9.1f", u);
      std::printf("\n");
    }
  }
  return 0;
}
