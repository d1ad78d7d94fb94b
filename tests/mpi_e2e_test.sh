#!/bin/bash
# End to end under Open MPI: `mpirun -n 4 tools/mpi/ps_rank.sh` runs 2 servers + 2 workers
# (--cluster_from=mpi, meeting in a rendezvous directory) training the Fashion-MNIST MLP for one
# epoch; mpirun must exit 0, every rank must take its identity from MPI, the servers must have
# published their addresses, and the test accuracy must be at least 0.75 (one epoch of this
# asynchronous job reads 0.84-0.85 alone, and read 0.797 once beside a loaded test run).
#
# Skips (exit 0, saying why) when mpirun is missing and cannot be installed (root only), or
# when the dataset-fashion-mnist package is not installed.
set -uo pipefail

skip() {
  echo "SKIPPED: $*"
  exit 0
}
fail() {
  echo "FAILED: $*"
  exit 1
}

[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  skip "dataset-fashion-mnist is not installed"
if ! command -v mpirun >/dev/null; then
  [ "$(id -u)" = 0 ] || skip "mpirun is not installed (openmpi-bin) and only root can install it"
  echo "installing openmpi-bin"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -qq --no-install-recommends openmpi-bin ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends openmpi-bin; }; } \
    >/dev/null 2>&1 || skip "mpirun is not installed and openmpi-bin cannot be installed"
fi

runfiles="${TEST_SRCDIR:?}/${TEST_WORKSPACE:?}"
dir=$(mktemp -d /tmp/ps-mpi-e2e.XXXXXX) || fail "mktemp"
trap 'rm -rf "$dir"' EXIT
# Open MPI keeps its session directory (with Unix sockets) under TMPDIR: keep the path short.
export TMPDIR="$dir"
root_flag=()
[ "$(id -u)" != 0 ] || root_flag=(--allow-run-as-root)

start=$(date +%s)
timeout 600 mpirun "${root_flag[@]}" --oversubscribe -n 4 --tag-output \
  "$runfiles/tools/mpi/ps_rank.sh" "--rendezvous_dir=$dir/rendezvous" "--bin_dir=$runfiles" \
  "--config=$runfiles/configs/fashion_mnist_2x2_async.textproto" "--data_root=$dir/data" \
  --set=training.epochs=1,training.progress_interval_s=5 --server_arg=--host=127.0.0.1 \
  >"$dir/mpirun.out" 2>&1
rc=$?
out="$dir/mpirun.out"
echo "mpirun: exit $rc after $(($(date +%s) - start)) s"
echo "---- mpirun output (log lines left out)"
grep -v -E '>:[IW][0-9]{8} ' "$out"
echo "---- identities"
grep -E 'MPI rank [0-9]' "$out"
echo "----"
[ "$rc" = 0 ] || fail "mpirun exited $rc"
[ "$(grep -c -E 'MPI rank [0-9] of 4' "$out")" = 4 ] || fail "not every rank took its identity from MPI"
published=$(cat "$dir"/rendezvous/*/server-0 "$dir"/rendezvous/*/server-1 2>/dev/null | tr '\n' ' ')
[[ $published =~ ^127\.0\.0\.1:[0-9]+\ 127\.0\.0\.1:[0-9]+\ $ ]] ||
  fail "the servers did not publish their addresses (found: '$published')"
acc=$(sed -n 's/^.*<stdout>:final test accuracy \([0-9.]*\)$/\1/p' "$out" | head -1)
[ -n "$acc" ] || fail "no 'final test accuracy' in the output"
python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.75 else 1)" ||
  fail "test accuracy $acc < 0.75"
echo "PASSED: mpirun with 2 servers + 2 workers, servers at $published test accuracy $acc"
