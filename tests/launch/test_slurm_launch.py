"""The sbatch scripts and the submitit launcher on the real single-node Slurm cluster (tools/slurm_up.sh).

Run: tools/slurm_up.sh && .venv/bin/python -m pytest tests/launch -m "" -q
Each job runs the tiny embedded config on the pipeline tests' `calc` tasks; every wait has a deadline.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
PARTITION = "debug"
JOB_TIMEOUT_S = 900
# One CPU node, sharing it with other jobs (the scripts' directives fit the 16-node paper preset).
SBATCH_CI = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=2", "--mem=8G", "--time=30", "--oversubscribe",
             f"--partition={PARTITION}"]  # fmt: skip
TINY = ["stage2.tasks_per_iteration=2", "stage2.samples_per_task=2", "stage2.batch_size=2", "stage2.t_max=4",
        "stage2.l_thr=1", "stage2.refresh_pool=false", "sampling.max_tokens_per_turn=32", "monitor.progress=false",
        "cluster.signal_delay_s=60"]  # fmt: skip


def _run(cmd, timeout=30, check=True):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module", autouse=True)
def slurm_and_pipeline():
    if shutil.which("sinfo") is None:
        pytest.skip("Slurm is not installed (no `sinfo`); run tools/slurm_up.sh")
    out = _run(["sinfo", "-h", "-o", "%T"], check=False)
    if out.returncode != 0 or not out.stdout.strip():
        pytest.skip(f"Slurm cluster is not up ({(out.stdout + out.stderr).strip()!r}); run tools/slurm_up.sh")


def _sacct(job_id: str) -> tuple[str, str]:
    out = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"], check=False).stdout.strip()
    if not out:
        return "", ""
    state, code = out.splitlines()[0].split("|")
    return state.split()[0], code


def _wait_final(job_id: str, timeout: float = JOB_TIMEOUT_S) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state, code = _sacct(job_id)
        if state in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}:
            return state, code
        time.sleep(3)
    _run(["scancel", job_id], check=False)
    pytest.fail(f"job {job_id} not finished after {timeout:.0f} s (last state {_sacct(job_id)})")


def _sbatch(script: str, out_dir: Path, *args: str) -> str:
    proc = _run(["sbatch", "--parsable", *SBATCH_CI, f"--output={out_dir}/slurm-%j.out", f"slurm/{script}", *args],
                check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def _state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {"done": []}


def test_stage2_sbatch_runs_its_iterations(tmp_path, tasks, short_dir):
    """With two trainer ranks (data parallel 2, one srun step): rank 0 drives, both train (pipeline/spmd.py)."""
    run_dir = short_dir / "run"
    job = _sbatch(
        "stage2.sbatch", tmp_path, "embedded", f"run_dir={run_dir}", "stage2.iterations=2", "parallel.world_size=2",
        *tasks, *TINY,
    )  # fmt: skip
    state, code = _wait_final(job)
    log = next(tmp_path.glob("slurm-*.out")).read_text(errors="replace")
    assert (state, code) == ("COMPLETED", "0:0"), log[-3000:]
    assert "(2 rank(s))" in log and log.count("run: done") == 1, log[-3000:]  # only rank 0 reports
    assert [u for u in _state(run_dir)["done"] if u.startswith("stage2")] == ["stage2:0", "stage2:1"]
    for it in (0, 1):
        lines = (run_dir / "units" / f"stage2-{it}" / "trajectories.jsonl").read_text().splitlines()
        assert len(lines) == 4  # 2 tasks x G=2
    assert list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    job_dir = run_dir / "jobs" / job
    assert (job_dir.stat().st_mode & 0o077) == 0 and (job_dir / "rendezvous.json").stat().st_mode & 0o077 == 0
    rv = json.loads((job_dir / "rendezvous.json").read_text())
    assert len(rv["sandbox_servers"]) == 1 and rv["engines"] == []


def test_a_failing_run_surfaces_as_a_failed_job(tmp_path, tasks):
    job = _sbatch(
        "stage2.sbatch", tmp_path, "embedded", f"run_dir={tmp_path}/run", "stage2.iterations=oops", *tasks
    )
    state, code = _wait_final(job, timeout=240)
    log = next(tmp_path.glob("slurm-*.out")).read_text(errors="replace")
    assert state == "FAILED" and code == "2:0", log
    assert "stage2.iterations" in log  # the config error, in one line, in the job's log


# USR2 requeue through `swe-megatron launch` runs on the 3-node shape: test_multinode.py.
