"""Tests against the real single-node Slurm cluster started by tools/slurm_up.sh.

Skipped (with the reason) when `sinfo` is missing or the cluster is not up. Every wait has a
deadline, so a broken cluster fails a test instead of hanging it.

Jobs run as the submitting user (root on the CI machine), so pytest's tmp_path (mode 0700,
owned by that user) is readable and writable by the jobs.

Run: tools/slurm_up.sh && .venv/bin/python -m pytest tests/test_slurm.py -m slurm -v
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

PARTITION = "debug"
JOB_TIMEOUT_S = 120  # one small job, submit to finish
READY_STATES = {"idle", "mixed", "allocated", "completing"}


def _run(cmd: list[str], timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster() -> None:
    if shutil.which("sinfo") is None:
        pytest.skip("Slurm is not installed (no `sinfo` on PATH); run tools/slurm_up.sh")
    try:
        out = _run(["sinfo", "-h", "-o", "%T"], timeout=15, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip("`sinfo` timed out: slurmctld is not answering; run tools/slurm_up.sh")
    states = {s.strip().rstrip("*~#!%$@^-") for s in out.stdout.split()}
    if out.returncode != 0 or not states & READY_STATES:
        detail = (out.stdout + out.stderr).strip() or "no nodes"
        pytest.skip(f"Slurm cluster is not up (sinfo: {detail!r}); run tools/slurm_up.sh")


def _sbatch_wait(tmp_path: Path, script: str, *args: str) -> tuple[int, str]:
    """Submit `script` with `sbatch --wait`; return (sbatch exit code, job id)."""
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n" + script)
    cmd = [
        "sbatch",
        "--wait",
        "--parsable",
        f"--partition={PARTITION}",
        "--time=5",
        f"--output={tmp_path}/slurm-%j.out",
        *args,
        str(path),
    ]
    try:
        proc = _run(cmd, timeout=JOB_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        _run(["scancel", "--name=job.sh", "--user=" + _whoami()], check=False)
        pytest.fail(f"`sbatch --wait` did not return within {JOB_TIMEOUT_S} s")
    job_id = proc.stdout.strip().split(";")[0]
    assert job_id.isdigit(), f"sbatch printed no job id: {proc.stdout!r} {proc.stderr!r}"
    return proc.returncode, job_id


def _whoami() -> str:
    return _run(["id", "-un"]).stdout.strip()


def _sacct_state(job_id: str, want: str, timeout: float = 30) -> tuple[str, str]:
    """Poll sacct until the job's state is `want` (accounting lags the job by a moment)."""
    deadline = time.monotonic() + timeout
    last = ("", "")
    while time.monotonic() < deadline:
        out = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"], check=False).stdout
        line = out.strip().splitlines()[0] if out.strip() else ""
        if line:
            state, exit_code = line.split("|")
            last = (state.split()[0], exit_code)
            if last[0] == want:
                return last
        time.sleep(0.5)
    return last


def test_sbatch_wait_writes_file(tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"
    rc, job_id = _sbatch_wait(tmp_path, f'echo "hello from $SLURM_JOB_ID" > {marker}\n')
    assert rc == 0
    assert marker.read_text().strip() == f"hello from {job_id}"
    assert _sacct_state(job_id, "COMPLETED") == ("COMPLETED", "0:0")


def test_failing_job_is_failed_in_sacct(tmp_path: Path) -> None:
    rc, job_id = _sbatch_wait(tmp_path, "exit 3\n")
    assert rc == 3  # sbatch --wait returns the job's exit code
    assert _sacct_state(job_id, "FAILED") == ("FAILED", "3:0")


def test_gpu_gres_job_is_scheduled(tmp_path: Path) -> None:
    gres = _run(["sinfo", "-h", "-p", PARTITION, "-o", "%G"]).stdout
    if "gpu" not in gres:
        pytest.skip(
            f"partition {PARTITION} has no gpu gres ({gres.strip()!r}); "
            "run tools/slurm_up.sh with SWE_MEGATRON_SLURM_FAKE_GPUS>0"
        )
    out = tmp_path / "cuda.txt"
    rc, job_id = _sbatch_wait(tmp_path, f'echo "$CUDA_VISIBLE_DEVICES" > {out}\n', "--gres=gpu:1")
    assert rc == 0
    assert out.read_text().strip() in {"0", "1"}  # Slurm hands the job exactly one (fake) GPU
    assert _sacct_state(job_id, "COMPLETED")[0] == "COMPLETED"
    tres = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "AllocTRES"]).stdout
    assert "gres/gpu=1" in tres, f"accounting did not record one GPU: {tres!r}"


# ---------------------------------------------------------------- submitit


@pytest.fixture
def executor(tmp_path: Path):
    submitit = pytest.importorskip("submitit")
    ex = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    ex.update_parameters(slurm_partition=PARTITION, timeout_min=5, cpus_per_task=1, mem_gb=1)
    return ex


def _wait_done(job, timeout: float = JOB_TIMEOUT_S) -> None:
    """job.result() alone would wait forever on a broken cluster: poll with a deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if job.done(force_check=True):
            return
        time.sleep(1)
    job.cancel(check=False)
    pytest.fail(f"submitit job {job.job_id} not done after {timeout} s (state {job.state})")


def test_submitit_result(executor) -> None:
    # Nested function: cloudpickle ships it by value (the test module is not importable in the job).
    def square_plus(x: int, y: int) -> int:
        return x * x + y

    job = executor.submit(square_plus, 6, 1)
    _wait_done(job)
    assert job.result() == 37


def test_submitit_exception_surfaces(executor) -> None:
    from submitit.core.utils import FailedJobError

    def boom() -> None:
        raise ValueError("boom from the slurm job")

    job = executor.submit(boom)
    _wait_done(job)
    with pytest.raises((FailedJobError, ValueError), match="boom from the slurm job"):
        job.result()


def test_submitit_sees_cancelled_job(executor) -> None:
    """Needs accounting: submitit learns a job was cancelled only through sacct."""
    from submitit.core.utils import UncompletedJobError

    job = executor.submit(time.sleep, 600)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while job.state not in {"RUNNING", "COMPLETED", "FAILED"} and time.monotonic() < deadline:
        time.sleep(1)
        job.get_info(mode="force")
    assert job.state == "RUNNING"
    job.cancel()
    _wait_done(job, timeout=60)
    assert job.state.startswith("CANCELLED")
    with pytest.raises(UncompletedJobError):
        job.result()
