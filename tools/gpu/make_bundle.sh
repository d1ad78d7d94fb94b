#!/bin/bash
# Packs the CUDA build of the GPU checks into one self-contained folder for a GPU machine
# that has the NVIDIA driver, CUDA 13's runtime and cuBLAS but none of Debian's libraries:
# the binaries, every shared library they need except glibc, the driver and cuBLAS, the
# Fashion-MNIST files, the configs, tools/gpu/run_checks.sh and tools/gpu/summarize.py.
#
#   tools/gpu/make_bundle.sh OUT_DIR       # then, on the GPU machine: OUT_DIR/run_checks.sh
#   (138 MB: tools/gpu/pack_bundle.sh packs it into under 64 MB for a machine that takes less)
#
# The CUDA build uses its own output base so it does not evict the default build's analysis
# cache; compiled objects still come from the shared disk cache.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: make_bundle.sh OUT_DIR}"
output_base="${PS_CUDA_OUTPUT_BASE:-$HOME/.cache/ps-bazel-cuda}"
targets=(
  //kernels:cuda_backend_test //kernels:backend_test //kernels:kernels_benchmark
  //worker/models:mlp_model_test //worker/models:ctr_model_test
  //worker:ps_worker //server:ps_server //server:shard_benchmark
)
# --dynamic_mode=off: the tests link our own libraries statically too (no _solib_ folders).
bazel --output_base="$output_base" build --config=cuda --dynamic_mode=off --symlink_prefix=/ "${targets[@]}"
bin="$(bazel --output_base="$output_base" info --config=cuda --dynamic_mode=off bazel-bin)"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data" "$out/configs"
for t in "${targets[@]}"; do
  path="${t#//}"
  cp "$bin/${path/://}" "$out/bin/"
done
# Shared libraries, minus what the GPU machine provides itself.
for b in "$out"/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
  grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|libcuda|libcublas|libcublasLt)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
cp /usr/share/datasets/fashion-mnist/*.gz "$out/data/"
cp configs/*.textproto "$out/configs/"
cp tools/gpu/run_checks.sh tools/gpu/summarize.py "$out/"
du -sh "$out"
