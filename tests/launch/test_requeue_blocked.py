"""Requeue at the time limit with a trainer that cannot stop (issue 41 item 4, finding 5), on the test cluster.

A trainer rank blocked in a C++ call (an NCCL sync, a gloo receive) runs its Python signal handlers only when the
call returns: USR2 and the job step's SIGTERM change nothing, the job reaches its time limit and ends TIMEOUT, and
the `scontrol requeue` that follows the trainer's exit never runs. The job here is slurm/common.sh's own USR2
trap and trainer wait (`_sm_on_usr2`, `_sm_wait_trainer`) around a labelled stand-in for that trainer: an srun
step deaf to TERM, USR2 and INT (`trap '' ...`), as such a rank is until its call returns.

Run: tools/slurm_up.sh --nodes 3 && .venv/bin/python -m pytest tests/launch/test_requeue_blocked.py -m "" -q
(about 1-2 minutes: a one-minute job, then its requeued run).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .test_slurm_launch import PARTITION, REPO, _run, _sacct

pytestmark = [pytest.mark.slurm]

JOB = """#!/bin/bash
#SBATCH --time=1
#SBATCH --requeue
#SBATCH --signal=B:USR2@50
source "{repo}/slurm/common.sh"
echo "run restart=${{SLURM_RESTART_COUNT:-0}}" >> "{marks}"
if ((${{SLURM_RESTART_COUNT:-0}} >= 1)); then exit 0; fi # the requeued run: resumed
STOP_REQUESTED=0 TRAINER_PID="" SERVER_PIDS="" REQUEUE_TIMER_PID="" RUN_DIR={out}
trap _sm_on_usr2 USR2
trap _sm_cleanup EXIT
# Labelled stand-in: a trainer rank blocked in a collective, deaf to every signal a stop sends.
srun --ntasks=1 bash -c 'trap "" TERM USR2 INT; sleep 600' &
TRAINER_PID=$!
_sm_wait_trainer
"""


@pytest.fixture(scope="module", autouse=True)
def cluster():
    out = _run(["sinfo", "-h", "-o", "%T"], check=False)
    if out.returncode != 0 or not out.stdout.strip():
        pytest.skip(
            f"Slurm test cluster is not up ({(out.stdout + out.stderr).strip()!r}); run tools/slurm_up.sh"
        )


def test_a_trainer_blocked_past_the_time_limit_is_requeued_not_timed_out(short_dir: Path):
    marks, script = short_dir / "marks", short_dir / "job.sh"
    script.write_text(JOB.format(repo=REPO, marks=marks, out=short_dir))
    proc = _run(["sbatch", "--parsable", "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--mem=200M",
                 "--oversubscribe", f"--partition={PARTITION}", "--open-mode=append", f"--output={short_dir}/slurm-%j.out",
                 str(script)],
                check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    deadline, state = time.monotonic() + 240, ""
    while time.monotonic() < deadline:
        state, _ = _sacct(job)
        runs = marks.read_text().split() if marks.exists() else []
        if state in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"} and "restart=1" in runs:
            break
        if state == "TIMEOUT":  # the failure this test is about: no requeue follows a TIMEOUT
            break
        time.sleep(3)
    else:
        _run(["scancel", job], check=False)
    log = "\n".join(p.read_text() for p in short_dir.glob("slurm-*.out"))
    assert state == "COMPLETED", f"job {job} ended {state or 'not at all'}, not requeued and resumed:\n{log}"
    assert marks.read_text().split() == ["run", "restart=0", "run", "restart=1"]
    assert "before the time limit (blocked in a collective?): requeueing job" in log, log
