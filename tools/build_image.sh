#!/bin/bash
# Builds the container image of ps_server, ps_worker and psctl, offline, from scratch, with buildah.
#
#   bazel build -c opt //server:ps_server //worker:ps_worker //tools:psctl
#   tools/build_image.sh [--with-data] [--out FILE] [--tag NAME:TAG] [--bin_dir DIR]
#
# The image holds the three binaries in /usr/local/bin, exactly the shared libraries they load
# (read from the binaries with ldd, and the ELF interpreter they name), a non-root user ps
# (uid/gid 65532) it runs as, a /var/lib/ps it owns (the servers' data volume mounts there), and
# the few /etc files a gRPC process reads (passwd, group, nsswitch.conf, hosts). No shell, no
# package manager. With --with-data it also holds Fashion-MNIST at the path the configs name
# (/usr/share/datasets/fashion-mnist, from Debian's dataset-fashion-mnist). Kubernetes' grpc
# readiness probe is made by the kubelet, so the image needs no probe binary.
#
# Output: an oci-archive FILE (default ps-image.tar, or ps-image-fashion-mnist.tar) whose image
# is named NAME:TAG (default localhost/ps:VERSION, localhost/ps:VERSION-fashion-mnist with
# --with-data), and the same NAME:TAG in buildah's local storage (shared with podman). Prints
# the archive's size. --print-tag prints the default NAME:TAG and exits.
#
# Storage: buildah's default (needs root, or `buildah unshare`), or --root DIR / --runroot DIR
# (passed to buildah; the tests use a private root under their temp dir). --storage-driver
# defaults to vfs (no kernel overlay support needed).
set -euo pipefail

VERSION=0.1
IMAGE=localhost/ps
DATA_DIR=/usr/share/datasets/fashion-mnist
UID_GID=65532
BINARIES=(server/ps_server worker/ps_worker tools/psctl)

die() {
  echo "build_image: $*" >&2
  exit 1
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

bin_dir=bazel-bin
out=""
tag=""
with_data=0
print_tag=0
storage=(--storage-driver vfs)
while (($#)); do
  case "$1" in
    --bin_dir) bin_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --with-data) with_data=1; shift ;;
    --print-tag) print_tag=1; shift ;;
    --root|--runroot|--storage-driver) storage+=("$1" "$2"); shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "build_image: unknown argument $1" >&2; usage 2 ;;
  esac
done
suffix=""
((with_data)) && suffix=-fashion-mnist
[ -n "$tag" ] || tag="$IMAGE:$VERSION$suffix"
if ((print_tag)); then
  echo "$tag"
  exit 0
fi
[ -n "$out" ] || out="ps-image$suffix.tar"
command -v buildah >/dev/null || die "buildah not found (bash tools/setup.sh installs it)"
command -v ldd >/dev/null || die "ldd not found"
for b in "${BINARIES[@]}"; do
  [ -x "$bin_dir/$b" ] || die "$bin_dir/$b not found: bazel build //server:ps_server //worker:ps_worker //tools:psctl"
done
if ((with_data)); then
  [ -d "$DATA_DIR" ] || die "$DATA_DIR not found (Debian package dataset-fashion-mnist)"
fi

stage="$(mktemp -d "${TMPDIR:-/tmp}/ps-image-XXXXXX")"
container=""
cleanup() {
  [ -z "$container" ] || buildah "${storage[@]}" rm "$container" >/dev/null 2>&1 || true
  rm -rf "$stage"
}
trap cleanup EXIT
root="$stage/root"
mkdir -p "$root"

# Where a host path lands in the image: under its real directory (/lib/x/libz.so.1 goes to
# /usr/lib/x/libz.so.1 on a merged-/usr host), the file itself dereferenced (an alternatives
# symlink such as libopenblas.so.0 becomes the library it points at).
install_file() {
  local path="$1" mode="$2" dir
  dir="$(readlink -f "$(dirname "$path")")"
  mkdir -p "$root$dir"
  install -m "$mode" "$(readlink -f "$path")" "$root$dir/$(basename "$path")"
}

mkdir -p "$root/usr/local/bin"
for b in "${BINARIES[@]}"; do
  install -m 0755 "$bin_dir/$b" "$root/usr/local/bin/$(basename "$b")"
  if command -v strip >/dev/null; then strip --strip-debug "$root/usr/local/bin/$(basename "$b")"; fi
done

# Every shared library the binaries load, and their ELF interpreter, as ldd resolves them here.
libs="$(for b in "${BINARIES[@]}"; do
  ldd "$bin_dir/$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
  interp="$(readelf -p .interp "$bin_dir/$b" 2>/dev/null | awk '/\]/ { print $NF }' || true)"
  [ -z "$interp" ] || echo "$interp"
done | sort -u)"
# ldd's output whole, then grep: under pipefail `ldd | grep -q` fails, ldd dying of SIGPIPE,
# exactly when grep finds a missing library.
ldd_out="$(ldd "${BINARIES[@]/#/$bin_dir/}" || true)"
missing="$(grep 'not found' <<<"$ldd_out" | sort -u || true)"
[ -z "$missing" ] || die "a shared library is missing on this host: $missing"
[ -n "$libs" ] || die "ldd found no libraries (statically linked binaries?)"
for lib in $libs; do install_file "$lib" 0755; done
# The top-level symlinks of a merged-/usr host (/lib -> usr/lib, ...) that lead to something
# in the image, so that the ELF interpreter path and the loader's default directories resolve
# as on the host.
for link in /bin /sbin /lib /lib32 /lib64 /libx32; do
  if [ -L "$link" ] && [ -e "$root/$(readlink -f "$link")" ]; then
    ln -s "$(readlink "$link")" "$root$link"
  fi
done

# The /etc a gRPC process reads: its user (glibc, gRPC's logging), name service order and
# localhost (the resolver; Kubernetes mounts its own hosts and resolv.conf over these).
mkdir -p "$root/etc" "$root/tmp" "$root/var/lib/ps" "$root/etc/ps"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/root:/sbin/nologin\nps:x:%d:%d:ps:/var/lib/ps:/sbin/nologin\n' \
  "$UID_GID" "$UID_GID" >"$root/etc/passwd"
printf 'root:x:0:\nps:x:%d:\n' "$UID_GID" >"$root/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
if ((with_data)); then
  mkdir -p "$root$DATA_DIR"
  install -m 0644 "$DATA_DIR"/*-ubyte.gz "$root$DATA_DIR/"
fi

# One layer: everything owned by root except the data directory, which belongs to ps.
layer="$stage/layer.tar"
tar --numeric-owner --owner=0 --group=0 --sort=name --exclude=./var/lib/ps -C "$root" -cf "$layer" .
tar --numeric-owner --owner="$UID_GID" --group="$UID_GID" -C "$root" -rf "$layer" ./var/lib/ps

B=(buildah "${storage[@]}")
container="$("${B[@]}" from --quiet scratch)"
"${B[@]}" add --quiet "$container" "$layer" / >/dev/null
"${B[@]}" config \
  --user "$UID_GID:$UID_GID" --workingdir /var/lib/ps \
  --env PATH=/usr/local/bin:/usr/bin:/bin \
  --cmd '["ps_server","--help"]' \
  --port 7000 \
  --label org.opencontainers.image.title=ps \
  --label org.opencontainers.image.version="$VERSION$suffix" \
  --label org.opencontainers.image.description="sharded parameter server: ps_server, ps_worker, psctl" \
  "$container"
"${B[@]}" commit --quiet --format oci --rm "$container" "$tag" >/dev/null
container=""
rm -f "$out"
"${B[@]}" push --quiet "$tag" "oci-archive:$out:$tag"
size="$(stat -c %s "$out")"
content="$(du -sk "$root" | cut -f1)"
echo "build_image: $tag -> $out ($((size / 1024 / 1024)) MiB, $size bytes; $((content / 1024)) MiB unpacked;" \
  "$(echo "$libs" | wc -l) shared libraries)"
