#!/bin/bash
# Builds the libFuzzer targets of fuzz/ with clang (-fsanitize=fuzzer,address,undefined) and
# runs each for SECONDS, starting from its seed corpus fuzz/corpus/<name>/.
#
#   bash tools/fuzz.sh [SECONDS] [--merge] [--regen-corpus] [FUZZER...]
#
#   SECONDS         run time per fuzzer (default 30).
#   FUZZER          pull_push_fuzzer, checkpoint_fuzzer, frame_fuzzer, answer_fuzzer,
#                   channel_answer_fuzzer (default: all).
#   --merge         afterwards, merge the inputs that added coverage into fuzz/corpus/<name>/
#                   (libFuzzer -merge=1). Without it the repository's corpus is not modified:
#                   each run fuzzes a copy in a temporary directory.
#   PS_FUZZ_WORKDIR=DIR  keep the corpora that were fuzzed and the logs in DIR.
#   --regen-corpus  rewrite the seeds that the fuzzers generate themselves (PS_FUZZ_WRITE_SEEDS)
#                   into fuzz/corpus/<name>/, then fuzz as usual.
#
# Prints libFuzzer's final line per fuzzer (runs, cov, ft, exec/s). Exits non-zero if a fuzzer
# found a crash, a sanitizer report, a leak, an out-of-memory or a timeout; the input that did
# it is kept under $PS_FUZZ_ARTIFACTS (default /tmp/ps-fuzz-artifacts/<fuzzer>/) and the
# command to reproduce it is printed.
#
# Why a separate Bazel output base: the project's toolchain is Bazel's auto-configured gcc, and
# libFuzzer needs clang. Bazel 4 configures its C++ toolchain from --repo_env=CC, so the clang
# build lives in its own output base (one per workspace, under ~/.cache/ps-fuzz-bazel/) and
# never invalidates the main gcc build. --symlink_prefix=/ keeps it from repointing the
# workspace's bazel-bin/bazel-testlogs links.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=30
merge=0
regen=0
fuzzers=()
for arg in "$@"; do
  case "$arg" in
    --merge) merge=1 ;;
    --regen-corpus) regen=1 ;;
    [0-9]*) seconds="$arg" ;;
    -*) echo "fuzz: unknown option $arg" >&2; exit 2 ;;
    *) fuzzers+=("$arg") ;;
  esac
done
# Each fuzzer's package.
declare -A package=(
  [pull_push_fuzzer]=fuzz [checkpoint_fuzzer]=fuzz [frame_fuzzer]=fuzz/rpc [answer_fuzzer]=fuzz/rpc
  [channel_answer_fuzzer]=fuzz/rpc
)
((${#fuzzers[@]})) || fuzzers=(pull_push_fuzzer checkpoint_fuzzer frame_fuzzer answer_fuzzer
  channel_answer_fuzzer)
for f in "${fuzzers[@]}"; do
  [ -n "${package[$f]:-}" ] || { echo "fuzz: unknown fuzzer $f" >&2; exit 2; }
done

# Like the CUDA variant in .ci/run: a machine without the tool skips the step, loudly.
if ! command -v clang >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a \
    >/dev/null 2>&1; then
  echo "fuzz: SKIPPED: clang with its libFuzzer runtime is not installed (apt-get install clang)"
  exit 0
fi

workspace_hash=$(pwd -P | md5sum | cut -c1-12)
output_base="${PS_FUZZ_OUTPUT_BASE:-$HOME/.cache/ps-fuzz-bazel/$workspace_hash}"
bazel_flags=(
  --repo_env=CC=clang --repo_env=CXX=clang++
  --symlink_prefix=/
  # Optimized (the .bazelrc default) but with DCHECKs and asserts on: a DCHECK a peer can trip
  # is a bug the fuzzer should report.
  --copt=-UNDEBUG
  --copt=-fsanitize=fuzzer-no-link,address,undefined --copt=-fno-omit-frame-pointer
  --copt=-gline-tables-only
  # Bazel links with the C driver (clang), which leaves out the C++ parts of the UBSan runtime.
  --linkopt=-fsanitize=address,undefined --linkopt=-fsanitize-link-c++-runtime
)
targets=()
for f in "${fuzzers[@]}"; do targets+=("//${package[$f]}:$f"); done

echo "fuzz: building ${fuzzers[*]} with clang (output base $output_base)"
start=$(date +%s)
CC=clang CXX=clang++ bazel --output_base="$output_base" --max_idle_secs=900 build "${bazel_flags[@]}" "${targets[@]}"
bin_dir=$(bazel --output_base="$output_base" --max_idle_secs=900 info "${bazel_flags[@]}" bazel-bin 2>/dev/null)
echo "fuzz: build took $(($(date +%s) - start)) s"

# The corpora being fuzzed, logs and RocksDB scratch directories. PS_FUZZ_WORKDIR keeps them
# (to look at what a long run found); by default they go with the run.
if [ -n "${PS_FUZZ_WORKDIR:-}" ]; then
  tmp="$PS_FUZZ_WORKDIR"
  mkdir -p "$tmp"
else
  tmp=$(mktemp -d /tmp/ps-fuzz.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
fi
artifacts_root="${PS_FUZZ_ARTIFACTS:-/tmp/ps-fuzz-artifacts}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:symbolize=1}"
export TMPDIR="$tmp"  # checkpoint_fuzzer's RocksDB directories

failed=0
summary=()
for f in "${fuzzers[@]}"; do
  bin="$bin_dir/${package[$f]}/$f"
  seeds="fuzz/corpus/$f"
  mkdir -p "$seeds"
  if ((regen)); then
    PS_FUZZ_WRITE_SEEDS="$seeds" "$bin" >/dev/null 2>&1
    echo "fuzz: $f: wrote seeds to $seeds"
  fi
  corpus="$tmp/corpus-$f"
  mkdir -p "$corpus"
  cp -r "$seeds/." "$corpus/"
  artifacts="$artifacts_root/$f"
  mkdir -p "$artifacts"
  log="$tmp/$f.log"
  echo "fuzz: running $f for ${seconds}s"
  rc=0
  "$bin" "$corpus" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30 -max_len=4096 \
      -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1 || rc=$?
  # The last status line: "#<runs> DONE cov: N ft: N corp: N/Nb ... exec/s: N rss: NMb".
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\) .*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\) .*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
  line="$f: ${runs:-?} runs in ${seconds}s, ${rate:-?} exec/s, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}"
  if ((rc != 0)); then
    failed=1
    line="$line: FAILED (exit $rc)"
    echo "fuzz: $f failed; the end of its log:" >&2
    tail -60 "$log" >&2
    cp "$log" "$artifacts/last.log"
    for crash in "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/oom-* "$artifacts"/timeout-*; do
      [ -e "$crash" ] && echo "fuzz: reproduce with: $bin $crash" >&2
    done
  fi
  summary+=("$line")
  if ((merge)); then
    "$bin" -merge=1 "$seeds" "$corpus" >"$tmp/$f.merge.log" 2>&1
    echo "fuzz: $f: merged new inputs into $seeds ($(ls "$seeds" | wc -l) files)"
  fi
done
echo "fuzz: results"
printf '  %s\n' "${summary[@]}"
exit $failed
