"""Each job step's GPU request, read the way Slurm reads it (srun(1) and sbatch(1) of Slurm 22.05.8, the
version tools/slurm_up.sh installs from Debian 12: slurm-client 22.05.8-4+deb12u3).

What the check models, each sentence from those man pages:
- sbatch(1) OUTPUT ENVIRONMENT VARIABLES: SLURM_GPUS_PER_NODE "Requested GPU count per allocated node. Only
  set if the --gpus-per-node option is specified" (likewise SLURM_GPUS, SLURM_GPUS_PER_TASK, SLURM_GPU_BIND,
  SLURM_NTASKS_PER_NODE): the batch step of slurm/*.sbatch (#SBATCH --gpus-per-node=8) exports them.
- srun(1) INPUT ENVIRONMENT VARIABLES: SLURM_GPUS_PER_NODE "Same as --gpus-per-node" (and the others), and
  "Command line options always override environment variable settings": a step inherits each of them
  unless it passes that same option itself.
- srun(1) --gpus-per-task: "will implicitly set --gpu-bind=per_task:<gpus_per_task>"; --gpu-bind: "By
  default every spawned task can access every GPU allocated to the step"; none: "Do not bind tasks to
  GPUs"; per_task:<n>: "Each task will be bound to the number of gpus specified in <gpus_per_task>. Gpus are
  assigned in order to tasks"; mask_gpu:<list>: "the lowest task ID on each node is mapped to the first mask
  specified in the list, etc.", with "a map with an asterisk and repetition count" ("mask_gpu:0x0f*4,0xf0*4");
  "GPU binding is ignored if there is only one task".
- Measured on tools/slurm_up.sh's cluster (22.05.8, 2 fake GPUs per node, 2 tasks, --gpus-per-node=2): no
  --gpu-bind gives both tasks CUDA_VISIBLE_DEVICES=0,1; none leaves it unset (the node's every GPU visible);
  per_task:1 gives 0 and 1; mask_gpu:0x3 and mask_gpu:0x3*2 give 0,1 to both; --gpus-per-task=1 gives 0 and 1;
  and with one task and one GPU, mask_gpu:0x1*1 gives 0.
- srun(1) --ntasks-per-node: "If used with the --ntasks option, the --ntasks option will take precedence and
  the --ntasks-per-node will be treated as a maximum count of tasks per node."

A step mixing an inherited --gpus-per-node with its own --gpus-per-task (two GPU counts that different Slurm
versions combine differently: issue 26) is refused here: each step's effective request has one GPU count.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from swe_megatron.config.load import load_config
from swe_megatron.config.validate import validate
from swe_megatron.launch.layout import job_layout
from swe_megatron.train.command import load_model_preset
from swe_megatron.train.memory_plan import plan_layouts

REPO = Path(__file__).resolve().parents[2]
NODES = [f"n{i}" for i in range(1, 17)]
# sbatch option -> the variable sbatch exports for it (sbatch(1)), which srun reads as the same option (srun(1))
INHERITED = {
    "--gpus": "SLURM_GPUS",
    "--gpus-per-node": "SLURM_GPUS_PER_NODE",
    "--gpus-per-task": "SLURM_GPUS_PER_TASK",
    "--gpu-bind": "SLURM_GPU_BIND",
    "--ntasks-per-node": "SLURM_NTASKS_PER_NODE",
}
GPU_COUNTS = ("--gpus", "--gpus-per-node", "--gpus-per-task")
NODE_GPUS = 8  # cluster/h200-16x8


def _options(argv) -> dict[str, str]:
    return dict((a.split("=", 1) + [""])[:2] for a in argv if a.startswith("--"))


def batch_environment(sbatch_options: dict[str, str]) -> dict[str, str]:
    """What the batch step exports of its own options and srun reads back (see module docstring)."""
    return {INHERITED[k]: v for k, v in sbatch_options.items() if k in INHERITED}


def effective(step_argv: list[str], environ: dict[str, str]) -> dict[str, str]:
    """The options srun runs a step with: the inherited ones, each overridden by the step's own."""
    out = {opt: environ[var] for opt, var in INHERITED.items() if var in environ}
    out.update(_options(step_argv))
    return out


def visible_gpus(opts: dict[str, str]) -> list[list[int]]:
    """GPU indices (of the step's GPUs on one node) each task on the fullest node sees."""
    tasks = int(opts["--ntasks-per-node"])
    per_node = {
        "--gpus-per-node": lambda n: n,
        "--gpus-per-task": lambda n: n * tasks,
    }
    ((count,),) = [[k for k in GPU_COUNTS if k in opts]]
    gpus = per_node[count](int(opts[count]))
    bind = opts.get("--gpu-bind", f"per_task:{opts[count]}" if count == "--gpus-per-task" else "none")
    if tasks == 1:
        return [list(range(gpus))]
    if bind.startswith("mask_gpu:"):  # masks for the node's tasks in order; "MASK*N" repeats one N times
        masks = [m for item in bind.removeprefix("mask_gpu:").split(",")
                 for m in [int(item.split("*")[0], 16)] * int((item.split("*") + ["1"])[1])]  # fmt: skip
        assert len(masks) >= tasks, f"{bind}: fewer masks than the node's {tasks} tasks"
        return [[i for i in range(m.bit_length()) if m >> i & 1] for m in masks[:tasks]]
    if bind == "none":  # no CUDA_VISIBLE_DEVICES at all: every GPU of the node (measured on 22.05)
        return [list(range(NODE_GPUS))] * tasks
    n = int(bind.removeprefix("per_task:"))
    return [list(range(t * n, (t + 1) * n)) for t in range(tasks)]


def _sbatch_directives(script: Path) -> dict[str, str]:
    return _options(re.findall(r"^#SBATCH (\S+)", script.read_text(), re.M))


SHAPES = {
    # the paper preset and uneven shapes: ranks not filling a node's GPUs, ranks not dividing the nodes,
    # servers not dividing the engine nodes
    "paper": [],
    "48 ranks on 8 nodes": ["parallel.world_size=48"],
    "9 ranks on 2 nodes": ["parallel.tensor_parallel=1", "parallel.sequence_parallel=false",
                           "parallel.world_size=9", "cluster.trainer_nodes=2"],
    "3 servers of TP 4 on 2 nodes": ["engine.num_servers=3", "cluster.engine_nodes=2"],
    "3 servers of TP 2 on 2 nodes": ["engine.num_servers=3", "engine.tensor_parallel_size=2",
                                     "cluster.engine_nodes=2"],
}  # fmt: skip


def _planner_shapes() -> dict[str, list[str]]:
    """Every layout `swe-megatron plan --model qwen2.5-72b-instruct --context 131072 --gpus 64` proposes that
    fits (the paper's model, stage-2 context and 8 trainer nodes of 8 GPUs)."""
    fits = [x for x in plan_layouts(load_model_preset("qwen2.5-72b-instruct"), 131072, 64) if x.fits]
    assert len(fits) >= 2, fits  # TP8 PP1 CP1 DP8 and TP8 PP2 CP4 DP1 among them (configs/paper-72b.yaml)
    return {
        f"plan TP{x.tp} PP{x.pp} CP{x.cp} DP{x.dp}": [
            f"parallel.tensor_parallel={x.tp}", f"parallel.pipeline_parallel={x.pp}",
            f"parallel.context_parallel={x.cp}", f"parallel.sequence_parallel={str(x.tp > 1).lower()}",
        ]
        for x in fits
    }  # fmt: skip


PLANNED = _planner_shapes()


@pytest.fixture(scope="module")
def paper():
    return load_config("paper-72b")


def _shaped(base, overrides: list[str], run_dir: Path):
    """base with overrides, validated like load_config (merging is ~10x faster than loading each time)."""
    cfg = OmegaConf.merge(base, OmegaConf.from_dotlist([*overrides, f"run_dir={run_dir}"]))
    assert validate(cfg) == [], overrides
    return cfg


@pytest.mark.parametrize("shape", [*SHAPES, *PLANNED])
def test_every_step_has_one_gpu_count_and_an_explicit_binding(tmp_path, paper, shape):
    """Under the batch environment of each slurm/*.sbatch (#SBATCH --gpus-per-node=8): the trainer's ranks of a
    node see all of that node's trainer GPUs (one each, picked by LOCAL_RANK), each vLLM server sees exactly its
    own tensor-parallel GPUs, the sandbox servers none; no node's steps ask for more GPUs than it has."""
    cfg = _shaped(paper, {**SHAPES, **PLANNED}[shape], tmp_path / "run")
    lay = job_layout(cfg, NODES, "77", cpus_per_node=32)
    for script in sorted((REPO / "slurm").glob("*.sbatch")):
        environ = batch_environment(_sbatch_directives(script))
        assert environ["SLURM_GPUS_PER_NODE"] == "8", (
            script
        )  # what makes the check bite: every step inherits it
        steps = {
            role: effective(lay.srun_options(role), environ) for role in ("sandbox", "engine", "trainer")
        }
        for role, opts in steps.items():
            counts = [k for k in GPU_COUNTS if k in opts]
            assert len(counts) == 1, f"{role} step asks for GPUs twice ({counts}): {opts}"
            assert int(opts["--ntasks"]) <= int(opts["--nodes"]) * int(opts["--ntasks-per-node"]), (
                role,
                opts,
            )
            if opts[counts[0]] != "0":
                own = _options(lay.srun_options(role))
                assert "--gpu-bind" in own, f"{role} step relies on the default GPU binding: {own}"
        assert steps["sandbox"]["--gpus-per-node"] == "0"
        trainer = visible_gpus(steps["trainer"])
        assert trainer == [list(range(lay.trainer_tasks_per_node))] * lay.trainer_tasks_per_node, trainer
        engine = visible_gpus(steps["engine"])
        assert [len(g) for g in engine] == [lay.gpus_per_engine] * lay.engines_per_node, engine
        assert len({i for g in engine for i in g}) == lay.gpus_per_engine * lay.engines_per_node  # disjoint
        for role, gpus in (("trainer", trainer), ("engine", engine)):
            used = sorted({i for g in gpus for i in g})  # a step reserves no GPU its tasks do not see
            assert used == list(range(int(steps[role]["--gpus-per-node"]))), (role, gpus, steps[role])
            assert len(used) <= cfg.cluster.gpus_per_node


def test_cpu_jobs_ask_for_no_gpu(tmp_path):
    """`sbatch --gpus-per-node=0 ...` (the CPU clusters): every step passes --gpus-per-node=0 and nothing else."""
    cfg = load_config("embedded", [f"run_dir={tmp_path}/run", "cluster=cpu-3x"])
    lay = job_layout(cfg, ["a", "b", "c"], "9", cpus_per_node=2)
    for role in ("sandbox", "engine", "trainer"):
        opts = effective(lay.srun_options(role), {"SLURM_GPUS_PER_NODE": "0"})
        assert [(k, opts[k]) for k in (*GPU_COUNTS, "--gpu-bind") if k in opts] == [("--gpus-per-node", "0")]
