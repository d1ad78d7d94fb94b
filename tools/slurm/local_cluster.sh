#!/bin/bash
# A throw-away SLURM cluster on this machine, for tests and for trying tools/slurm/ps_job.sbatch:
# munged, slurmctld and one slurmd per virtual node, as root, without systemd or cgroups.
# Everything (config, munge key and socket, state, spool, logs, pid files) lives under
# $PS_SLURM_DIR; nothing in /etc is changed.
#
#   sudo tools/slurm/local_cluster.sh start     # then: source $PS_SLURM_DIR/env.sh; sbatch ...
#   sudo tools/slurm/local_cluster.sh stop      # cancels jobs, stops every daemon it started
#
# Environment:
#   PS_SLURM_DIR      state directory [/tmp/ps-slurm]; it holds munge's Unix socket, so keep
#                     the path short and every directory above it world-executable
#   PS_SLURM_NODES    node names, space-separated ["127.0.0.1 127.0.0.2"]. The tasks reach each
#                     other by node name (as on a real cluster), so a name must be an address
#                     of this machine or resolve to one; loopback addresses make two "nodes" on
#                     one host with distinct addresses (their hostlist is "127.0.0.[1-2]"). Not
#                     this host's own name: slurm takes it for every node named localhost.
#   PS_SLURM_CPUS     CPUs each node advertises [4 with one node, else the real count, at least 2]
#   PS_SLURM_PORT     slurmctld's port; slurmd i uses PORT+i [the first free of 6817, 6827, ...]
#   PS_SLURM_TIMEOUT  seconds to wait for the nodes to become idle [60]
#
# Needs slurm-wlm and munge (tools/setup.sh installs them). Notes from making this work:
# - The daemons run as root with auth/munge on a private munged socket (AuthInfo=socket=...),
#   munged with --origin=127.0.0.1 (the host name need not resolve for munge).
# - proctrack/linuxproc + task/none: no cgroups needed (containers, gVisor).
# - SlurmdParameters=config_overrides lets a node advertise more CPUs than it has, so that a
#   4-task job fits on a 2-core machine.
# - No accounting database: `sbatch --wait` returns the job's exit code.
# - Every daemon gets PS_SLURM_DAEMON_TAG=$PS_SLURM_DIR in its environment, so `stop` finds
#   exactly the processes this script started, and nothing else.
set -euo pipefail
# The daemons live in /usr/sbin, which a test's or a job's PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

D=${PS_SLURM_DIR:-/tmp/ps-slurm}
TIMEOUT=${PS_SLURM_TIMEOUT:-60}
log() { echo "slurm-local: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# A node's address: its name when that is an IPv4 address, else what the name resolves to.
node_addr() {
  if [[ $1 =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "$1"
  else
    getent ahostsv4 "$1" | awk '{print $1; exit}'
  fi
}

port_free() {
  ! ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
}

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

# Processes carrying our tag (the daemons and their slurmstepd children).
tagged() {
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = $$ ] && continue
    { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "PS_SLURM_DAEMON_TAG=$D" &&
      alive "$p" && echo "$p"
  done
  return 0
}

stop() {
  export SLURM_CONF=$D/etc/slurm.conf
  if [ ! -e "$SLURM_CONF" ]; then
    log "no cluster at $D"
    return 0
  fi
  if squeue -h >/dev/null 2>&1; then
    local jobs
    jobs=$(squeue -h -o %i | sed 's/+.*//' | sort -u)
    if [ -n "$jobs" ]; then
      log "cancelling jobs: $(echo $jobs)"
      scancel $jobs || true
      for _ in $(seq 1 150); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.2; done
    fi
    scontrol shutdown >/dev/null 2>&1 || true
  fi
  if [ -S "$D/munge/munge.socket" ]; then
    munged --stop --socket="$D/munge/munge.socket" >/dev/null 2>&1 || true
  fi
  local left="" sig p
  for sig in NONE TERM KILL; do
    for _ in $(seq 1 50); do
      left=$( { for p in $(cat "$D"/run/*.pid 2>/dev/null); do alive "$p" && echo "$p"; done; tagged; } | sort -u)
      [ -z "$left" ] && break
      sleep 0.2
    done
    [ -z "$left" ] && break
    [ "$sig" = NONE ] && continue
    log "still running: $(echo $left); sending SIG$sig"
    for p in $left; do kill -"$sig" "$p" 2>/dev/null || true; done
  done
  if [ -n "$left" ]; then
    log "WARNING: processes left: $(echo $left)"
    return 1
  fi
  rm -f "$D"/run/*.pid
  log "stopped"
}

start() {
  [ "$(id -u)" = 0 ] || die "must run as root (slurmd does)"
  for b in munged mungekey slurmctld slurmd sbatch srun scontrol sinfo squeue; do
    command -v "$b" >/dev/null || die "$b not found: install slurm-wlm and munge (bash tools/setup.sh)"
  done
  [ ! -e "$D/etc/slurm.conf" ] || stop || true
  rm -rf "$D"
  mkdir -p "$D"/{etc,log,state,run,munge,spool}
  chmod 755 "$D" "$D/munge"  # munged wants its socket directory world-executable

  local nodes=${PS_SLURM_NODES:-"127.0.0.1 127.0.0.2"}
  local n
  n=$(wc -w <<<"$nodes")
  local real
  real=$(slurmd -C | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' | head -1)
  local cpus=${PS_SLURM_CPUS:-}
  if [ -z "$cpus" ]; then
    if [ "$n" = 1 ]; then cpus=4; else cpus=$(( ${real:-2} < 2 ? 2 : ${real:-2} )); fi
  fi
  local mem
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
  mem=$(( ${mem:-2048} / n )); [ "$mem" -ge 1 ] || mem=1
  local port=${PS_SLURM_PORT:-}
  if [ -z "$port" ]; then
    for port in $(seq 6817 10 6917); do
      local ok=1 i
      for i in $(seq 0 "$n"); do port_free $((port + i)) || ok=0; done
      [ "$ok" = 1 ] && break
    done
  fi

  # The tag goes to the daemons only, never into this script's own environment (or `stop`
  # would find this script's subshells).
  local tag="PS_SLURM_DAEMON_TAG=$D"
  mungekey --create --keyfile="$D/munge/munge.key" --force
  chmod 600 "$D/munge/munge.key"
  env "$tag" munged --key-file="$D/munge/munge.key" --socket="$D/munge/munge.socket" --origin=127.0.0.1 \
    --pid-file="$D/run/munged.pid" --seed-file="$D/munge/munged.seed" --log-file="$D/log/munged.log"
  munge -S "$D/munge/munge.socket" -n | unmunge -S "$D/munge/munge.socket" >/dev/null ||
    die "munge does not work (see $D/log/munged.log)"

  local conf=$D/etc/slurm.conf
  cat >"$conf" <<EOF
ClusterName=pslocal
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.socket
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
InactiveLimit=0
MinJobAge=300
EOF
  local i=0 name list=""
  for name in $nodes; do
    i=$((i + 1))
    mkdir -p "$D/spool/$name"
    echo "NodeName=$name NodeHostname=$name NodeAddr=$(node_addr "$name") Port=$((port + i)) CPUs=$cpus RealMemory=$mem State=UNKNOWN" >>"$conf"
    list+="${list:+,}$name"
  done
  echo "PartitionName=debug Nodes=$list Default=YES MaxTime=INFINITE State=UP" >>"$conf"
  export SLURM_CONF=$conf
  echo "export SLURM_CONF=$conf" >"$D/env.sh"

  env "$tag" slurmctld -c || { stop; die "slurmctld did not start (see $D/log/slurmctld.log)"; }
  for name in $nodes; do
    env "$tag" slurmd -N "$name" || { stop; die "slurmd -N $name did not start (see $D/log/)"; }
  done
  local deadline=$(( $(date +%s) + TIMEOUT ))
  while [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -lt "$n" ]; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      sinfo -N -l >&2 || true
      tail -n 20 "$D"/log/*.log >&2 || true
      stop || true
      die "nodes not idle after ${TIMEOUT}s"
    fi
    sleep 0.2
  done
  log "ready: nodes $list, $cpus CPUs each, slurmctld port $port; run: source $D/env.sh"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop   (state in \$PS_SLURM_DIR, default /tmp/ps-slurm)" >&2; exit 2 ;;
esac
