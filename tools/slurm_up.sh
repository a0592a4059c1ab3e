#!/usr/bin/env bash
# Bring up a real Slurm cluster (with accounting) on this machine, without systemd.
#
# --nodes 1 (default): one compute node, the host itself (node name = the host's hostname).
# --nodes N (N >= 2): N compute nodes smn1..smnN, each a slurmd in its own network namespace smnK
#   (address 10.77.0.(10+K)/24 on the bridge smbr0, whose host end is 10.77.0.1) and its own UTS
#   namespace (hostname smnK), so a job step on smnK sees hostname smnK and that address, and reaches
#   the other nodes through their addresses. The names are in /etc/hosts (a marked block). slurmctld,
#   slurmdbd, MariaDB and munged stay in the host namespace; slurmds reach slurmctld at 10.77.0.1.
#   No forwarding to the outside: jobs see only the bridge (like offline compute nodes).
#   Every node declares the machine's full CPUs and memory: oversubscribed on purpose (a test cluster).
#   tools/slurm_node.sh kills ("loses") and revives one node.
#
# Installs the Debian packages if missing (slurm-wlm, slurmdbd, munge, mariadb-server), writes
# /etc/slurm/{slurm,slurmdbd,gres}.conf, and starts munged, MariaDB (own datadir, 127.0.0.1 only),
# slurmdbd, slurmctld and slurmd with setsid, each tracked by a PID file under the state directory.
# Then waits until `sinfo` reports the node idle and `sacct` answers. Needs root.
#
# Idempotent: when everything is up and the config is unchanged, a rerun only checks and exits;
# daemons that died are started again; a changed config restarts the Slurm daemons.
# Stop with tools/slurm_down.sh.
#
# Usage: tools/slurm_up.sh [--nodes N]
# Environment:
#   SWE_MEGATRON_SLURM_DIR        state dir (PID files, logs, DB, spool); default /var/lib/swe-megatron-slurm
#   SWE_MEGATRON_SLURM_FAKE_GPUS  fake GPUs declared as gres gpu (/dev/fake_nvidiaN); default 2, 0 = none
#   SWE_MEGATRON_SLURM_DB_PORT    MariaDB TCP port on 127.0.0.1; default 3307
#   SWE_MEGATRON_SLURM_CLUSTER    Slurm ClusterName; default swemegatron
set -euo pipefail

state=${SWE_MEGATRON_SLURM_DIR:-/var/lib/swe-megatron-slurm}
fake_gpus=${SWE_MEGATRON_SLURM_FAKE_GPUS:-2}
db_port=${SWE_MEGATRON_SLURM_DB_PORT:-3307}
cluster=${SWE_MEGATRON_SLURM_CLUSTER:-swemegatron}
conf_dir=/etc/slurm
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pids=$state/pids
logs=$state/log

log() { echo "slurm_up: $*"; }
die() { echo "slurm_up: ERROR: $*" >&2; exit 1; }
now() { date +%s.%N; }

nodes=1
while (($#)); do
  case $1 in
    --nodes) nodes=${2:-} && shift 2 || die "--nodes needs a number, e.g. --nodes 3" ;;
    --nodes=*) nodes=${1#--nodes=} && shift ;;
    *) die "unknown argument '$1'; usage: tools/slurm_up.sh [--nodes N]" ;;
  esac
done
[[ $nodes =~ ^[0-9]+$ ]] && ((nodes >= 1 && nodes <= 64)) || die "--nodes $nodes: want a number from 1 to 64"

[[ $(id -u) == 0 ]] || die "must run as root (it installs packages and starts system daemons); rerun with sudo"
[[ $fake_gpus =~ ^[0-9]+$ ]] || die "SWE_MEGATRON_SLURM_FAKE_GPUS=$fake_gpus is not a number; use e.g. 2, or 0 for no fake GPUs"
[[ $cluster =~ ^[a-z][a-z0-9_]*$ ]] || die "SWE_MEGATRON_SLURM_CLUSTER=$cluster must be lowercase letters/digits/_"

# ---------------------------------------------------------------------------------------------
# 1. Install (skipped when all binaries are present).
# ---------------------------------------------------------------------------------------------
# ip (iproute2), nsenter and unshare (util-linux) make the namespaced nodes of --nodes N > 1.
need_bins=(munged mungekey slurmctld slurmd slurmdbd sinfo sacct sacctmgr mariadbd mariadb mariadb-install-db ip nsenter
  unshare)
missing=()
for b in "${need_bins[@]}"; do
  command -v "$b" >/dev/null 2>&1 || [[ -x /usr/sbin/$b ]] || missing+=("$b")
done
if ((${#missing[@]})); then
  log "installing Debian packages (missing: ${missing[*]})"
  t_install=$(now)
  pkgs=(slurm-wlm slurmdbd slurm-client munge mariadb-server mariadb-client iproute2 util-linux)
  # Keep package maintainer scripts from starting daemons (we start our own, without systemd).
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
  fi
  trap '[[ $made_policy == 1 ]] && rm -f "$policy"' EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt_install() { apt-get install -y -q --no-install-recommends "${pkgs[@]}" >"/tmp/slurm_up.apt.log" 2>&1; }
  if ! apt_install; then
    apt-get update -q >>/tmp/slurm_up.apt.log 2>&1 || true
    apt_install || die "apt-get install ${pkgs[*]} failed (see /tmp/slurm_up.apt.log); check the Debian mirror / apt sources"
  fi
  [[ $made_policy == 1 ]] && rm -f "$policy"
  trap - EXIT
  log "install took $(awk -v a="$t_install" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}') s"
fi
export PATH=/usr/sbin:/sbin:$PATH

t0=$(now)
mkdir -p "$state" "$pids" "$logs" "$state/slurmctld" "$state/slurmd" "$state/run"
chmod 755 "$state"

# ---------------------------------------------------------------------------------------------
# Daemon bookkeeping: our daemons run in the foreground under setsid; $! is the daemon's PID
# (a background job of a non-interactive shell is no process-group leader, so setsid does not fork).
# A PID counts as ours while /proc/PID/comm is the daemon's name and it is no zombie (guards against
# PID reuse; comm, unlike /proc/PID/exe, stays readable while a daemon is shutting down).
# ---------------------------------------------------------------------------------------------
comm_of() { case $1 in mysqld) echo mariadbd ;; slurmd-*) echo slurmd ;; *) echo "$1" ;; esac; }
running() { # pid comm -> is that process alive (not a zombie) with that name
  local stat
  [[ $(cat "/proc/$1/comm" 2>/dev/null) == "$2" ]] || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}
pid_of() { # name -> PID if our daemon is alive, else nothing (status 1)
  local f=$pids/$1.pid pid
  [[ -s $f ]] || return 1
  pid=$(<"$f")
  running "$pid" "$(comm_of "$1")" || return 1
  echo "$pid"
}
alive() { pid_of "$1" >/dev/null; }
start_daemon() { # name cmd... : start in its own session, logs to $logs/name.out
  local name=$1
  shift
  setsid "$@" </dev/null >>"$logs/$name.out" 2>&1 &
  echo $! >"$pids/$name.pid"
  log "started $name (pid $!)"
}
stop_daemon() {
  local name=$1 pid i
  pid=$(pid_of "$name") || { rm -f "$pids/$name.pid"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do alive "$name" || break; sleep 0.1; done
  if alive "$name"; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.2; fi
  rm -f "$pids/$name.pid"
  log "stopped $name (pid $pid)"
}
foreign_check() { # refuse to start a second copy next to one we did not start
  local name=$1 proc=$2 others="" p ours
  ours=" $(cat "$pids"/*.pid 2>/dev/null | tr '\n' ' ' || true) "
  for p in $(pgrep -x "$proc" || true); do
    [[ $ours == *" $p "* ]] || ! running "$p" "$proc" || others+=" $p"
  done
  [[ -n $others ]] || return 0
  die "$proc is already running (pid${others}) but was not started by slurm_up.sh (no matching $pids/$1.pid). Stop it (kill${others}) and rerun."
}
tail_log() {
  local f
  for f in "$@"; do [[ -s $f ]] && { echo "--- last lines of $f:" >&2; tail -n 15 "$f" >&2; }; done
  return 0
}
wait_for() { # seconds daemon cmd... : poll cmd every 0.2 s until it succeeds; fail early if daemon died
  local secs=$1 daemon=$2 i
  shift 2
  for ((i = 0; i < secs * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    ((i < 5)) || alive "$daemon" || { log "$daemon exited during startup"; return 1; }
    sleep 0.2
  done
  return 1
}

# ---------------------------------------------------------------------------------------------
# 2. Configuration (files rewritten only when their content changes).
# ---------------------------------------------------------------------------------------------
config_changed=0
write_if_changed() { # path mode content
  local path=$1 mode=$2 content=$3
  if [[ ! -f $path ]] || [[ $(<"$path") != "$content" ]]; then
    mkdir -p "$(dirname "$path")"
    (umask 077 && printf '%s\n' "$content" >"$path.tmp")
    chmod "$mode" "$path.tmp"
    mv -f "$path.tmp" "$path"
    config_changed=1
  fi
  return 0
}

host=$(hostname -s)
getent hosts "$host" >/dev/null \
  || die "hostname '$host' does not resolve (slurmctld and slurmd need it); add a line '127.0.1.1 $host' to /etc/hosts"
# slurmd -C prints e.g. "NodeName=vm CPUs=2 Boards=1 ... RealMemory=23990" (+ an UpTime line).
node_hw=$(slurmd -C 2>/dev/null | head -n 1)
[[ $node_hw == NodeName=* ]] || die "slurmd -C did not describe this machine (got: '$node_hw'); check the slurmd install"
real_mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node_hw")
cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node_hw")
# Declare 2% less memory than seen, so a slightly smaller reading after a reboot does not drain the node.
mem=$((real_mem - real_mem / 50))
node_hw=${node_hw/RealMemory=$real_mem/RealMemory=$mem}
def_mem=$((mem / cpus))

gres_node="" gres_types=""
gres_conf="# written by tools/slurm_up.sh"
if ((fake_gpus > 0)); then
  for ((i = 0; i < fake_gpus; i++)); do
    dev=/dev/fake_nvidia$i
    if [[ ! -c $dev ]]; then
      rm -f "$dev"
      mknod -m 666 "$dev" c 1 3 \
        || die "cannot create fake GPU device $dev (mknod c 1 3, like /dev/null); run without fake GPUs: SWE_MEGATRON_SLURM_FAKE_GPUS=0"
    fi
  done
  gres_node=" Gres=gpu:$fake_gpus"
  gres_types=$'GresTypes=gpu\nAccountingStorageTRES=gres/gpu' # sacct then shows AllocTRES gres/gpu=N
fi

# One node (the host) or N namespaced nodes smn1..smnN (tools/slurm_node.sh makes their network).
bridge_ip=10.77.0.1
if ((nodes == 1)); then
  node_names=("$host") node_list=$host ctl_host=$host acct_host=$host kind="single-node"
  spool_dir=$state/slurmd slurmd_pid=$state/run/slurmd.pid slurmd_log=$logs/slurmd.log
  node_lines="$node_hw$gres_node State=UNKNOWN"
else
  # slurmds (and job steps) reach slurmctld and slurmdbd at the bridge's host address.
  node_list="smn[1-$nodes]" ctl_host="$host($bridge_ip)" acct_host=$bridge_ip kind="$nodes-node"
  spool_dir=$state/slurmd/%n slurmd_pid=$state/run/slurmd-%n.pid slurmd_log=$logs/slurmd-%n.log
  node_names=() node_lines=""
  for ((k = 1; k <= nodes; k++)); do
    node_names+=("smn$k")
    # Each node declares the whole machine's CPUs and memory: oversubscribed on purpose (test cluster).
    node_lines+="${node_hw/NodeName=* CPUs=/NodeName=smn$k NodeAddr=10.77.0.$((10 + k)) CPUs=}$gres_node State=UNKNOWN"$'\n'
  done
  node_lines=${node_lines%$'\n'}
fi
((fake_gpus > 0)) && gres_conf+=$'\n'"NodeName=$node_list Name=gpu File=/dev/fake_nvidia[0-$((fake_gpus - 1))]"

db_pass_file=$state/db_password
if [[ ! -s $db_pass_file ]]; then
  (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$db_pass_file")
fi
db_pass=$(<"$db_pass_file")

write_if_changed "$conf_dir/slurm.conf" 644 "# written by tools/slurm_up.sh: $kind test cluster, state in $state
ClusterName=$cluster
SlurmctldHost=$ctl_host
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$def_mem
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_interval=5
EnforcePartLimits=ALL
DependencyParameters=kill_invalid_depend
JobRequeue=1
ReturnToService=2
KillWait=5
InactiveLimit=0
MinJobAge=300
SlurmdTimeout=60
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$acct_host
JobCompType=jobcomp/none
MailProg=/bin/true
$gres_types
StateSaveLocation=$state/slurmctld
SlurmdSpoolDir=$spool_dir
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$slurmd_log
SlurmctldDebug=info
SlurmdDebug=info
$node_lines
PartitionName=debug Nodes=$node_list Default=YES MaxTime=INFINITE State=UP"
write_if_changed "$conf_dir/gres.conf" 644 "$gres_conf"
write_if_changed "$conf_dir/slurmdbd.conf" 600 "# written by tools/slurm_up.sh
AuthType=auth/munge
DbdHost=$host
SlurmUser=root
PidFile=$state/run/slurmdbd.pid
LogFile=$logs/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=$db_pass
StorageLoc=slurm_acct_db"

slurmd_names() { # the slurmd PID-file names of this run's nodes (slurmd, or slurmd-smnK)
  if ((nodes == 1)); then echo slurmd; else printf 'slurmd-%s\n' "${node_names[@]}"; fi
}
if ((config_changed)); then
  old_slurmds=$(cd "$pids" && ls slurmd*.pid 2>/dev/null | sed 's/\.pid$//' || true)
  for name in $old_slurmds slurmctld slurmdbd; do
    alive "$name" && log "config changed: restarting the Slurm daemons" && break
  done
  for name in $old_slurmds slurmctld slurmdbd; do stop_daemon "$name"; done
fi
"$here/slurm_node.sh" net "$nodes"
echo "$nodes" >"$state/nodes.tmp" && mv -f "$state/nodes.tmp" "$state/nodes"

started=0

# ---------------------------------------------------------------------------------------------
# 3. munged
# ---------------------------------------------------------------------------------------------
munge_ok() { munge -n </dev/null | unmunge >/dev/null; }
if ! alive munged; then
  foreign_check munged munged
  [[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 755 /run/munge
  install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
  rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
  start_daemon munged setpriv --reuid=munge --regid=munge --init-groups -- "$(command -v munged)" --foreground
  started=1
  wait_for 10 munged munge_ok || { tail_log "$logs/munged.out" /var/log/munge/munged.log; die "munged did not answer within 10 s (munge -n | unmunge)"; }
fi

# ---------------------------------------------------------------------------------------------
# 4. MariaDB (own datadir and socket under $state, TCP on 127.0.0.1:$db_port)
# ---------------------------------------------------------------------------------------------
db_dir=$state/mysql
db_sock=$state/mysql-run/mysqld.sock
db_ok() { mariadb-admin --no-defaults --socket="$db_sock" -uroot ping; }
if ! alive mysqld; then
  install -d -o mysql -g mysql -m 755 "$state/mysql-run"
  if [[ ! -d $db_dir/mysql ]]; then
    log "initialising MariaDB datadir $db_dir"
    rm -rf "$db_dir"
    mariadb-install-db --no-defaults --datadir="$db_dir" --user=mysql --auth-root-authentication-method=socket \
      --skip-test-db >"$logs/mysqld-install.log" 2>&1 \
      || { tail_log "$logs/mysqld-install.log"; die "mariadb-install-db failed"; }
  fi
  if ss -ltnH "sport = :$db_port" 2>/dev/null | grep -q .; then
    die "TCP port 127.0.0.1:$db_port is taken by another process; pick another: SWE_MEGATRON_SLURM_DB_PORT=NNNN"
  fi
  start_daemon mysqld "$(command -v mariadbd)" --no-defaults --user=mysql --datadir="$db_dir" \
    --socket="$db_sock" --pid-file="$state/mysql-run/mysqld.pid" --port="$db_port" --bind-address=127.0.0.1 \
    --skip-name-resolve --log-error="$logs/mysqld.log" --innodb-buffer-pool-size=128M \
    --innodb-log-file-size=64M --innodb-lock-wait-timeout=900 --max-connections=100
  started=1
  wait_for 30 mysqld db_ok || { tail_log "$logs/mysqld.out" "$logs/mysqld.log"; die "MariaDB did not answer within 30 s on $db_sock"; }
fi
db_sql="CREATE DATABASE IF NOT EXISTS slurm_acct_db;"
for h in localhost 127.0.0.1; do
  db_sql+="CREATE USER IF NOT EXISTS 'slurm'@'$h' IDENTIFIED BY '$db_pass';"
  db_sql+="ALTER USER 'slurm'@'$h' IDENTIFIED BY '$db_pass';"
  db_sql+="GRANT ALL ON slurm_acct_db.* TO 'slurm'@'$h';"
done
mariadb --no-defaults --socket="$db_sock" -uroot -e "$db_sql" \
  || die "could not create the slurm_acct_db database/user in MariaDB (socket $db_sock); see $logs/mysqld.log"

# ---------------------------------------------------------------------------------------------
# 5. slurmdbd, then the cluster record, slurmctld and slurmd
# ---------------------------------------------------------------------------------------------
dbd_ok() { sacctmgr -n -P list cluster format=cluster; }
if ! alive slurmdbd; then
  foreign_check slurmdbd slurmdbd
  start_daemon slurmdbd "$(command -v slurmdbd)" -D
  started=1
  # The first start creates the accounting tables (a few seconds).
  wait_for 60 slurmdbd dbd_ok || { tail_log "$logs/slurmdbd.out" "$logs/slurmdbd.log"; die "slurmdbd did not answer within 60 s (sacctmgr list cluster)"; }
fi
if ! sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "$cluster"; then
  sacctmgr -i add cluster "$cluster" >/dev/null || die "sacctmgr add cluster $cluster failed; see $logs/slurmdbd.log"
  log "registered cluster $cluster in slurmdbd"
fi

if ! alive slurmctld; then
  foreign_check slurmctld slurmctld
  start_daemon slurmctld "$(command -v slurmctld)" -D
  started=1
  wait_for 30 slurmctld scontrol ping || { tail_log "$logs/slurmctld.out" "$logs/slurmctld.log"; die "slurmctld did not answer within 30 s (scontrol ping)"; }
fi
for name in $(slurmd_names); do
  alive "$name" && continue
  foreign_check "$name" slurmd
  if ((nodes == 1)); then
    start_daemon slurmd "$(command -v slurmd)" -D
  else
    # The node's own network namespace (made by slurm_node.sh) and a new UTS namespace with its hostname.
    # Not `ip netns exec`: that remounts /sys privately and hides /sys/fs/cgroup from the job steps.
    n=${name#slurmd-}
    start_daemon "$name" nsenter --net="/run/netns/$n" unshare --uts \
      sh -c "hostname $n && exec $(command -v slurmd) -D -N $n"
  fi
  started=1
done

node_states() { sinfo -h -N -n "$node_list" -o %T 2>/dev/null; }
nodes_ready() { # every node of the partition in a ready state
  local st ready=0
  for st in $(node_states); do
    [[ $st =~ ^(idle|mixed|allocated|completing)$ ]] || return 1
    ready=$((ready + 1))
  done
  ((ready == nodes))
}
slurmds_alive() { local name; for name in $(slurmd_names); do alive "$name" || return 1; done; }
resumed=0
for ((i = 0; i < 150; i++)); do
  nodes_ready && break
  ((i < 5)) || slurmds_alive || break
  # A node left down/drained by an earlier run (e.g. "Not responding") is brought back once.
  if ((!resumed && i >= 15)) && [[ $(node_states) =~ (down|drain) ]]; then
    scontrol update nodename="$node_list" state=resume >/dev/null 2>&1 || true
    resumed=1
  fi
  sleep 0.2
done
nodes_ready || {
  tail_log "$logs"/slurmd*.out "$logs"/slurmd*.log "$logs/slurmctld.log"
  die "nodes $node_list are '$(node_states | tr '\n' ' ')' (want idle) after 30 s; reasons: $(sinfo -h -N -n "$node_list" -o '%n:%E' 2>/dev/null | tr '\n' ' ')"
}
wait_for 30 slurmdbd sacct -n -X -S now-1minutes -o JobID || die "sacct does not answer (accounting broken); see $logs/slurmdbd.log and $logs/slurmctld.log"

elapsed=$(awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}')
if ((started)); then
  log "cluster $cluster up: $nodes node(s) $node_list idle, partition debug, $fake_gpus fake GPU(s) each; start took $elapsed s"
else
  log "already up (nothing to do): $nodes node(s) $node_list idle; check took $elapsed s"
fi
log "state, logs and PID files in $state"
