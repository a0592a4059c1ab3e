"""Everything this package reads from a Slurm job's environment, in one class.

    env = SlurmEnv.from_environ()          # LaunchError outside a Slurm job
    env.job_id, env.hostnames, env.hostname, env.rank, env.world_size
    env.torch_env(master_port=...)         # MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK for torch.distributed

Nothing else in swe_megatron reads SLURM_* variables (design.md: only launch/ reads the environment).

Inside a job step (srun), SLURM_NODEID, SLURM_PROCID, SLURM_NTASKS and SLURM_TASKS_PER_NODE describe the
STEP (srun(1), OUTPUT ENVIRONMENT VARIABLES): a step on the job's nodes 9-16 has SLURM_NODEID 0..7. So a
task's own node is SLURMD_NODENAME (set by slurmd for every task), else the step's node list
(SLURM_STEP_NODELIST) at SLURM_NODEID, never the job's node list at SLURM_NODEID.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from swe_megatron.errors import UsageError


class LaunchError(UsageError):
    """A launch problem the user can fix (not in a Slurm job, allocation smaller than the config, ...)."""


def expand_counts(counts: str) -> list[int]:
    """Slurm's compressed per-node counts ("2(x3),1", SLURM_TASKS_PER_NODE / SLURM_JOB_CPUS_PER_NODE), expanded."""
    out: list[int] = []
    for n, reps in re.findall(r"(\d+)(?:\(x(\d+)\))?", counts):
        out += [int(n)] * int(reps or 1)
    return out


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
    """Index of this node in the current step's node list (SLURM_NODEID: step-relative inside srun)."""
    node_name: str
    """Name of the node running this task (SLURMD_NODENAME; empty when unset)."""
    rank: int
    """Global task index in the current step (SLURM_PROCID)."""
    world_size: int
    """Tasks in the current step (SLURM_NTASKS)."""
    local_rank: int
    """Task index on this node (SLURM_LOCALID)."""
    local_world_size: int
    """Tasks of this step on this node (SLURM_STEP_TASKS_PER_NODE, else SLURM_TASKS_PER_NODE, at node_id)."""
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
    job_cpus_per_node: tuple[int, ...] = ()
    """CPUs of the job on each of its nodes, in hostnames' order (SLURM_JOB_CPUS_PER_NODE; empty if unset)."""

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
        node_id = int(env.get("SLURM_NODEID", 0))
        per_node = expand_counts(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", ""))
        return cls(
            job_id=job_id,
            hostnames=hosts,
            node_id=node_id,
            node_name=env.get("SLURMD_NODENAME", ""),
            rank=int(env.get("SLURM_PROCID", 0)),
            world_size=int(env.get("SLURM_NTASKS", 1)),
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=per_node[node_id] if node_id < len(per_node) else 1,
            step_hostnames=step_hosts,
            restart_count=int(env.get("SLURM_RESTART_COUNT", 0)),
            submit_dir=env.get("SLURM_SUBMIT_DIR", os.getcwd()),
            partition=env.get("SLURM_JOB_PARTITION", ""),
            cpus_on_node=int(env.get("SLURM_CPUS_ON_NODE", 1)),
            job_cpus_per_node=tuple(expand_counts(env.get("SLURM_JOB_CPUS_PER_NODE", ""))),
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
        """This task's node: SLURMD_NODENAME, else the step's node list at the step-relative SLURM_NODEID."""
        if self.node_name:
            return self.node_name
        if self.node_id < len(self.step_hostnames):
            return self.step_hostnames[self.node_id]
        return os.uname().nodename

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
