#!/bin/bash
# End to end under SLURM: starts a one-host SLURM cluster (tools/slurm/local_cluster.sh: two
# "nodes", 127.0.0.1 and 127.0.0.2), submits tools/slurm/ps_job.sbatch with `sbatch --wait -n 4`
# (2 servers + 2 workers, cluster from the allocation) training the Fashion-MNIST MLP for one
# epoch, and checks that the job exited 0, that every task took its identity from SLURM, and
# that the test accuracy is at least 0.75 (one epoch reaches about 0.84; asynchronous, it read
# 0.797 once under the MPI launcher beside a loaded test run). Stops the cluster
# and removes its files however the test ends.
#
# Skips (exit 0, saying why) when not root (slurmd must be), when slurm-wlm/munge are missing
# and cannot be installed, or when the dataset-fashion-mnist package is not installed.
set -uo pipefail
# The daemons live in /usr/sbin, which a test's or a job's PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

skip() {
  echo "SKIPPED: $*"
  exit 0
}
fail() {
  echo "FAILED: $*"
  exit 1
}

[ "$(id -u)" = 0 ] || skip "not root (slurmd and munged run as root)"
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  skip "dataset-fashion-mnist is not installed"
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
  ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  echo "installing slurm-wlm and munge"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -qq --no-install-recommends slurm-wlm munge ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge; }; } \
    >/dev/null 2>&1 || skip "slurm-wlm/munge are not installed and cannot be installed"
fi

runfiles="${TEST_SRCDIR:?}/${TEST_WORKSPACE:?}"
# Short: munged's Unix socket lives in here.
dir=$(mktemp -d /tmp/ps-slurm-e2e.XXXXXX) || fail "mktemp"
chmod 755 "$dir"  # munged wants every directory above its socket world-executable
export PS_SLURM_DIR="$dir/slurm"
cleanup() {
  bash "$runfiles/tools/slurm/local_cluster.sh" stop || echo "WARNING: the SLURM cluster did not stop cleanly"
  rm -rf "$dir"
}
trap cleanup EXIT

bash "$runfiles/tools/slurm/local_cluster.sh" start || fail "the local SLURM cluster did not start"
source "$PS_SLURM_DIR/env.sh"
sinfo -N

mkdir -p "$dir/job"
cd "$dir/job" || fail "cd"
start=$(date +%s)
timeout 600 sbatch --wait -n 4 -o job-%j.out "$runfiles/tools/slurm/ps_job.sbatch" \
  "--config=$runfiles/configs/fashion_mnist_2x2_async.textproto" "--bin_dir=$runfiles" \
  "--data_root=$dir/data" --set=training.epochs=1,training.progress_interval_s=5
rc=$?
echo "sbatch --wait: exit $rc after $(($(date +%s) - start)) s"
out=$(ls job-*.out 2>/dev/null | head -1)
[ -n "$out" ] || fail "the job wrote no output"
echo "---- $out (log lines left out)"
grep -v -E '^[0-9]+: [IW][0-9]{8} ' "$out"
echo "---- identities"
grep -E 'SLURM task [0-9]' "$out"
echo "----"
[ "$rc" = 0 ] || fail "the job exited $rc"
[ "$(grep -c -E 'SLURM task [0-9]+ of 4 on node 127\.0\.0\.[12] ' "$out")" = 4 ] ||
  fail "not every task took its identity from SLURM"
grep -q -E '^[0-9]+: ps_server 1 listening on 0\.0\.0\.0:[0-9]+' "$out" || fail "server 1 did not listen"
acc=$(sed -n 's/^[0-9]*: final test accuracy \([0-9.]*\)$/\1/p' "$out" | head -1)
[ -n "$acc" ] || fail "no 'final test accuracy' in the output"
python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.75 else 1)" ||
  fail "test accuracy $acc < 0.75"
[ -d "$dir/data/server-0" ] && [ -d "$dir/data/server-1" ] || fail "no server data dirs"
echo "PASSED: SLURM job of 2 servers + 2 workers, test accuracy $acc"
