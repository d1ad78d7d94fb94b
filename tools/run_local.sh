#!/bin/bash
# The main job in one command: installs what is missing, builds ps_server and ps_worker, and
# trains Fashion-MNIST on a local cluster of 2 servers + 2 workers (or the config given),
# printing progress and the final test accuracy.
#   bash tools/run_local.sh [CONFIG] [launch_local.py flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
config="${1:-configs/fashion_mnist_2x2_async.textproto}"
shift || true
bazel build //server:ps_server //worker:ps_worker
exec python3 tools/launch_local.py "$config" "$@"
