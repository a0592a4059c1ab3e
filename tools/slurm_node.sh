#!/usr/bin/env bash
# The network of the multi-node test cluster (tools/slurm_up.sh --nodes N), and losing/reviving a node.
#
# Node K (smnK) is a network namespace /run/netns/smnK whose eth0 (10.77.0.(10+K)/24) is a veth pair
# with the host end smvK on the bridge smbr0 (10.77.0.1/24 in the host namespace); its slurmd also has
# its own UTS namespace (hostname smnK). /etc/hosts maps the node names inside a marked block.
#
# Usage: tools/slurm_node.sh net N        make exactly nodes smn1..smnN (N <= 1: remove all of it)
#        tools/slurm_node.sh kill smnK    lose the node: SIGKILL its slurmd and every process in its netns
#        tools/slurm_node.sh revive smnK  start its slurmd again (tools/slurm_up.sh with the current N)
# Environment: SWE_MEGATRON_SLURM_DIR (state dir; default /var/lib/swe-megatron-slurm)
set -euo pipefail

state=${SWE_MEGATRON_SLURM_DIR:-/var/lib/swe-megatron-slurm}
bridge=smbr0
subnet=10.77.0
hosts_begin="# swe-megatron-slurm begin"
hosts_end="# swe-megatron-slurm end"
export PATH=/usr/sbin:/sbin:$PATH

log() { echo "slurm_node: $*"; }
die() { echo "slurm_node: ERROR: $*" >&2; exit 1; }

node_addr() { echo "$subnet.$((10 + ${1#smn}))"; }
valid_node() { [[ $1 =~ ^smn[1-9][0-9]*$ ]] || die "'$1' is not a node name of the multi-node cluster (smn1, smn2, ...)"; }

ns_pids() { # node -> PIDs of every process in its network namespace
  local inode p
  inode=$(stat -L -c %i "/run/netns/$1" 2>/dev/null) || return 0
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/ns/net" 2>/dev/null) == "net:[$inode]" ]] && echo "${p#/proc/}"
  done
  return 0
}

kill_node() { # SIGKILL every process in the node's netns (its slurmd, slurmstepds, job steps), until none is left
  local node=$1 i p left
  for ((i = 0; i < 50; i++)); do
    left=$(ns_pids "$node")
    [[ -n $left ]] || return 0
    for p in $left; do kill -KILL "$p" 2>/dev/null || true; done
    sleep 0.1
  done
  die "processes in the network namespace of $node survive SIGKILL: $(ns_pids "$node" | tr '\n' ' ')"
}

remove_node() { # kill its processes, delete the veth pair and the namespace
  kill_node "$1"
  ip link del "smv${1#smn}" 2>/dev/null || true
  ip netns del "$1" 2>/dev/null || true
  rm -f "$state/pids/slurmd-$1.pid"
  log "removed node $1"
}

add_node() { # create the namespace with eth0 on the bridge (recreated when incomplete)
  local node=$1 veth=smv${1#smn} addr
  addr=$(node_addr "$node")
  [[ -e /run/netns/$node ]] && ip -n "$node" -br addr show dev eth0 2>/dev/null | grep -q "$addr/24" && return 0
  remove_node "$node" >/dev/null
  ip netns add "$node"
  ip link add "$veth" type veth peer name eth0 netns "$node"
  ip link set "$veth" master "$bridge" up
  ip -n "$node" addr add "$addr/24" dev eth0
  ip -n "$node" link set eth0 up
  ip -n "$node" link set lo up
  log "made node $node ($addr, netns /run/netns/$node)"
}

write_hosts() { # hosts-block-lines: replace our block in /etc/hosts (in place: it may be a bind mount)
  local kept
  kept=$(sed "/^$hosts_begin\$/,/^$hosts_end\$/d" /etc/hosts)
  [[ -n $1 ]] && kept+=$'\n'"$hosts_begin"$'\n'"$1"$'\n'"$hosts_end"
  [[ $kept == "$(</etc/hosts)" ]] || printf '%s\n' "$kept" >/etc/hosts
}

net() { # N -> exactly nodes smn1..smnN on the bridge (N <= 1: none, no bridge, no hosts block)
  local n=$1 k node hosts=""
  for node in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^smn[0-9]+$' || true); do
    ((${node#smn} <= n && n > 1)) || remove_node "$node"
  done
  if ((n <= 1)); then
    ip link show "$bridge" >/dev/null 2>&1 && ip link del "$bridge" && log "removed bridge $bridge"
    write_hosts ""
    return 0
  fi
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip -br addr | grep -v "^$bridge " | grep -q " $subnet\." \
      && die "another interface already uses $subnet.0/24: $(ip -br addr | grep " $subnet\.")"
    ip link add "$bridge" type bridge
    log "made bridge $bridge ($subnet.1/24)"
  fi
  ip -br addr show dev "$bridge" | grep -q " $subnet.1/24" || ip addr add "$subnet.1/24" dev "$bridge"
  ip link set "$bridge" up
  for ((k = 1; k <= n; k++)); do
    add_node "smn$k"
    hosts+="$(node_addr "smn$k") smn$k"$'\n'
  done
  write_hosts "${hosts%$'\n'}"
}

[[ $(id -u) == 0 ]] || die "must run as root (it manages network namespaces and daemons); rerun with sudo"
case ${1:-} in
  net)
    [[ ${2:-} =~ ^[0-9]+$ ]] || die "usage: tools/slurm_node.sh net N"
    net "$2"
    ;;
  kill)
    valid_node "${2:-}"
    [[ -e /run/netns/$2 ]] || die "node $2 has no network namespace (is the cluster up with that many nodes?)"
    kill_node "$2"
    log "killed every process of node $2"
    ;;
  revive)
    valid_node "${2:-}"
    [[ -s $state/nodes ]] || die "no $state/nodes: the cluster was not brought up with tools/slurm_up.sh --nodes N"
    exec "$(dirname "${BASH_SOURCE[0]}")/slurm_up.sh" --nodes "$(<"$state/nodes")"
    ;;
  *) die "usage: tools/slurm_node.sh net N | kill smnK | revive smnK" ;;
esac
