#!/bin/bash
# Creates the TLS material of one job: a CA, a certificate for every process that names its
# role (and index), and one bearer token per role. For tests and small clusters; a site with
# its own PKI should issue the certificates there instead, naming roles the same way.
#
#   tools/make_certs.sh [--force] [--workers N] [--job NAME] OUT_DIR [HOST...]
#
# Writes into OUT_DIR (created if missing):
#   ca.pem, ca.key            the job's CA (EC P-256, 10 years). Keep ca.key off the cluster.
#   server.pem, server.key    for every ps_server: serverAuth and clientAuth; subjectAltName
#                             URI ps://NAME/server, localhost, 127.0.0.1, ::1 and every HOST
#                             (an IP address becomes an IP entry, anything else a DNS entry).
#   worker-I.pem, worker-I.key  for worker I (0..N-1, N = --workers, default 1): clientAuth;
#                             URI ps://NAME/worker/I. Servers let a worker push, pull and
#                             heartbeat only as the index its certificate names.
#   operator.pem, operator.key  for psctl: clientAuth; URI ps://NAME/operator. Only this
#                             role may call Shutdown and Checkpoint.
#   client.pem, client.key    clientAuth, no role: may only read (Stats, pulls as a tool).
#   token.txt                 the workers' bearer token (64 random hex digits).
#   operator_token.txt        the operator's bearer token; admin calls need it too.
# Keys and tokens are mode 600, certificates 644. The common name of each role certificate
# is its URI as well, for tools that show only the CN.
#
# Which files a process uses (the printed snippet is the servers' security section):
#   ps_server  cert server.pem, token_file token.txt, operator_token_file operator_token.txt
#   ps_worker  --set security.cert=OUT_DIR/worker-I.pem,security.key=OUT_DIR/worker-I.key
#   psctl      --set security.cert=OUT_DIR/operator.pem,security.key=OUT_DIR/operator.key,
#                    security.token_file=OUT_DIR/operator_token.txt
# Servers must keep server.pem: clients check the server's name against its
# subjectAltName, so list every host (or IP) that appears in cluster.servers / --servers.
#
# Refuses to overwrite existing files unless --force is given (then it replaces them all,
# which invalidates every certificate signed by the old CA).
set -euo pipefail

usage() {
  echo "usage: $0 [--force] [--workers N] [--job NAME] OUT_DIR [HOST...]" >&2
  exit 2
}

force=0
workers=1
job=job
args=()
while (($#)); do
  case "$1" in
    --force) force=1 ;;
    --workers) shift; workers="${1:-}" ;;
    --workers=*) workers="${1#--workers=}" ;;
    --job) shift; job="${1:-}" ;;
    --job=*) job="${1#--job=}" ;;
    -h | --help) usage ;;
    -*) echo "make_certs: unknown flag $1" >&2; usage ;;
    *) args+=("$1") ;;
  esac
  shift
done
[[ "$workers" =~ ^[0-9]+$ ]] && ((workers >= 1 && workers <= 10000)) ||
  { echo "make_certs: --workers must be a number in [1, 10000], got '$workers'" >&2; exit 2; }
[[ "$job" =~ ^[A-Za-z0-9._-]+$ ]] ||
  { echo "make_certs: --job must be letters, digits, '.', '_' or '-', got '$job'" >&2; exit 2; }
((${#args[@]} >= 1)) || usage
out="${args[0]}"
hosts=("${args[@]:1}")

command -v openssl >/dev/null || { echo "make_certs: openssl not found (tools/setup.sh installs it)" >&2; exit 1; }

files=(ca.pem ca.key server.pem server.key operator.pem operator.key client.pem client.key
  token.txt operator_token.txt)
for ((i = 0; i < workers; i++)); do files+=("worker-$i.pem" "worker-$i.key"); done
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
san="URI:ps://$job/server,DNS:localhost,IP:127.0.0.1,IP:::1"
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

# A client certificate: $1 = file stem, $2 = common name, $3 = extra extension lines.
client_cert() {
  newkey "$tmp/$1.key"
  # -subj separates fields with '/': escape the URI's own slashes.
  openssl req -new -key "$tmp/$1.key" -subj "/CN=${2//\//\\/}" -out "$tmp/$1.csr"
  cat >"$tmp/$1.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
$3
EOF
  sign "$1"
}

client_cert client "ps client" ""
client_cert operator "ps://$job/operator" "subjectAltName=URI:ps://$job/operator"
for ((i = 0; i < workers; i++)); do
  client_cert "worker-$i" "ps://$job/worker/$i" "subjectAltName=URI:ps://$job/worker/$i"
done

openssl rand -hex 32 >"$tmp/token.txt"
openssl rand -hex 32 >"$tmp/operator_token.txt"

for f in "${files[@]}"; do
  if [[ "$f" == *.pem && "$f" != ca.pem ]]; then
    openssl verify -CAfile "$tmp/ca.pem" "$tmp/$f" >/dev/null
  fi
done
chmod 600 "$tmp"/*.key "$tmp/token.txt" "$tmp/operator_token.txt"
chmod 644 "$tmp"/*.pem
for f in "${files[@]}"; do mv -f "$tmp/$f" "$out/$f"; done

cat <<EOF
make_certs: wrote CA, server, operator, client and $workers worker certificates to $out
server subjectAltName: $san
The servers' security section (workers and psctl override cert/key/token_file, see above):

security {
  ca_cert: "$out/ca.pem"
  cert: "$out/server.pem"
  key: "$out/server.key"
  token_file: "$out/token.txt"
  operator_token_file: "$out/operator_token.txt"
}
Worker I: --set security.cert=$out/worker-I.pem,security.key=$out/worker-I.key
psctl:    --set security.cert=$out/operator.pem,security.key=$out/operator.key,security.token_file=$out/operator_token.txt
EOF
