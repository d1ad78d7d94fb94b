#!/bin/bash
# Packs a bundle made by make_bundle.sh (138 MB) into a folder under 64 MB, for a GPU machine
# that takes a working tree of at most that much: the binaries, libraries, configs and
# run_checks.sh as one tar.xz, the training images recompressed with xz, the other data files
# as they are, and unpack.py, which rebuilds the bundle with Python's standard library alone.
#
#   tools/gpu/pack_bundle.sh BUNDLE_DIR PACK_DIR      # PACK_DIR inside the repository, ignored
#   # on the GPU machine:
#   python3 PACK_DIR/unpack.py /tmp/bundle && /tmp/bundle/run_checks.sh /tmp/results
set -euo pipefail
bundle="${1:?usage: pack_bundle.sh BUNDLE_DIR PACK_DIR}"
pack="${2:?usage: pack_bundle.sh BUNDLE_DIR PACK_DIR}"
mkdir -p "$pack"
tar -cf - -C "$bundle" bin lib configs run_checks.sh summarize.py | xz -T0 -6 >"$pack/bundle.tar.xz"
gzip -dc "$bundle/data/train-images-idx3-ubyte.gz" | xz -T0 -6 >"$pack/train-images-idx3-ubyte.xz"
cp "$bundle"/data/t10k-*.gz "$bundle"/data/train-labels-idx1-ubyte.gz "$pack/"
cat >"$pack/unpack.py" <<'PY'
"""Rebuilds the bundle packed beside this file into the folder named by argv[1]."""
import gzip, lzma, os, shutil, sys, tarfile

if len(sys.argv) != 2:
    sys.exit("usage: python3 unpack.py OUT_DIR")
here = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1]
os.makedirs(os.path.join(out, "data"), exist_ok=True)
with tarfile.open(os.path.join(here, "bundle.tar.xz")) as t:
    if hasattr(tarfile, "data_filter"):
        t.extractall(out, filter="data")
    else:
        t.extractall(out)
with lzma.open(os.path.join(here, "train-images-idx3-ubyte.xz")) as f:
    with gzip.open(os.path.join(out, "data", "train-images-idx3-ubyte.gz"), "wb", 1) as g:
        shutil.copyfileobj(f, g)
for name in os.listdir(here):
    if name.endswith(".gz"):
        shutil.copy(os.path.join(here, name), os.path.join(out, "data", name))
PY
du -sh "$pack"
