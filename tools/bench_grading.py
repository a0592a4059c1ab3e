"""Grading throughput: tasks per minute at 1 and 2 concurrent graders, gold patches, real sandboxes.

Each grading is the whole path the trainer pays for: sanitise the patch, start a fresh sandbox (copy
of the task repository), apply the patch, restore the tests, run the test command with the harness
record, parse and decide with swebench, stop the sandbox. Prints figures, asserts nothing (a
benchmark, not a test); every gold patch must resolve or the run says so.

    .venv/bin/python tools/bench_grading.py --tasks data/tasks/test.jsonl --limit 8 [--repeat 2]
    .venv/bin/python tools/bench_grading.py                # no tasks file: 8 copies of the tiny test task

Needs the bwrap sandbox (tools/sandbox_setup.sh). Run it on an idle machine: graders compete for the
same cores as anything else running.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from swe_megatron.config.schema import SandboxConfig  # noqa: E402
from swe_megatron.grading.grader import grade_many  # noqa: E402
from swe_megatron.sandbox import make_sandbox  # noqa: E402
from swe_megatron.tasks.load import load_tasks_for_command  # noqa: E402

PHASES = ("start", "apply", "tests", "stop")


def tiny_tasks(n: int):
    """n copies of tests/grading/tiny_task.py's task (one repository, distinct instance ids)."""
    sys.path.insert(0, str(REPO / "tests" / "grading"))
    import tiny_task

    folder = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    task = tiny_task.build_task(folder, tiny_task.build_env())
    return [dataclasses.replace(task, instance_id=f"{task.instance_id}-{i}") for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", help="tasks file (JSONL); default: copies of the tiny test task")
    ap.add_argument("--limit", type=int, default=8, help="tasks graded per setting (default 8)")
    ap.add_argument("--repeat", type=int, default=1, help="grade each task this many times per setting")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="concurrent graders to measure")
    ap.add_argument("--sandbox", default="bwrap", help="sandbox backend (default bwrap)")
    args = ap.parse_args()

    if args.tasks:
        tasks = load_tasks_for_command(args.tasks)[: args.limit]
        source = args.tasks
    else:
        tasks = tiny_tasks(args.limit)
        source = "tiny test task (tests/grading/tiny_task.py)"
    cfg = SandboxConfig(backend=args.sandbox)
    factory = lambda spec: make_sandbox(spec, cfg)  # noqa: E731
    print(f"grading {len(tasks)} gold patches x {args.repeat} from {source} ({args.sandbox})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-grading-logs-") as logs:
        grade_many([(tasks[0], tasks[0].patch, Path(logs) / "warmup")], factory)  # caches warm
        for workers in args.workers:
            jobs = [
                (t, t.patch, Path(logs) / f"w{workers}" / f"{t.instance_id}.{i}")
                for i in range(args.repeat)
                for t in tasks
            ]
            t0 = time.perf_counter()
            results = grade_many(jobs, factory, workers=workers)
            wall = time.perf_counter() - t0
            bad = [f"{r.instance_id}: {r.status} {r.reason}" for r in results if not r.resolved]
            durations = sorted(r.duration_s for r in results)
            phases = {k: statistics.mean(r.timings.get(k, 0.0) for r in results) for k in PHASES}
            rows.append(
                (
                    workers,
                    len(jobs) / wall * 60,
                    wall,
                    statistics.median(durations),
                    durations[-1],
                    phases,
                    bad,
                )
            )
    print(
        "\n| graders | tasks/min | wall s | per task p50 s | per task max s | mean s: "
        + " / ".join(PHASES)
        + " |"
    )
    print("|---|---|---|---|---|---|")
    for workers, rate, wall, p50, worst, phases, _ in rows:
        split = " / ".join(f"{phases[k]:.2f}" for k in PHASES)
        print(f"| {workers} | {rate:.1f} | {wall:.1f} | {p50:.2f} | {worst:.2f} | {split} |")
    for workers, *_, bad in rows:
        for line in bad:
            print(f"NOT RESOLVED ({workers} graders): {line}")
    return 1 if any(r[-1] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
