#!/bin/bash
# Runs the GPU checks from a bundle made by tools/gpu/make_bundle.sh (this file is copied into
# it) and writes every log under OUT_DIR:
#   - the CUDA unit tests: every CUDA op against the CPU backend, and the models' CUDA cases;
#   - GEMM through the Backend API next to a direct cuBLAS call (kernels_benchmark);
#   - the server's tables on this host's cores: a push's check and apply, a pull's read
#     (shard_benchmark);
#   - Fashion-MNIST MLP trained centralized on the GPU and on the CPU, and distributed with
#     one server and one GPU worker (ROUNDS times, default 3, interleaved with the centralized
#     GPU run: as built, with the server applying each push on one thread, with whole blocks
#     per thread (no ranges), with apply threads that sleep at once (server.apply_spin_us=-1;
#     by default they watch for work on a host of 8 or more cores), with prefetch, with both,
#     and with the worker's gradients copied by the GPU straight into the server's segment
#     (rpc.lend_push_buffers), without and with prefetch, then with the answer's copy split over
#     helper threads (rpc.parallel_copy_bytes), and with the server's apply on 8 threads
#     (server.apply_threads)), each with its step breakdown (pull,
#     compute, push) and the server's time in its tables;
#   - the synthetic CTR model centralized on the GPU;
#   - last, the 1 + 1 target's table from those runs (summarize.py: each variant's ratio to
#     its round's centralized run, per-step times, the medians).
#
#   [SKIP="NAME..."] BUNDLE/run_checks.sh OUT_DIR     (SKIP: steps not to run, by name or shell
#                                                      pattern, e.g. "gemm_benchmark *_serial_apply_*")
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/results}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -e "$d/libcublas.so.13" ]] && LD_LIBRARY_PATH+=":$d"
done
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
head -n 15 "$out/nvidia-smi.txt"

failed=0
# skipped NAME: whether SKIP names the step, by name or by a shell pattern
# (e.g. "mlp_1x1_cuda_serial_apply_*" for every round).
skipped() {
  local pattern patterns
  read -r -a patterns <<<"${SKIP:-}"  # split on blanks, no file-name expansion
  for pattern in "${patterns[@]}"; do
    # shellcheck disable=SC2053  # the right side is a pattern on purpose
    [[ "$1" == $pattern ]] && return 0
  done
  return 1
}

# step NAME LIMIT_S COMMAND...: runs COMMAND into OUT/NAME.log, shows its tail.
step() {
  local name="$1" limit="$2"
  shift 2
  if skipped "$name"; then
    echo "=== $name: skipped"
    return
  fi
  echo "=== $name: $*"
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "--- $name: rc=$rc in $((SECONDS - start)) s"
  tail -n "${TAIL:-12}" "$out/$name.log"
  [[ $rc -eq 0 ]] || failed=$((failed + 1))
}

b="$here/bin"
epochs="${EPOCHS:-2}"
d="$here/data"
fm="--set=data.train_images=$d/train-images-idx3-ubyte.gz,data.train_labels=$d/train-labels-idx1-ubyte.gz"
fm+=",data.test_images=$d/t10k-images-idx3-ubyte.gz,data.test_labels=$d/t10k-labels-idx1-ubyte.gz"
fm+=",training.epochs=$epochs"

TAIL=4 step cuda_backend_test 120 "$b/cuda_backend_test"
TAIL=4 step backend_test 120 "$b/backend_test"
TAIL=4 step mlp_model_test 120 "$b/mlp_model_test"
TAIL=4 step ctr_model_test 120 "$b/ctr_model_test"
TAIL=30 step gemm_benchmark 180 "$b/kernels_benchmark" --device=cuda --benchmark_filter=Gemm \
  --benchmark_min_time=0.2 --benchmark_out="$out/gemm_benchmark.json" --benchmark_out_format=json

# The server's tables on this host's cores, without a network or a worker: the MLP's push
# checked and applied (whole blocks, ranges, watching helpers) and a pull's read (one thread,
# ranges with helpers asleep or watching; the MLP's and 64 MB).
TAIL=12 step tables_benchmark 120 "$b/shard_benchmark" \
  --benchmark_filter='MlpPushHandOff|PullRead' --benchmark_min_time=0.3

step mlp_centralized_cpu 180 "$b/ps_worker" --config="$here/configs/fashion_mnist_centralized.textproto" \
  --centralized --device=cpu "$fm" --log_path="$out/mlp_centralized_cpu.jsonl"

# A large MLP (784-2048-2048-10, batch 64), 300 steps: where a GPU should pay. The CPU uses
# 8 BLAS threads here. On the GPU twice: the tables on the device (the default) and through
# the in-process store (parameters in and gradients out over PCIe every step).
for device in cuda cpu; do
  step "mlp_large_centralized_$device" 180 "$b/ps_worker" \
    --config="$here/configs/fashion_mnist_centralized.textproto" --centralized --device="$device" \
    --threads=8 --eval=never "$fm,model.mlp.hidden=2048,2048,training.max_steps=300"
done
step mlp_large_centralized_cuda_store 180 "$b/ps_worker" \
  --config="$here/configs/fashion_mnist_centralized.textproto" --centralized --device=cuda \
  --threads=8 --eval=never \
  "$fm,model.mlp.hidden=2048,2048,training.max_steps=300,training.dense_tables=DENSE_TABLES_STORE"

# one_server NAME WORKER_BINARY WORKER_SETTINGS [SERVER_SETTINGS]: one server and one worker
# on the GPU on this machine, a fresh server and data folder each time. WORKER_SETTINGS are
# added to the worker's --set (",key=value..."); SERVER_SETTINGS are the server's ("key=value,...").
one_server() {
  local name="$1" worker="$2" settings="$3" server_settings="${4:-}"
  if skipped "$name"; then
    echo "=== $name: skipped"
    return
  fi
  local server_args=(--config="$here/configs/fashion_mnist_centralized.textproto" --server_index=0
    --host=127.0.0.1 --port=0 --port_file=/tmp/ps-gpu-check/port --data_dir=/tmp/ps-gpu-check/data)
  [[ -n "$server_settings" ]] && server_args+=(--set="$server_settings")
  rm -rf /tmp/ps-gpu-check && mkdir -p /tmp/ps-gpu-check
  "$b/ps_server" "${server_args[@]}" >"$out/${name}_server.log" 2>&1 &
  local server=$!
  for _ in $(seq 100); do [[ -s /tmp/ps-gpu-check/port ]] && break; sleep 0.1; done
  step "$name" 180 "$worker" --config="$here/configs/fashion_mnist_centralized.textproto" \
    --worker_index=0 --servers="127.0.0.1:$(cat /tmp/ps-gpu-check/port)" --device=cuda \
    "$fm$settings" --log_path="$out/$name.jsonl"
  kill -TERM "$server" 2>/dev/null  # it stops by itself once its worker has finished
  wait "$server"
  grep -h "time in the tables" "$out/${name}_server.log" | sed 's/^.*] /    server: /'
}

# The distributed target's runs, ROUNDS times interleaved: centralized on the GPU, then one
# server and one GPU worker: as built; with the server applying every push on one thread (as
# before parallel_apply_min_values); with whole blocks per apply thread; with apply threads
# that sleep at once; with prefetch, with and without sleeping apply threads; with lent push
# buffers, without and with prefetch, with prefetch and the answer's copy on helpers, and with
# prefetch and the server's parallel apply on 8 threads instead of every core (the worker's
# compute was 0.06-0.15 ms a step slower than the centralized run's in the 18:44 rounds, more
# so with the server's helpers watching); and, where the bundle holds one
# (bin/ps_worker_before), another worker binary to compare with.
for round in $(seq "${ROUNDS:-3}"); do
  step "mlp_centralized_cuda_$round" 180 "$b/ps_worker" \
    --config="$here/configs/fashion_mnist_centralized.textproto" --centralized --device=cuda "$fm" \
    --log_path="$out/mlp_centralized_cuda_$round.jsonl"
  one_server "mlp_1x1_cuda_$round" "$b/ps_worker" ""
  one_server "mlp_1x1_cuda_serial_apply_$round" "$b/ps_worker" "" \
    "server.parallel_apply_min_values=1048576"
  one_server "mlp_1x1_cuda_whole_blocks_$round" "$b/ps_worker" "" \
    "server.parallel_apply_range_values=1048576"
  if [[ -x "$b/ps_worker_before" ]]; then
    one_server "mlp_1x1_cuda_worker_before_$round" "$b/ps_worker_before" ""
  fi
  one_server "mlp_1x1_cuda_apply_sleep_$round" "$b/ps_worker" "" "server.apply_spin_us=-1"
  one_server "mlp_1x1_cuda_prefetch_$round" "$b/ps_worker" ",training.prefetch=true"
  one_server "mlp_1x1_cuda_prefetch_apply_sleep_$round" "$b/ps_worker" ",training.prefetch=true" \
    "server.apply_spin_us=-1"
  one_server "mlp_1x1_cuda_lend_$round" "$b/ps_worker" ",rpc.lend_push_buffers=true"
  one_server "mlp_1x1_cuda_prefetch_lend_$round" "$b/ps_worker" \
    ",training.prefetch=true,rpc.lend_push_buffers=true"
  one_server "mlp_1x1_cuda_prefetch_lend_copy_$round" "$b/ps_worker" \
    ",training.prefetch=true,rpc.lend_push_buffers=true,rpc.parallel_copy_bytes=262144"
  one_server "mlp_1x1_cuda_prefetch_lend_apply8_$round" "$b/ps_worker" \
    ",training.prefetch=true,rpc.lend_push_buffers=true" "server.apply_threads=8"
done

step ctr_centralized_cuda 180 "$b/ps_worker" --config="$here/configs/ctr_synthetic_2x2.textproto" \
  --centralized --device=cuda \
  --set=cluster.num_workers=1,data.synthetic.num_train=200000,training.epochs=1 \
  --log_path="$out/ctr_centralized_cuda.jsonl"

# The 1 + 1 target's table (tools/gpu/summarize.py), also kept in OUT/target_summary.txt.
if [[ -f "$here/summarize.py" ]] && command -v python3 >/dev/null; then
  echo "=== the 1 server + 1 GPU worker target"
  python3 "$here/summarize.py" "$out" | tee "$out/target_summary.txt"
fi

echo "=== $failed step(s) failed"
exit "$failed"
