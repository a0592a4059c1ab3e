"""A group per sync vs one persistent group: what forming the broadcast weight sync's group costs next to the
broadcast itself, on gloo (CPU), with the real `SyncGroup` (engine/weight_receiver.py).

docs/weight_sync.md ("A group per sync or one for the run") reads these figures. Usage, from the repo root:

    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_sync_group.py
    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_sync_group.py --world 3 5 --mib 1 16 128 --rounds 5

One process per member (rank 0 holds the TCPStore, as the trainer does; the others connect to it, as vLLM's
workers do). Per round and size: `join` (the rendezvous and the first collective, as every sync does),
one broadcast of SIZE MiB from rank 0 (what a persistent group would still pay), then `close`. Prints the
median seconds of each and the share of a per-sync group's total that setup takes. NCCL is not measured here:
its communicator setup (bootstrap, topology search, connections) is a separate and larger cost on GPUs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swe_megatron.engine.weight_receiver import SyncGroup  # noqa: E402

CPU = torch.device("cpu")


def member(rank: int, world: int, port_q, out_q, sizes: list[int], rounds: int) -> None:
    """One member: every round of every size, timing join, broadcast and close (rank 0 reports)."""
    torch.set_num_threads(1)
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=120), wait_for_workers=False)
        for _ in range(world - 1):
            port_q.put(store.port)
    else:
        store = dist.TCPStore("127.0.0.1", port_q.get(), None, False, timedelta(seconds=120))
    rows = []
    for mib in sizes:
        data = torch.full((mib * 2**20 // 4,), float(rank), dtype=torch.float32)
        for r in range(rounds):
            group = SyncGroup(store, f"bench-{mib}-{r}", rank, world, CPU, 120.0)
            t0 = time.perf_counter()
            group.join()
            t1 = time.perf_counter()
            group.broadcast(data)
            t2 = time.perf_counter()
            group.close()
            t3 = time.perf_counter()
            assert float(data[-1]) == 0.0, "the broadcast did not land"
            rows.append((mib, t1 - t0, t2 - t1, t3 - t2))
    store.set(f"done/{rank}", "1")
    if rank == 0:  # the store lives until every member is done with it
        store.wait([f"done/{r}" for r in range(world)])
        out_q.put(rows)


def main() -> int:
    """Run the bench for each world size; print one table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, nargs="+", default=[3, 5], help="members: trainer rank 0 + workers")
    ap.add_argument("--mib", type=int, nargs="+", default=[1, 16, 128], help="broadcast sizes in MiB")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    print("world  MiB   join s  broadcast s  close s  setup share of a per-sync group")
    for world in args.world:
        port_q, out_q = ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=member, args=(r, world, port_q, out_q, args.mib, args.rounds))
                 for r in range(world)]  # fmt: skip
        for p in procs:
            p.start()
        rows = out_q.get(timeout=1800)
        for p in procs:
            p.join(60)
        for mib in args.mib:
            mine = [row for row in rows if row[0] == mib]
            join, bcast, close = (statistics.median(row[i] for row in mine) for i in (1, 2, 3))
            share = (join + close) / (join + bcast + close)
            print(f"{world:5d} {mib:4d} {join:8.4f} {bcast:12.4f} {close:8.4f}  {share:6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
