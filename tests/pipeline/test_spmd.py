"""The SPMD plumbing (pipeline/spmd.py): launch checks, and rank 0's results and failures reaching the others.

The two-rank test runs real gloo ranks in fresh processes (the trainer tests' launcher); nothing is mocked.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from swe_megatron.config.schema import ParallelConfig
from swe_megatron.errors import UsageError
from swe_megatron.launch.dist_env import DistEnv
from swe_megatron.launch.slurm_env import LaunchError
from swe_megatron.pipeline import spmd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train._workers import run_ranks  # noqa: E402

TORCHRUN_ENV = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29400",
    "LOCAL_RANK": "1",
}


def test_dist_env_from_launcher_variables():
    assert DistEnv.from_environ({}) is None
    assert DistEnv.from_environ(TORCHRUN_ENV) == DistEnv(1, 2, 1, "10.0.0.1", 29400)
    with pytest.raises(LaunchError, match="MASTER_ADDR, MASTER_PORT is not"):
        DistEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2"})


def _start(parallel: ParallelConfig) -> None:
    with spmd.start(parallel, seed=0):
        pass


def test_world_size_must_match_the_launch(monkeypatch):
    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(UsageError, match=r"torchrun --nproc-per-node 2 -m swe_megatron.cli run"):
        _start(ParallelConfig(world_size=2))
    for key, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UsageError, match=r"parallel.world_size=4 but the launcher started WORLD_SIZE=2"):
        _start(ParallelConfig(world_size=4, tensor_parallel=2))


def _boom():
    raise ValueError("no sandbox server left")


def _lead_on_two_ranks(rank: int) -> dict:
    import torch.distributed as dist

    world = spmd.World(rank, 2, dist.new_group(backend="gloo"))
    out = {"value": world.lead(lambda: {"samples": [rank, "from rank 0"], "steps": 3})}
    # share: the others get a projection of rank 0's result, rank 0 keeps all of it.
    out["shared"] = world.lead(lambda: ("trajectories", 7), share=lambda r: r[1])
    out["local"] = world.on_driver(lambda: f"made on {rank}", default=None)
    try:
        world.lead(_boom)
    except (ValueError, spmd.RankZeroFailed) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["after"] = world.lead(lambda: "still in step")  # no rank is left behind after a failure
    return out


@pytest.mark.dist
def test_lead_broadcasts_rank_zero_results_and_failures(tmp_path):
    r0, r1 = run_ranks(_lead_on_two_ranks, 2, tmp_path)
    assert r0["value"] == r1["value"] == {"samples": [0, "from rank 0"], "steps": 3}
    assert (r0["shared"], r1["shared"]) == (("trajectories", 7), 7)
    assert (r0["local"], r1["local"]) == ("made on 0", None)
    assert r0["error"] == "ValueError: no sandbox server left"
    assert r1["error"] == "RankZeroFailed: rank 0 failed, so rank 1 stops: ValueError: no sandbox server left"
    assert r0["after"] == r1["after"] == "still in step"
