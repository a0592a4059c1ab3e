"""SPMD: every trainer rank runs the same driver; rank 0 alone drives the iteration (design.md).

Started alone (no WORLD_SIZE in the environment) a run is one process: rank 0 of a world of 1. Started by
torchrun or srun (`swe-megatron job-step trainer`, which sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; read by
launch/dist_env.py), it is parallel.world_size processes; each builds the same Trainer and calls update,
export and save together with the others (train/step.py is SPMD).

Rank 0 alone owns the topology (engines, sandbox servers), the run directory's writes (state.json commits,
trajectories, pool, metrics) and the TensorBoard monitor; the other ranks get stand-ins with the same methods
(`NullTopology`, `NullMonitor`), so the driver and the stages do not branch on the rank. What rank 0 alone
decides or computes goes through `World.lead`: the function runs on rank 0 and its result is broadcast, so
every rank takes the same path: whether the run is complete, the committed state (hence which units are
done), whether a stop was asked for (RUN_DIR/STOP, written on USR2), the training samples and the number of
optimiser steps. An exception on rank 0 there is re-raised on the others (RankZeroFailed) instead of leaving
them waiting for a batch that never comes.

The broadcasts use a gloo group of their own with parallel.driver_timeout_s: the other ranks wait in it
through an iteration's rollouts, much longer than a training collective's timeout (and on GPUs an NCCL wait
would hold the device).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from swe_megatron.errors import RankZeroFailed, UsageError
from swe_megatron.launch.dist_env import DistEnv
from swe_megatron.train import parallel

T = TypeVar("T")
__all__ = ["RankZeroFailed", "World", "start"]


class World:
    """This process's rank among the trainer ranks, and the one way rank 0's decisions reach the others."""

    def __init__(self, rank: int = 0, size: int = 1, group=None):
        self.rank, self.size, self.group = rank, size, group

    @property
    def driver(self) -> bool:
        """Whether this rank drives the iteration (rank 0)."""
        return self.rank == 0

    def lead(self, fn: Callable[..., T], *args, share: Callable[[T], Any] | None = None) -> T:
        """fn(*args) on rank 0, its result on every rank (`share(result)` on the others: what they need of it)."""
        if self.size == 1:
            return fn(*args)
        if not self.driver:
            ok, payload = self._broadcast(None)
            if not ok:
                raise RankZeroFailed(self.rank, payload)
            return payload
        try:
            value = fn(*args)
        except BaseException as e:  # also SystemExit from the SIGTERM handler: let the others stop too
            self._broadcast((False, f"{type(e).__name__}: {e}"))
            raise
        self._broadcast((True, share(value) if share else value))
        return value

    def on_driver(self, make: Callable[..., T], *args, default: T) -> T:
        """make(*args) on rank 0 (no broadcast: e.g. the topology or the monitor), `default` on the others."""
        return make(*args) if self.driver else default

    def _broadcast(self, obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


@contextlib.contextmanager
def start(parallel_cfg, seed: int) -> Iterator[World]:
    """torch.distributed and Megatron-Core's groups for this process (from the launcher's env, or a world of 1),
    torn down at exit. parallel_cfg.world_size must match the launch."""
    env, want = DistEnv.from_environ(), parallel_cfg.world_size
    if env is None and want != 1:
        raise UsageError(
            f"parallel.world_size={want} needs {want} trainer processes, but this one was started alone "
            f"(WORLD_SIZE unset): launch with `torchrun --nproc-per-node {want} -m swe_megatron.cli run ...` "
            "(or the Slurm scripts), or set parallel.world_size=1"
        )
    if env is not None and env.world_size != want:
        raise UsageError(
            f"parallel.world_size={want} but the launcher started WORLD_SIZE={env.world_size} ranks: set "
            f"parallel.world_size={env.world_size} or start {want} ranks"
        )
    # Ranks sharing a CPU machine each get their share of threads (torchrun sets OMP_NUM_THREADS=1).
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))))
    if env is None:
        parallel.init_distributed(0, 1, master_port=parallel.free_port())
    else:
        parallel.init_distributed(env.rank, env.world_size, env.master_addr, env.master_port, env.local_rank)
    try:
        parallel.init_model_parallel(parallel_cfg, seed=seed)
        size = dist.get_world_size()
        group = None
        if size > 1:
            timeout = timedelta(seconds=parallel_cfg.driver_timeout_s)
            group = dist.new_group(backend="gloo", timeout=timeout)
        yield World(dist.get_rank(), size, group)
    finally:
        parallel.destroy()
