#!/bin/bash
# Installs what building, testing and running the project needs, from Debian 12's packages.
# Idempotent: installs only what is missing. Needs root (or sudo) the first time.
set -euo pipefail
PKGS=(
  bazel-bootstrap pkg-config g++ python3
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev librocksdb-dev libgoogle-glog-dev libopenblas-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist openssl iproute2 procps
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
