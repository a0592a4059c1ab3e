"""`swe-megatron launch`, `swe-megatron build-sifs` and `swe-megatron job-step` (used by slurm/common.sh).

swe-megatron launch paper-72b --cluster slurm stage2.iterations=4     # prints job id and log paths
swe-megatron launch embedded --cluster local                          # same job, on this machine
swe-megatron build-sifs data/swe-rebench/train.parquet --sif-dir /shared/sifs --jobs 8
"""

from __future__ import annotations

import argparse
import sys

from swe_megatron.config.load import load_config
from swe_megatron.errors import UsageError
from swe_megatron.launch import steps
from swe_megatron.launch.sifs import SifBuilder, task_image
from swe_megatron.tasks.load import load_tasks_for_command


def _launch(args: argparse.Namespace) -> int:
    # lazy: submitit (launch.submit, 0.1 s); the CLI imports every command module at start
    from swe_megatron.launch.submit import submit

    job = submit(args.config, args.overrides, cluster=args.cluster)
    print(f"submitted job {job.job_id} ({args.cluster})")
    print(f"  stdout: {job.paths.stdout}")
    print(f"  stderr: {job.paths.stderr}")
    print(f"  watch:  {_watch(args.cluster, job)}")
    if args.cluster == "debug":  # submitit's debug executor runs the job in this process on result()
        job.result()
        print(f"job {job.job_id} finished")
    return 0


def _watch(cluster: str, job) -> str:
    """How to follow the job: squeue knows only Slurm jobs (a local or debug job is a process on this machine)."""
    tail = f"tail -f {job.paths.stdout}"
    return f"squeue -j {job.job_id}; {tail}" if cluster == "slurm" else tail


def _build_sifs(args: argparse.Namespace) -> int:
    sif_dir = args.sif_dir
    if not sif_dir and args.config:
        sif_dir = load_config(args.config, args.overrides).sandbox.sif_dir
    if not sif_dir:
        raise UsageError("no SIF folder: give --sif-dir DIR or --config CONFIG with sandbox.sif_dir set")
    # An image is worth building before its row can be graded (the plan may be fixed later).
    tasks = load_tasks_for_command(args.tasks, gradable=False)
    images = [image for image in map(task_image, tasks) if image]  # "": a task in a local repository
    builder = SifBuilder(sif_dir, jobs=args.jobs, tmp_dir=args.tmp_dir, force=args.force)
    records = builder.build_all(images)
    failed = [r for r in records if r.status == "failed"]
    counts = {s: sum(r.status == s for r in records) for s in ("built", "present", "failed")}
    print(
        f"{len(records)} image(s) for {len(tasks)} task(s): {counts['built']} built, {counts['present']} already "
        f"present, {counts['failed']} failed; manifest {builder.sif_dir}/manifest.json"
    )
    for r in failed:
        print(f"FAILED {r.image}:\n  " + "\n  ".join((r.error or "").splitlines()), file=sys.stderr)
    return 1 if failed else 0


def _job_step(args: argparse.Namespace) -> int:
    if args.role == "init":
        sys.stdout.write(steps.init(args.config, args.overrides))
        return 0
    if args.role == "sandbox-server":
        return steps.sandbox_server(args.job_dir, args.config, args.overrides)
    if args.role == "engine":
        return steps.engine(args.job_dir, args.config, args.overrides, args.stage)
    if args.role == "trainer":
        return steps.trainer(args.run_dir, args.config, args.overrides, args.grace)
    return steps.wait(args.job_dir, args.engines, args.sandboxes, args.timeout, args.watch)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the launch, build-sifs and job-step subcommands."""
    p = sub.add_parser(
        "launch", help="submit a run through submitit (Slurm, or this machine); requeues on USR2"
    )
    p.add_argument("config", help="run preset or YAML (e.g. paper-72b)")
    p.add_argument(
        "--cluster", choices=["slurm", "local", "debug"], default="slurm", help="where (default slurm)"
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    p.set_defaults(func=_launch)

    p = sub.add_parser(
        "build-sifs", help="build Apptainer SIFs of the tasks' environment images, in parallel"
    )
    p.add_argument("tasks", help="task file (JSONL/JSON/parquet, SWE-bench rows)")
    p.add_argument(
        "--sif-dir", help="output folder on the shared filesystem (default: the config's sandbox.sif_dir)"
    )
    p.add_argument("--jobs", type=int, default=4, help="builds at once (default 4)")
    p.add_argument("--tmp-dir", help="node-local scratch for apptainer's build and cache (APPTAINER_TMPDIR)")
    p.add_argument("--force", action="store_true", help="rebuild SIFs that already exist")
    p.add_argument("--config", help="run preset whose sandbox.sif_dir to use")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of --config")
    p.set_defaults(func=_build_sifs)

    p = sub.add_parser("job-step", help="(used by slurm/common.sh) one role of a Slurm job")
    p.add_argument("role", choices=["init", "sandbox-server", "engine", "wait", "trainer"])
    p.add_argument("config", nargs="?", default="", help="run preset or YAML (not for wait)")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--job-dir", help="the job folder (RUN_DIR/jobs/JOB_ID)")
    p.add_argument("--run-dir", help="trainer: the run directory")
    p.add_argument("--stage", default="", help="engine: stage whose context length the server gets")
    p.add_argument("--grace", type=float, default=0.0, help="trainer: seconds a stop may take before SIGTERM")
    p.add_argument("--engines", type=int, default=0, help="wait: engine entries expected")
    p.add_argument("--sandboxes", type=int, default=0, help="wait: sandbox entries expected")
    p.add_argument("--timeout", type=float, default=900.0, help="wait: seconds")
    p.add_argument(
        "--watch", type=int, nargs="*", default=[], help="wait: PIDs of server steps that must stay alive"
    )
    p.set_defaults(func=_job_step)
