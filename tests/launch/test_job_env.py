"""What a job passes to its steps beyond placement: the trainer ranks' allocator settings (launch/steps.py) and
the site's interconnect variables into the image (slurm/common.sh's SM_ENV)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from swe_megatron.launch import steps
from swe_megatron.launch.slurm_env import SlurmEnv

REPO = Path(__file__).resolve().parents[2]
STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n1", "SLURM_JOB_NODELIST": "n1", "SLURM_NODEID": "0",
        "SLURMD_NODENAME": "n1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
        "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1"}  # fmt: skip


def test_trainer_ranks_get_expandable_segments_unless_the_site_sets_its_own():
    env = SlurmEnv.from_environ(STEP)
    assert steps.trainer_env({"PATH": "/bin"}, env)["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert steps.trainer_env({}, env)["RANK"] == "0"  # with torch.distributed's variables
    own = steps.trainer_env({"PYTORCH_ALLOC_CONF": "max_split_size_mb:512"}, env)
    assert own["PYTORCH_ALLOC_CONF"] == "max_split_size_mb:512"
    old_name = steps.trainer_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, env)
    assert (
        "PYTORCH_ALLOC_CONF" not in old_name
    )  # torch reads the new name first: it would override the site's


def _sm_env(**env: str) -> list[str]:
    """slurm/common.sh's SM_ENV (one word a line) after _sm_interconnect, with env added to a bare environment."""
    script = f'source {REPO}/slurm/common.sh; _sm_interconnect >/dev/null; for w in "${{SM_ENV[@]}}"; do echo "$w"; done'
    out = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                         text=True, timeout=30, check=True)  # fmt: skip
    return out.stdout.split("\n")[:-1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_site_interconnect_variables_reach_the_image_and_unset_ones_stay_unset():
    assert _sm_env() == []  # the libraries' defaults: what the CPU test cluster runs with
    assert _sm_env(NCCL_SOCKET_IFNAME="^lo,docker", NCCL_IB_HCA="mlx5_0,mlx5_1", GLOO_SOCKET_IFNAME="ib0") == [
        "--env", "NCCL_SOCKET_IFNAME=^lo,docker", "--env", "GLOO_SOCKET_IFNAME=ib0",
        "--env", "NCCL_IB_HCA=mlx5_0,mlx5_1",
    ]  # fmt: skip
    text = (REPO / "slurm" / "common.sh").read_text()
    (sm,) = [ln for ln in text.splitlines() if ln.strip().startswith("SM=(apptainer exec")]
    assert '"${SM_ENV[@]}" "$SWE_MEGATRON_IMAGE"' in sm  # every step in the image gets them
    assert text.index("_sm_interconnect\n") < text.index("SM=(apptainer exec")
