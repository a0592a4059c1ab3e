"""Everything this package reads from a Slurm job's environment, in one class.

    env = SlurmEnv.from_environ()          # LaunchError outside a Slurm job
    env.job_id, env.hostnames, env.node_id, env.rank, env.world_size
    env.torch_env(master_port=...)         # MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK for torch.distributed

Nothing else in swe_megatron reads SLURM_* variables (design.md: only launch/ reads the environment).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from swe_megatron.errors import UsageError


class LaunchError(UsageError):
    """A launch problem the user can fix (not in a Slurm job, allocation smaller than the config, ...)."""


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list ("gpu[01-03,07],login1") as host names, in order.

    Same result as `scontrol show hostnames`, without calling it (works in any step and in tests).
    """
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", nodelist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not m:
            hosts.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo)
            for n in range(int(lo), int(hi) + 1):
                hosts.append(f"{prefix}{n:0{width}d}{suffix}")
    return hosts


@dataclass(frozen=True)
class SlurmEnv:
    """The Slurm job (and step) this process runs in."""

    job_id: str
    """SLURM_JOB_ID (for array jobs, ARRAYJOB_TASK)."""
    hostnames: tuple[str, ...]
    """Nodes of the job's allocation, in Slurm's order (SLURM_JOB_NODELIST expanded)."""
    node_id: int
    """Index of this node in the allocation (SLURM_NODEID)."""
    rank: int
    """Global task index in the current step (SLURM_PROCID)."""
    world_size: int
    """Tasks in the current step (SLURM_NTASKS)."""
    local_rank: int
    """Task index on this node (SLURM_LOCALID)."""
    local_world_size: int
    """Tasks of this step on this node (first field of SLURM_TASKS_PER_NODE)."""
    step_hostnames: tuple[str, ...]
    """Nodes of the current step (SLURM_STEP_NODELIST, else the job's)."""
    restart_count: int
    """How often the job was requeued (SLURM_RESTART_COUNT; 0 on the first run)."""
    submit_dir: str
    """Folder sbatch was called from (SLURM_SUBMIT_DIR)."""
    partition: str
    """Partition the job runs in (SLURM_JOB_PARTITION)."""
    cpus_on_node: int
    """CPUs allocated on this node (SLURM_CPUS_ON_NODE)."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SlurmEnv:
        """Read the environment; LaunchError naming what is missing when not inside a Slurm job."""
        env = os.environ if environ is None else environ
        if not env.get("SLURM_JOB_ID") or not env.get("SLURM_JOB_NODELIST"):
            raise LaunchError(
                "not inside a Slurm job (SLURM_JOB_ID / SLURM_JOB_NODELIST unset): submit with "
                "`sbatch slurm/stage2.sbatch` or `swe-megatron launch CONFIG --cluster slurm`"
            )
        job_id = env["SLURM_JOB_ID"]
        if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
            job_id = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
        hosts = tuple(expand_nodelist(env["SLURM_JOB_NODELIST"]))
        step_hosts = (
            tuple(expand_nodelist(env["SLURM_STEP_NODELIST"])) if env.get("SLURM_STEP_NODELIST") else hosts
        )
        per_node = re.match(
            r"\d+", env.get("SLURM_TASKS_PER_NODE", "") or env.get("SLURM_STEP_TASKS_PER_NODE", "")
        )
        return cls(
            job_id=job_id,
            hostnames=hosts,
            node_id=int(env.get("SLURM_NODEID", 0)),
            rank=int(env.get("SLURM_PROCID", 0)),
            world_size=int(env.get("SLURM_NTASKS", 1)),
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=int(per_node.group()) if per_node else 1,
            step_hostnames=step_hosts,
            restart_count=int(env.get("SLURM_RESTART_COUNT", 0)),
            submit_dir=env.get("SLURM_SUBMIT_DIR", os.getcwd()),
            partition=env.get("SLURM_JOB_PARTITION", ""),
            cpus_on_node=int(env.get("SLURM_CPUS_ON_NODE", 1)),
        )

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> SlurmEnv | None:
        """The job's environment, or None outside Slurm."""
        try:
            return cls.from_environ(environ)
        except LaunchError:
            return None

    @property
    def hostname(self) -> str:
        """This node's name in the allocation."""
        return self.hostnames[self.node_id] if self.node_id < len(self.hostnames) else os.uname().nodename

    def master_port(self, base: int = 20000) -> int:
        """A TCP port for torch.distributed derived from the job id (jobs sharing a node do not collide)."""
        digits = re.sub(r"\D", "", self.job_id) or "0"
        return base + int(digits) % 20000

    def torch_env(self, master_port: int | None = None) -> dict[str, str]:
        """torch.distributed env:// variables for this task: rank 0 of the step is the master."""
        return {
            "MASTER_ADDR": self.step_hostnames[0],
            "MASTER_PORT": str(master_port or self.master_port()),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
        }
