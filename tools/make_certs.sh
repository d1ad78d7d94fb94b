#!/bin/bash
# Creates the TLS material of one job: a CA, one certificate for every process, a
# client-only certificate, and a bearer token. For tests and small clusters; a site with its
# own PKI should issue the certificates there instead.
#
#   tools/make_certs.sh [--force] OUT_DIR [HOST...]
#
# Writes into OUT_DIR (created if missing):
#   ca.pem, ca.key          the job's CA (EC P-256, 10 years). Keep ca.key off the cluster.
#   server.pem, server.key  signed by the CA; extendedKeyUsage serverAuth AND clientAuth;
#                           subjectAltName localhost, 127.0.0.1, ::1 and every HOST (an IP
#                           address becomes an IP entry, anything else a DNS entry).
#   client.pem, client.key  signed by the CA; clientAuth only, no subjectAltName.
#   token.txt               64 random hex digits (the shared bearer token).
# Keys and the token are mode 600, certificates 644.
#
# Which pair a process uses: SecurityConfig has one cert/key for servers and clients alike,
# and the server pair is valid in both roles, so the printed snippet (server.pem/server.key)
# works unchanged for every ps_server, ps_worker and tool of the job. A worker host that
# should not hold the server key can use the client pair instead:
#   ps_worker ... --set security.cert=OUT_DIR/client.pem,security.key=OUT_DIR/client.key
# Servers must keep server.pem: clients check the server's name against its
# subjectAltName, so list every host (or IP) that appears in cluster.servers / --servers.
#
# Refuses to overwrite existing files unless --force is given (then it replaces them all,
# which invalidates every certificate signed by the old CA).
set -euo pipefail

usage() {
  echo "usage: $0 [--force] OUT_DIR [HOST...]" >&2
  exit 2
}

force=0
args=()
for a in "$@"; do
  case "$a" in
    --force) force=1 ;;
    -h | --help) usage ;;
    -*) echo "make_certs: unknown flag $a" >&2; usage ;;
    *) args+=("$a") ;;
  esac
done
((${#args[@]} >= 1)) || usage
out="${args[0]}"
hosts=("${args[@]:1}")

command -v openssl >/dev/null || { echo "make_certs: openssl not found (tools/setup.sh installs it)" >&2; exit 1; }

files=(ca.pem ca.key server.pem server.key client.pem client.key token.txt)
mkdir -p "$out"
out="$(cd "$out" && pwd)"
if ((!force)); then
  existing=()
  for f in "${files[@]}"; do [ -e "$out/$f" ] && existing+=("$out/$f"); done
  if ((${#existing[@]})); then
    echo "make_certs: ${existing[*]} already exist; pass --force to replace them" >&2
    exit 1
  fi
fi

# Build everything in a scratch directory, then move it into place, so that a failure
# halfway leaves OUT_DIR as it was.
tmp="$(mktemp -d "$out/.make_certs.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
umask 077

days=3650
san="DNS:localhost,IP:127.0.0.1,IP:::1"
for h in "${hosts[@]+"${hosts[@]}"}"; do
  if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then
    san+=",IP:$h"
  else
    san+=",DNS:$h"
  fi
done

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# Signs $2.csr with the CA into $2.pem, with the extensions in file $3.
sign() {
  openssl x509 -req -in "$tmp/$1.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" \
    -CAcreateserial -CAserial "$tmp/ca.srl" -days "$days" -sha256 \
    -extfile "$tmp/$1.ext" -out "$tmp/$1.pem" 2>/dev/null
}

newkey "$tmp/ca.key"
openssl req -x509 -new -key "$tmp/ca.key" -sha256 -days "$days" -subj "/CN=ps job CA" \
  -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$tmp/ca.pem"

newkey "$tmp/server.key"
openssl req -new -key "$tmp/server.key" -subj "/CN=ps server" -out "$tmp/server.csr"
cat >"$tmp/server.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EOF
sign server

newkey "$tmp/client.key"
openssl req -new -key "$tmp/client.key" -subj "/CN=ps client" -out "$tmp/client.csr"
cat >"$tmp/client.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EOF
sign client

openssl rand -hex 32 >"$tmp/token.txt"

openssl verify -CAfile "$tmp/ca.pem" "$tmp/server.pem" "$tmp/client.pem" >/dev/null
chmod 600 "$tmp"/*.key "$tmp/token.txt"
chmod 644 "$tmp"/*.pem
for f in "${files[@]}"; do mv -f "$tmp/$f" "$out/$f"; done

cat <<EOF
make_certs: wrote ${files[*]} to $out
subjectAltName: $san
Paste into the job config (every server and worker reads the same files):

security {
  ca_cert: "$out/ca.pem"
  cert: "$out/server.pem"
  key: "$out/server.key"
  token_file: "$out/token.txt"
}
EOF
