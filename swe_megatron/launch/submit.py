"""`swe-megatron launch`: submit a run through submitit, as a Checkpointable job that requeues on USR2.

    job = submit("paper-72b", ["stage2.iterations=4"], cluster="slurm")
    job.job_id, job.paths.stdout

The Slurm parameters come from cfg.cluster (nodes, gpus_per_node, cpus_per_node, mem_gb_per_node, partition,
account, qos, time_limit_min, signal_delay_s, max_requeues). In the allocation the job runs the config's
whole schedule with the same body as the sbatch scripts (`bash slurm/common.sh CONFIG ...`); with
--cluster local or debug it runs `swe-megatron run` on this machine.

Preemption: submitit sends USR2 `signal_delay_s` before the time limit (and `scancel --signal=USR2` does
the same at once). Its handler calls PipelineJob.checkpoint(), which passes the signal on, waits until the
run has stopped at a safe point (see steps.py) and returns a fresh PipelineJob; submitit then requeues the
job, and the requeued job resumes the run from its run directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import submitit

from swe_megatron.config.load import load_config
from swe_megatron.launch.slurm_env import LaunchError, SlurmEnv
from swe_megatron.launch.steps import STOP_FILE

REPO = Path(__file__).resolve().parents[2]
"""The repository this package runs from (slurm/common.sh is found there)."""


class PipelineJob(submitit.helpers.Checkpointable):
    """The submitted callable: runs the pipeline in a child process, stops it cleanly on checkpoint()."""

    def __init__(self, config: str, overrides: list[str], repo: str = str(REPO), image: str = "",
                 grace_s: float = 0.0):  # fmt: skip
        self.config = config
        self.overrides = list(overrides)
        self.repo = repo
        self.image = image
        self.grace_s = grace_s
        """Local runs: seconds checkpoint() lets the run finish its unit before SIGTERM (in Slurm the trainer
        step applies the same grace, cluster.signal_delay_s - 60)."""
        self._proc: subprocess.Popen | None = None
        self._rc: int | None = None

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_proc", "_rc")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({"grace_s": 0.0, **state}, _proc=None, _rc=None)

    @property
    def stop_file(self) -> Path | None:
        """RUN_DIR/STOP (the run stops after the unit in flight commits while it exists); None without run_dir."""
        run_dirs = [o.split("=", 1)[1] for o in self.overrides if o.startswith("run_dir=")]
        return Path(run_dirs[-1]) / STOP_FILE if run_dirs else None

    def command(self, in_slurm: bool) -> list[str]:
        """What the job runs: the sbatch body inside Slurm, else `swe-megatron run`."""
        if in_slurm:
            return ["bash", str(Path(self.repo) / "slurm" / "common.sh"), self.config, *self.overrides]
        return [sys.executable, "-m", "swe_megatron.cli", "run", self.config, *self.overrides]

    def __call__(self) -> int:
        """Run to the end; RuntimeError (a failed job) on a non-zero status."""
        slurm = SlurmEnv.detect()
        if slurm is not None and slurm.rank != 0:
            return (
                0  # submitit starts one task per node; the first one drives the job (its steps use the rest)
            )
        in_slurm = slurm is not None
        env = {**os.environ, "SWE_MEGATRON_REQUEUE": "0", "SWE_MEGATRON_REPO": self.repo}
        if self.image:
            env["SWE_MEGATRON_IMAGE"] = self.image
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        if self.stop_file is not None:
            self.stop_file.unlink(missing_ok=True)  # left by the stop that requeued this job
        self._rc = None
        self._proc = subprocess.Popen(self.command(in_slurm), cwd=self.repo, env=env)
        # Wait in a thread and poll a plain attribute: checkpoint() runs in a signal handler on this thread,
        # so neither side may block on a lock the other could hold (Popen.wait takes one).
        proc = self._proc
        threading.Thread(target=lambda: setattr(self, "_rc", proc.wait()), daemon=True).start()
        while self._rc is None:
            time.sleep(0.5)
        rc = self._rc if self._rc >= 0 else 128 - self._rc
        if rc != 0:
            raise RuntimeError(f"{' '.join(self.command(in_slurm)[:3])} ... exited with status {rc}")
        return rc

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        """USR2: ask the run to stop after the unit in flight commits (RUN_DIR/STOP), wait for it, requeue.

        In Slurm the child (slurm/common.sh) gets USR2 too and its trainer step bounds the wait; locally the
        run gets SIGTERM after grace_s (its uncommitted unit is redone on resume).
        """
        proc = self._proc
        if proc is not None and self._rc is None:
            if self.stop_file is not None:
                with contextlib.suppress(OSError):
                    self.stop_file.parent.mkdir(parents=True, exist_ok=True)
                    self.stop_file.write_text(f"checkpoint at {time.ctime()}\n")
            in_slurm = SlurmEnv.detect() is not None
            with contextlib.suppress(ProcessLookupError):
                if in_slurm:
                    proc.send_signal(signal.SIGUSR2)  # common.sh passes it to the trainer step
            deadline = time.monotonic() + (self.grace_s if self.stop_file is not None else 0.0)
            while self._rc is None:
                if not in_slurm and time.monotonic() > deadline:
                    with contextlib.suppress(ProcessLookupError):
                        proc.terminate()
                    deadline = float("inf")
                time.sleep(0.5)
        print(f"checkpoint: run stopped (status {self._rc}); requeueing to resume", flush=True)
        return submitit.helpers.DelayedSubmission(
            PipelineJob(self.config, self.overrides, self.repo, self.image, self.grace_s)
        )


def make_executor(cfg, cluster: str, folder: Path) -> submitit.AutoExecutor:
    """A submitit executor for cluster (slurm|local|debug) with cfg.cluster's Slurm parameters."""
    cl = cfg.cluster
    kwargs: dict = {"slurm_max_num_timeout": cl.max_requeues} if cluster == "slurm" else {}
    if cluster == "slurm" and os.environ.get("SWE_MEGATRON_LAUNCH_PYTHON"):
        kwargs["slurm_python"] = os.environ["SWE_MEGATRON_LAUNCH_PYTHON"]
    ex = submitit.AutoExecutor(folder=folder / "%j", cluster=cluster, **kwargs)
    params: dict = {"name": f"swe-{cfg.name}", "timeout_min": cl.time_limit_min}
    if cluster == "slurm":
        params.update(
            nodes=cl.nodes,
            tasks_per_node=1,
            cpus_per_task=cl.cpus_per_node,
            mem_gb=cl.mem_gb_per_node,
            slurm_signal_delay_s=cl.signal_delay_s,
            slurm_additional_parameters={"requeue": True},
        )
        if cl.gpus_per_node:
            params["gpus_per_node"] = cl.gpus_per_node
        if cl.partition:
            params["slurm_partition"] = cl.partition
        if cl.account:
            params["slurm_account"] = cl.account
        if cl.qos:
            params["slurm_qos"] = cl.qos
    ex.update_parameters(**params)
    return ex


def submit(config: str, overrides: list[str], cluster: str = "slurm"):
    """Validate the config, submit the run; returns the submitit Job."""
    cfg = load_config(config, overrides)
    if cluster not in ("slurm", "local", "debug"):
        raise LaunchError(f"--cluster {cluster!r} is unknown; allowed: slurm, local, debug")
    if cluster == "slurm" and shutil.which("sbatch") is None:
        raise LaunchError(
            "--cluster slurm: no Slurm here (sbatch is not on PATH); run on a login node, or use --cluster local"
        )
    run_dir = Path(cfg.run_dir).resolve()
    # The job runs from the repository root: pin the run directory so a relative run_dir means the same.
    overrides = [o for o in overrides if not o.startswith("run_dir=")] + [f"run_dir={run_dir}"]
    folder = Path(cfg.cluster.log_dir).resolve() if cfg.cluster.log_dir else run_dir / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    ex = make_executor(cfg, cluster, folder)
    config_path = config if not Path(config).exists() else str(Path(config).resolve())
    try:
        grace = max(float(cfg.cluster.signal_delay_s) - 60.0, 0.0)  # as slurm/common.sh's trainer step
        return ex.submit(
            PipelineJob(config_path, overrides, image=cfg.cluster.container_image, grace_s=grace)
        )
    except (FileNotFoundError, submitit.core.utils.FailedJobError) as e:
        raise LaunchError(f"submitting through submitit ({cluster}) failed: {e}") from None
