#!/usr/bin/env bash
# Stop the Slurm cluster started by tools/slurm_up.sh (single- or multi-node).
#
# Stops exactly the daemons slurm_up.sh started, found by their PID files under the state dir
# (every slurmd, slurmctld, slurmdbd, MariaDB, munged, in that order): SIGTERM, wait up to 30 s each,
# then SIGKILL. A PID file whose process is gone (or is no longer that daemon) is just removed.
# Then removes what a multi-node cluster made (tools/slurm_node.sh net 0): every process left in the
# node namespaces (SIGKILL), the namespaces smnK, their veths, the bridge and the /etc/hosts block.
# Idempotent: with nothing running it does nothing. Config, database and job state are kept,
# so the next slurm_up.sh is a quick restart.
#
# Usage: tools/slurm_down.sh [-h|--help]
# Environment: SWE_MEGATRON_SLURM_DIR (state dir; default /var/lib/swe-megatron-slurm)
set -euo pipefail

# Before anything else: `--help` (or a mistyped option) must never stop a cluster.
case $# in
  0) ;;
  *) case $1 in
       -h | --help) sed -n '2,/^set -euo/s/^# \{0,1\}//p' "$0"; exit 0 ;;
       *) echo "slurm_down: unknown argument '$1'; usage: tools/slurm_down.sh [-h|--help]" >&2; exit 2 ;;
     esac ;;
esac

state=${SWE_MEGATRON_SLURM_DIR:-/var/lib/swe-megatron-slurm}
pids=$state/pids
export PATH=/usr/sbin:/sbin:$PATH

log() { echo "slurm_down: $*"; }
die() { echo "slurm_down: ERROR: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "must run as root (the daemons run as root); rerun with sudo"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

comm_of() { case $1 in mysqld) echo mariadbd ;; slurmd-*) echo slurmd ;; *) echo "$1" ;; esac; }
pid_of() { # name -> PID while our daemon is alive: /proc/PID/comm is its name and it is no zombie
  local f=$pids/$1.pid pid stat
  [[ -s $f ]] || return 1
  pid=$(<"$f")
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$(comm_of "$1")" ]] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]] || return 1
  echo "$pid"
}

stopped=0
slurmds=$(cd "$pids" 2>/dev/null && ls slurmd-*.pid 2>/dev/null | sed 's/\.pid$//' || true)
for name in slurmd $slurmds slurmctld slurmdbd mysqld munged; do
  [[ -e $pids/$name.pid ]] || continue
  if ! pid=$(pid_of "$name"); then
    rm -f "$pids/$name.pid"
    continue
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do pid_of "$name" >/dev/null || break; sleep 0.1; done
  if pid_of "$name" >/dev/null; then
    log "$name (pid $pid) ignored SIGTERM for 30 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do pid_of "$name" >/dev/null || break; sleep 0.1; done
    pid_of "$name" >/dev/null && die "$name (pid $pid) survived SIGKILL; check 'ps -o stat,cmd -p $pid' (stuck in D state?)"
  fi
  rm -f "$pids/$name.pid"
  log "stopped $name (pid $pid)"
  stopped=$((stopped + 1))
done
((stopped)) || log "nothing was running"
"$here/slurm_node.sh" net 0
