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
  slurm-wlm munge openmpi-bin
  buildah
  python3-dev pybind11-dev python3-numpy python3-torch
)
# From the npm registry, for tests/k8s_manifests_test: the Kubernetes API schema
# (kubernetes-models; its 4.x line runs on Debian 12's Node.js 18) and a YAML parser.
NPM_PKGS=(kubernetes-models@4.5.1 yaml@2.8.1)
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# Any Node.js will do (Debian's, or one installed otherwise).
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
npm_root="$(npm root -g)"
npm_missing=()
for p in "${NPM_PKGS[@]}"; do
  installed="$(node -p "require('$npm_root/${p%@*}/package.json').version" 2>/dev/null || true)"
  [ "$installed" = "${p##*@}" ] || npm_missing+=("$p")
done
if ((${#npm_missing[@]})); then
  echo "setup: installing ${npm_missing[*]} (npm, global)"
  $SUDO npm install -g --no-audit --no-fund --loglevel=error "${npm_missing[@]}"
fi
