"""Which node of a Slurm allocation runs what: trainer ranks, vLLM servers, one sandbox server per node.

    layout = job_layout(cfg, hostnames)      # LaunchError when the allocation does not fit the config
    print(layout.shell())                    # KEY='value' lines that slurm/common.sh evals

The first cluster.trainer_nodes nodes run the trainer (parallel.world_size ranks, rank 0 drives the
iteration), the next cluster.engine_nodes run engine.num_servers vLLM servers of
engine.tensor_parallel_size GPUs each. cluster.engine_nodes=0 means the run starts its own engines next
to the trainer (the single-node CPU case). Every node runs one sandbox server.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from swe_megatron.launch.slurm_env import LaunchError


@dataclass(frozen=True)
class JobLayout:
    """Placement of every role of one job."""

    all_nodes: tuple[str, ...]
    """Every node of the allocation (one sandbox server each)."""
    trainer_nodes: tuple[str, ...]
    """Nodes of the trainer step."""
    trainer_tasks: int
    """Trainer ranks (parallel.world_size)."""
    trainer_tasks_per_node: int
    """Trainer ranks per trainer node."""
    engine_nodes: tuple[str, ...]
    """Nodes of the engine step (empty: the run starts its engines itself)."""
    engines: int
    """vLLM servers started as a job step (0 with no engine nodes)."""
    engines_per_node: int
    """vLLM servers per engine node."""
    gpus_per_engine: int
    """GPUs per vLLM server (engine.tensor_parallel_size)."""
    gpus_per_node: int
    """GPUs per node (cluster.gpus_per_node)."""
    run_dir: str
    """Absolute run directory."""
    job_dir: str
    """Absolute job folder (rendezvous, token, step logs): RUN_DIR/jobs/JOB_ID."""
    log_dir: str
    """Absolute Slurm/submitit log folder."""

    def shell(self) -> str:
        """Shell assignments for slurm/common.sh (values quoted; node lists comma-separated)."""
        values = {
            "ALL_NODES": ",".join(self.all_nodes),
            "N_NODES": len(self.all_nodes),
            "TRAINER_NODES": ",".join(self.trainer_nodes),
            "N_TRAINER_NODES": len(self.trainer_nodes),
            "TRAINER_TASKS": self.trainer_tasks,
            "TRAINER_TASKS_PER_NODE": self.trainer_tasks_per_node,
            "ENGINE_NODES": ",".join(self.engine_nodes),
            "N_ENGINE_NODES": len(self.engine_nodes),
            "N_ENGINES": self.engines,
            "ENGINES_PER_NODE": self.engines_per_node,
            "GPUS_PER_ENGINE": self.gpus_per_engine,
            "GPUS_PER_NODE": self.gpus_per_node,
            "RUN_DIR": self.run_dir,
            "JOB_DIR": self.job_dir,
            "LOG_DIR": self.log_dir,
        }
        return "\n".join(f"{k}={shlex.quote(str(v))}" for k, v in values.items()) + "\n"


def job_layout(cfg, hostnames: list[str] | tuple[str, ...], job_id: str) -> JobLayout:
    """The layout of cfg (a RunConfig) on an allocation; LaunchError naming the key or sbatch option to fix."""
    cl, par, eng = cfg.cluster, cfg.parallel, cfg.engine
    need = cl.trainer_nodes + cl.engine_nodes
    if cl.trainer_nodes < 1:
        raise LaunchError(f"cluster.trainer_nodes={cl.trainer_nodes}: at least one node must run the trainer")
    if len(hostnames) < need:
        raise LaunchError(
            f"the allocation has {len(hostnames)} node(s) ({','.join(hostnames)}) but the config needs "
            f"cluster.trainer_nodes + cluster.engine_nodes = {need}: submit with `sbatch --nodes={need}` "
            "or lower those keys"
        )
    trainer = tuple(hostnames[: cl.trainer_nodes])
    per_node = math.ceil(par.world_size / cl.trainer_nodes)
    if cl.gpus_per_node and per_node > cl.gpus_per_node:
        raise LaunchError(
            f"parallel.world_size={par.world_size} ranks do not fit on cluster.trainer_nodes={cl.trainer_nodes} "
            f"x cluster.gpus_per_node={cl.gpus_per_node} GPUs"
        )
    engine_nodes = tuple(hostnames[cl.trainer_nodes : need])
    engines = per_engine_node = 0
    if engine_nodes:
        if cl.gpus_per_node < eng.tensor_parallel_size:
            raise LaunchError(
                f"engine.tensor_parallel_size={eng.tensor_parallel_size} exceeds cluster.gpus_per_node="
                f"{cl.gpus_per_node}: one vLLM server must fit on one node"
            )
        per_engine_node = max(1, cl.gpus_per_node // max(1, eng.tensor_parallel_size))
        engines = eng.num_servers
        if engines > per_engine_node * len(engine_nodes):
            raise LaunchError(
                f"engine.num_servers={engines} servers of {eng.tensor_parallel_size} GPU(s) do not fit on "
                f"cluster.engine_nodes={len(engine_nodes)} x {cl.gpus_per_node} GPUs; at most "
                f"{per_engine_node * len(engine_nodes)}"
            )
        per_engine_node = math.ceil(engines / len(engine_nodes))
    run_dir = Path(cfg.run_dir).resolve()
    return JobLayout(
        all_nodes=tuple(hostnames),
        trainer_nodes=trainer,
        trainer_tasks=par.world_size,
        trainer_tasks_per_node=per_node,
        engine_nodes=engine_nodes,
        engines=engines,
        engines_per_node=per_engine_node,
        gpus_per_engine=eng.tensor_parallel_size,
        gpus_per_node=cl.gpus_per_node,
        run_dir=str(run_dir),
        job_dir=str(run_dir / "jobs" / job_id),
        log_dir=str(Path(cl.log_dir).resolve() if cl.log_dir else run_dir / "slurm"),
    )
