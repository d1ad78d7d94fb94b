#!/bin/bash
# The main job in one command: installs what is missing, builds ps_server and ps_worker, and
# trains Fashion-MNIST on a local cluster of 2 servers + 2 workers (or the config given),
# printing progress and the final test accuracy.
#   bash tools/run_local.sh [CONFIG] [launch_local.py flags...]
set -euo pipefail
# The script runs from the checkout, so the paths given are made absolute first.
caller=$PWD
abs() { case "$1" in /* | "") printf '%s' "$1" ;; *) printf '%s/%s' "$caller" "$1" ;; esac; }
config=configs/fashion_mnist_2x2_async.textproto
if [ -n "${1:-}" ]; then config=$(abs "$1"); fi
shift || true
args=() path_next=""
for a in "$@"; do
  if [ -n "$path_next" ]; then
    args+=("$(abs "$a")") path_next=""
    continue
  fi
  case "$a" in
    --data_root=* | --log_dir=* | --bin_dir=*) args+=("${a%%=*}=$(abs "${a#*=}")") ;;
    --data_root | --log_dir | --bin_dir) args+=("$a") path_next=1 ;;
    *) args+=("$a") ;;
  esac
done
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //server:ps_server //worker:ps_worker
exec python3 tools/launch_local.py "$config" "${args[@]}"
