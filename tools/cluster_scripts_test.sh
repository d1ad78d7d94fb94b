#!/bin/bash
# The cluster scripts' argument handling, with fake binaries and a fake srun (no MPI, no SLURM):
# repeated --set flags all reach the processes (only the last did before 2026-12-05: the
# binaries read one --set flag), a --set among --server_arg/--worker_arg (--set=V or the two
# words --set V) joins that one flag, and the server count goes to the binaries as
# cluster.num_servers (SLURM and MPI give them only the number of tasks).
set -uo pipefail
fail() {
  echo "FAILED: $*"
  exit 1
}
here="${TEST_SRCDIR:?}/${TEST_WORKSPACE:?}/tools"
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/cluster-scripts.XXXXXX") || fail "mktemp"
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/bin/server" "$dir/bin/worker" "$dir/path"
for b in server/ps_server worker/ps_worker; do
  printf '#!/bin/bash\necho "%s $*"\n' "$b" >"$dir/bin/$b"
  chmod +x "$dir/bin/$b"
done
# Asked for the config as it runs (--print_config), the fake server answers the JSON form of
# what the file and the --set flag say of the server count, as ps_server does.
cat >"$dir/bin/server/ps_server" <<'FAKE'
#!/bin/bash
if [[ " $* " == *" --print_config "* ]]; then
  n=""
  for a in "$@"; do
    case "$a" in
      --config=*) n=$(sed -n 's/.*num_servers: \([0-9]*\).*/\1/p' "${a#--config=}") ;;
      --set=*) [[ $a =~ cluster\.num_servers=([0-9]+) ]] && n=${BASH_REMATCH[1]} ;;
    esac
  done
  echo "{\"cluster\":{\"servers\":[],\"num_servers\":${n:-0},\"num_workers\":1}}"
  exit 0
fi
echo "server/ps_server $*"
FAKE
printf 'cluster { num_servers: 1 num_workers: 1 }\n' >"$dir/job.textproto"

# Open MPI: rank 1 of 2 is the worker.
out=$(OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 bash "$here/mpi/ps_rank.sh" \
  "--config=$dir/job.textproto" "--rendezvous_dir=$dir/r" "--bin_dir=$dir/bin" \
  --set=training.epochs=1 --set=training.seed=7) || fail "ps_rank.sh: $out"
echo "ps_rank.sh: $out"
[[ $out == *"--set=training.epochs=1,training.seed=7,cluster.num_servers=1" ]] || fail "ps_rank.sh passed: $out"

# Rank 0 of 3 is a server; the count comes from --set (the file says 1), the --set among the
# --server_arg flags joins the one --set flag.
out=$(OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=3 bash "$here/mpi/ps_rank.sh" \
  "--config=$dir/job.textproto" "--rendezvous_dir=$dir/r" "--bin_dir=$dir/bin" \
  --set=cluster.num_servers=2 --server_arg=--set=server.data_threads=2 --server_arg=--host=h) ||
  fail "ps_rank.sh: $out"
echo "ps_rank.sh: $out"
[ "$out" = "server/ps_server --cluster_from=mpi --config=$dir/job.textproto --rendezvous_dir=$dir/r --set=cluster.num_servers=2,server.data_threads=2,cluster.num_servers=2 --host=h" ] ||
  fail "ps_rank.sh passed: $out"
# The two-word form (--server_arg=--set --server_arg=V) joins it too: passed on as two flags,
# its --set would have been the binary's last and dropped the count.
out=$(OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=3 bash "$here/mpi/ps_rank.sh" \
  "--config=$dir/job.textproto" "--rendezvous_dir=$dir/r" "--bin_dir=$dir/bin" --servers=2 \
  --server_arg=--set --server_arg=server.data_threads=2 --server_arg=--host=h) || fail "ps_rank.sh: $out"
[ "$out" = "server/ps_server --cluster_from=mpi --config=$dir/job.textproto --rendezvous_dir=$dir/r --set=server.data_threads=2,cluster.num_servers=2 --host=h" ] ||
  fail "ps_rank.sh passed: $out"
out=$(OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=3 bash "$here/mpi/ps_rank.sh" \
  "--config=$dir/job.textproto" "--rendezvous_dir=$dir/r" "--bin_dir=$dir/bin" --servers=2 \
  --server_arg=--set 2>&1) && fail "ps_rank.sh took a --set with no value: $out"
[[ $out == *"--set with no value after it"* ]] || fail "ps_rank.sh said: $out"
out=$(OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=3 bash "$here/mpi/ps_rank.sh" \
  "--config=$dir/job.textproto" "--rendezvous_dir=$dir/r" "--bin_dir=$dir/bin" --servers=1 \
  --server_arg=--set=cluster.num_servers=2 2>&1) && fail "ps_rank.sh took a contradicting count: $out"
[[ $out == *"--set cluster.num_servers=2 disagrees with the server count 1"* ]] || fail "ps_rank.sh said: $out"

# SLURM: srun gets the --multi-prog file; the fake one prints it.
printf '#!/bin/bash\ncat "${@: -1}"\n' >"$dir/path/srun"
chmod +x "$dir/path/srun"
out=$(cd "$dir" && PATH="$dir/path:$PATH" SLURM_JOB_ID=1 SLURM_NTASKS=2 SLURM_SUBMIT_DIR="$dir" \
  bash "$here/slurm/ps_job.sbatch" "--config=$dir/job.textproto" "--bin_dir=$dir/bin" \
  --set=training.epochs=1 --set=training.seed=7) || fail "ps_job.sbatch: $out"
echo "ps_job.sbatch: $out"
[ "$(grep -c -- "--set=training.epochs=1,training.seed=7,cluster.num_servers=1$" <<<"$out")" = 2 ] ||
  fail "ps_job.sbatch wrote: $out"
out=$(cd "$dir" && PATH="$dir/path:$PATH" SLURM_JOB_ID=1 SLURM_NTASKS=3 SLURM_SUBMIT_DIR="$dir" \
  bash "$here/slurm/ps_job.sbatch" "--config=$dir/job.textproto" "--bin_dir=$dir/bin" --servers=2 \
  --set=training.epochs=1 --worker_arg=--set=training.seed=7 --worker_arg=--eval=never) ||
  fail "ps_job.sbatch: $out"
echo "ps_job.sbatch: $out"
grep -q -- "^0-1 .* --set=training.epochs=1,cluster.num_servers=2$" <<<"$out" || fail "ps_job.sbatch wrote: $out"
grep -q -- "^2-2 .* --set=training.epochs=1,training.seed=7,cluster.num_servers=2 --eval=never$" <<<"$out" ||
  fail "ps_job.sbatch wrote: $out"
out=$(cd "$dir" && PATH="$dir/path:$PATH" SLURM_JOB_ID=1 SLURM_NTASKS=3 SLURM_SUBMIT_DIR="$dir" \
  bash "$here/slurm/ps_job.sbatch" "--config=$dir/job.textproto" "--bin_dir=$dir/bin" --servers=2 \
  --worker_arg=--set --worker_arg=training.seed=7 --worker_arg=--eval=never \
  --server_arg=-set --server_arg=cluster.num_servers=3 2>&1) && fail "ps_job.sbatch took a contradicting count: $out"
[[ $out == *"--set cluster.num_servers=3 disagrees with the server count 2"* ]] || fail "ps_job.sbatch said: $out"
out=$(cd "$dir" && PATH="$dir/path:$PATH" SLURM_JOB_ID=1 SLURM_NTASKS=3 SLURM_SUBMIT_DIR="$dir" \
  bash "$here/slurm/ps_job.sbatch" "--config=$dir/job.textproto" "--bin_dir=$dir/bin" --servers=2 \
  --worker_arg=--set --worker_arg=training.seed=7 --worker_arg=--eval=never) || fail "ps_job.sbatch: $out"
grep -q -- "^2-2 .* --set=training.seed=7,cluster.num_servers=2 --eval=never$" <<<"$out" ||
  fail "ps_job.sbatch wrote: $out"
echo "PASSED"
