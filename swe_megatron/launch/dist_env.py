"""The torch.distributed environment a launcher gives each trainer rank (torchrun, or srun via slurm_env.py).

    env = DistEnv.from_environ()     # None when this process was started alone (WORLD_SIZE unset)
    env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port

The pipeline reads it through this class only (design.md: only launch/ reads the environment).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from swe_megatron.launch.slurm_env import LaunchError

_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistEnv:
    """One trainer rank's place in a multi-process launch."""

    rank: int
    """Global rank (RANK)."""
    world_size: int
    """Trainer ranks in all (WORLD_SIZE)."""
    local_rank: int
    """Rank on this node (LOCAL_RANK; picks the GPU)."""
    master_addr: str
    """Host of rank 0's rendezvous store (MASTER_ADDR)."""
    master_port: int
    """Port of that store (MASTER_PORT)."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> DistEnv | None:
        """The launch's variables, None without WORLD_SIZE; LaunchError naming what is missing if partial."""
        env = os.environ if environ is None else environ
        if not env.get("WORLD_SIZE"):
            return None
        missing = [k for k in _KEYS if not env.get(k)]
        if missing:
            raise LaunchError(
                f"WORLD_SIZE is set but {', '.join(missing)} is not: start the ranks with torchrun or "
                "`swe-megatron job-step trainer` (srun), which set all of " + ", ".join(_KEYS)
            )
        return cls(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            master_addr=env["MASTER_ADDR"],
            master_port=int(env["MASTER_PORT"]),
        )
