"""The interconnect check a cluster admin runs before the first multi-node job: which transport NCCL picked
between two nodes, and the bandwidth it gives. TCP sockets are a failure, not a pass.

    # 2 nodes, one GPU each, inside the trainer image (containers/trainer.def), from the repo root:
    srun --nodes=2 --ntasks-per-node=1 --gpus-per-node=1 \
        apptainer exec --nv --bind "$PWD" "$SWE_MEGATRON_IMAGE" python tools/check_interconnect.py
    # the same with all GPUs of each node (intra-node links too): --ntasks-per-node=8 --gpus-per-node=8

Each task joins one torch.distributed NCCL group (rendezvous from the step's Slurm environment, through
swe_megatron.launch.slurm_env, or torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT), times an all-reduce and
a broadcast of --mb MiB (bandwidths as nccl-tests defines them, doc/PERFORMANCE.md: all-reduce bus bandwidth =
size / time x 2 (n - 1) / n, broadcast = size / time), and reads NCCL's own INFO log of this process
(NCCL_DEBUG=INFO, NCCL_DEBUG_FILE: NCCL writes and flushes each line, src/debug.cc) for the transport of every
connection it made:

    host:pid:tid [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA    InfiniBand/RoCE: pass
    host:pid:tid [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0       TCP sockets: FAIL

Exit status (the worst over all ranks, so srun's is the check's): 0 every inter-node connection is RDMA
(NET/IB, or an IB plugin such as HPC-X's NET/IBext); 1 some use TCP sockets (NET/Socket: the image lacks the
InfiniBand user space, NCCL_IB_HCA names no live HCA, or the nodes have none) or a transport this check does
not know; 2 no inter-node connection was seen (all tasks on one node, or no log). What to set when it fails:
slurm/common.sh ("Interconnect") and containers/README.md.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

CONNECTION = re.compile(r"NCCL INFO (?:Channel|Ring) [\d/]+ : .*?\bvia (\S+)")
"""A connection NCCL set up (src/transport.cc: "Channel %02d/%01d : %d[%d] -> %d[%d] [send] via %s"; NCCL 2.4
wrote "Ring 00 : 15 -> 0 [receive] via NET/Socket/0"). The group is its transport: NET/IB/0/GDRDMA, P2P/IPC."""
NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
"""The network plugin NCCL chose for this communicator ("Using network IB", "Using network Socket")."""
NET_DEVICES = re.compile(r"NCCL INFO NET/(\w+) : Using (.*)")
"""The devices of a network ("NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>")."""

PASS, TCP, NOT_SEEN = 0, 1, 2
"""Exit statuses (see the module docstring)."""


@dataclass
class Verdict:
    """What one rank's NCCL log says about its inter-node connections."""

    code: int
    """PASS, TCP or NOT_SEEN."""
    networks: Counter
    """Inter-node connections per network name (IB, IBext_v8, Socket, ...)."""
    message: str
    """One line for the admin."""


def net_name(transport: str) -> str | None:
    """The network of an inter-node transport ("NET/IB/0/GDRDMA" -> "IB"), None for an intra-node one (P2P, SHM)."""
    parts = transport.split("/")
    return parts[1] if parts[0] == "NET" and len(parts) > 1 else None


def is_rdma(network: str) -> bool:
    """NCCL's InfiniBand transport (IB and RoCE HCAs alike) or an IB plugin (HPC-X's IBext, IBext_v8)."""
    return network.startswith("IB")


def verdict(lines: list[str]) -> Verdict:
    """The verdict of one rank's NCCL INFO lines (any prefix before the host:pid:tid part, e.g. srun's -l)."""
    networks = Counter()
    for line in lines:
        if (m := CONNECTION.search(line)) and (net := net_name(m.group(1))) is not None:
            networks[net] += 1
    devices = "; ".join(
        f"NET/{m.group(1)}: {m.group(2).strip()}" for m in map(NET_DEVICES.search, lines) if m
    )
    chosen = sorted({m.group(1) for m in map(NETWORK.search, lines) if m})
    seen = ", ".join(f"{n} x{c}" for n, c in sorted(networks.items()))
    where = f" (NCCL: network {'/'.join(chosen) or '?'}; {devices or 'no NET/ device line'})"
    if not networks:
        return Verdict(NOT_SEEN, networks, "no inter-node connection in NCCL's log: run on 2 nodes" + where)
    slow = sorted(n for n in networks if not is_rdma(n))
    if "Socket" in slow:
        return Verdict(
            TCP, networks,
            f"FAIL: NCCL uses TCP sockets between nodes ({seen}): the image lacks the InfiniBand user space "
            "(libibverbs1, ibverbs-providers), NCCL_IB_HCA names no active HCA, or NCCL_IB_DISABLE is set" + where,
        )  # fmt: skip
    if slow:
        return Verdict(TCP, networks, f"FAIL: transport not known to be RDMA ({seen})" + where)
    return Verdict(PASS, networks, f"ok: RDMA between nodes ({seen})" + where)


def bus_gbps(op: str, nbytes: int, seconds: float, world: int) -> float:
    """nccl-tests' bus bandwidth in GB/s (1e9 bytes/s) of one collective of nbytes that took seconds."""
    algbw = nbytes / seconds / 1e9
    return algbw * 2 * (world - 1) / world if op == "all_reduce" else algbw


def _timed(op, tensor, iters: int, sync) -> float:
    """Seconds per call of op(tensor) after one warm-up call (which also makes NCCL connect)."""
    op(tensor)
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        op(tensor)
    sync()
    return (time.perf_counter() - start) / iters


def _rendezvous() -> None:
    """torchrun's variables when set, else the Slurm step's (launch/slurm_env.py: rank 0's node is the master)."""
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        return
    from swe_megatron.launch.slurm_env import SlurmEnv

    os.environ.update(SlurmEnv.from_environ().torch_env())


def main(argv: list[str] | None = None) -> int:
    """Run the check on this task; returns the exit status (the worst over all ranks)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=1024, help="MiB per collective (default 1024)")
    p.add_argument("--iters", type=int, default=10, help="timed calls per collective")
    args = p.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="nccl-check-"))
    os.environ["NCCL_DEBUG"] = "INFO"  # read by NCCL at its first communicator, below
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    os.environ["NCCL_DEBUG_FILE"] = str(log_dir / "nccl.%h.%p.log")
    _rendezvous()
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    data = torch.ones(args.mb * 2**20 // 4, dtype=torch.float32, device="cuda")
    nbytes = data.numel() * 4
    ops = {"all_reduce": dist.all_reduce, "broadcast": lambda t: dist.broadcast(t, src=0)}
    seconds = {name: _timed(op, data, args.iters, torch.cuda.synchronize) for name, op in ops.items()}
    lines = [
        ln for f in sorted(log_dir.glob("nccl.*.log")) for ln in f.read_text(errors="replace").splitlines()
    ]
    v = verdict(lines)
    host = os.uname().nodename
    print(f"rank {rank}/{world} on {host}: {v.message}", flush=True)
    worst = torch.tensor([v.code], device="cuda")
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if rank == 0:
        for name, s in seconds.items():
            print(f"{name} {args.mb} MiB over {world} GPUs: {s * 1e3:.1f} ms, bus bandwidth "
                  f"{bus_gbps(name, nbytes, s, world):.1f} GB/s", flush=True)  # fmt: skip
        print(
            ["PASS", "FAIL (TCP sockets or unknown transport)", "FAIL (no inter-node link seen)"][int(worst)]
        )
    dist.destroy_process_group()
    return int(worst)


if __name__ == "__main__":
    sys.exit(main())
