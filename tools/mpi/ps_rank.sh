#!/bin/bash
# One rank of a parameter-server job under Open MPI's mpirun: ranks 0..S-1 become ps_server,
# the others ps_worker, each with --cluster_from=mpi. MPI tells no process where the others
# are, so the servers leave their host:port in a rendezvous directory that every rank must
# see (a shared filesystem across hosts; any directory on one host) and the workers wait
# for them there (up to ps_worker's --wait_for_servers_s).
#
#   mpirun -n 4 tools/mpi/ps_rank.sh --rendezvous_dir=/shared/ps-rdv \
#       --config=configs/fashion_mnist_2x2_async.textproto --set=training.epochs=1
#   (as root add --allow-run-as-root; more ranks than cores: --oversubscribe)
#
# Options:
#   --config=FILE          the JobConfig (required)
#   --rendezvous_dir=DIR   the shared directory (required); each mpirun uses its own
#                          subdirectory, named after its job id
#   --servers=S            how many ranks are servers [cluster.num_servers of --set, else of
#                          the config file]; passed to every process as cluster.num_servers.
#                          The job has -n minus S workers (the config's cluster.num_workers, if
#                          set, must agree)
#   --bin_dir=DIR          holds server/ps_server and worker/ps_worker [bazel-bin of this checkout]
#   --data_root=DIR        server i checkpoints into DIR/server-i [no persistence]
#   --set=...              config overrides for every process
#   --server_arg=F, --worker_arg=F   an extra flag for every server / worker (repeatable),
#                          e.g. --server_arg=--host=10.0.0.5 to listen on (and advertise) one
#                          address; by default a server listens on every address and
#                          advertises its host name. A --set=... here joins the process's one
#                          --set, after the job's
set -euo pipefail

die() { echo "ps_rank: $*" >&2; exit 2; }
# The last value that the comma-separated overrides $2 give the path $1 ("" if none).
override_of() {
  local v="" t ts
  IFS=, read -ra ts <<<"$2"
  for t in "${ts[@]}"; do [[ $t != "$1="* ]] || v=${t#*=}; done
  printf '%s' "$v"
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
config="" rendezvous="" servers="" bin_dir="$here/../../bazel-bin" data_root="" set_flag=""
server_args=() worker_args=()
for arg in "$@"; do
  case "$arg" in
    --config=*) config=${arg#*=} ;;
    --rendezvous_dir=*) rendezvous=${arg#*=} ;;
    --servers=*) servers=${arg#*=} ;;
    --bin_dir=*) bin_dir=${arg#*=} ;;
    --data_root=*) data_root=${arg#*=} ;;
    --set=*) set_flag=${set_flag:+$set_flag,}${arg#--set=} ;; # repeated: all of them
    --server_arg=*) server_args+=("${arg#*=}") ;;
    --worker_arg=*) worker_args+=("${arg#*=}") ;;
    *) die "unknown argument '$arg' (see the top of tools/mpi/ps_rank.sh)" ;;
  esac
done
rank=${OMPI_COMM_WORLD_RANK:-}
size=${OMPI_COMM_WORLD_SIZE:-}
[ -n "$rank" ] && [ -n "$size" ] || die "OMPI_COMM_WORLD_RANK/SIZE are not set: start this with Open MPI's mpirun"
[ -n "$config" ] || die "--config=FILE is required"
[ -n "$rendezvous" ] || die "--rendezvous_dir=DIR is required"
[ -r "$config" ] || die "cannot read the config '$config'"
servers=${servers:-$(override_of cluster.num_servers "$set_flag")}
if [ -z "$servers" ]; then
  # As the binaries read the config (--print_config: the file with the --set overrides, in
  # the proto's JSON form), not with a parser of this script's own.
  printed=$("$bin_dir/server/ps_server" --print_config --cluster_from=flags "--config=$config" \
    ${set_flag:+"--set=$set_flag"} 2>&1) || die "ps_server --print_config: $printed"
  servers=$(grep -o '"num_servers":[0-9]*' <<<"$printed" | head -1 | cut -d: -f2 || true)
  [ -n "$servers" ] && ((servers > 0)) || die "the config sets no cluster.num_servers: give --servers=S"
fi
[[ $servers =~ ^[0-9]+$ ]] && ((servers >= 1 && servers < size)) ||
  die "--servers=$servers: need 1 <= S < the $size ranks (at least one worker)"

if ((rank < servers)); then
  binary="$bin_dir/server/ps_server" extra=()
  [ -z "$data_root" ] || extra=("--data_dir=$data_root/server-$rank")
  extra+=("${server_args[@]}")
else
  binary="$bin_dir/worker/ps_worker" extra=("${worker_args[@]}")
fi
# The binaries keep only the last --set flag, so this one holds all: the job's --set, then
# those among the extra flags, then cluster.num_servers=S, since MPI gives them only the number
# of ranks and S decides the roles here.
# Splits flags into the overrides of their --set flags (--set=V and the two-word --set V) and
# the rest: SETS = $1 then those overrides, comma-joined; REST = the other flags, in order.
split_sets() {
  SETS=$1 REST=()
  shift
  while (($#)); do
    case "$1" in
      --set=* | -set=*) SETS=${SETS:+$SETS,}${1#*=} ;;
      --set | -set)
        (($# >= 2)) || die "$1 with no value after it"
        SETS=${SETS:+$SETS,}$2
        shift
        ;;
      *) REST+=("$1") ;;
    esac
    shift
  done
}
split_sets "$set_flag" "${extra[@]}"
set_all=$SETS rest=("${REST[@]}")
v=$(override_of cluster.num_servers "$set_all")
[ -z "$v" ] || [ "$v" = "$servers" ] || die "--set cluster.num_servers=$v disagrees with the server count $servers"
exec "$binary" --cluster_from=mpi "--config=$config" "--rendezvous_dir=$rendezvous" \
  "--set=${set_all:+$set_all,}cluster.num_servers=$servers" "${rest[@]}"
