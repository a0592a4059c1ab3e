"""Grading time with the canaries as built now against the canary builder of an earlier commit, side by side.

Grades each task's gold patch through the real grader and bwrap sandboxes, alternating the two builders task
by task and round by round (so load on a shared machine falls on both alike), and prints per task the median
wall time of a grading with each and their ratio, then the median of those ratios and the ratio of the sums.
Every gold patch must resolve unflagged with both builders or the run says so. The earlier builder is read
from git (`--old-rev`, default: the last commit before issue 40's canaries) and used in this process only.

    .venv/bin/python tools/bench_canaries.py --tasks data/tasks/train.jsonl data/tasks/test.jsonl --repeat 3

Needs the bwrap sandbox (tools/sandbox_setup.sh).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from swe_megatron.config.schema import SandboxConfig  # noqa: E402
from swe_megatron.grading import canaries as new_builder  # noqa: E402
from swe_megatron.grading import grader  # noqa: E402
from swe_megatron.sandbox import make_sandbox  # noqa: E402
from swe_megatron.tasks.load import load_tasks_for_command  # noqa: E402

OLD_REV = "3e8a36d"
"""The last commit whose canaries compared two literals (issue 40 family 1)."""


def old_builder(rev: str, folder: Path):
    """grading/canaries.py as it was at `rev`, imported as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{rev}:swe_megatron/grading/canaries.py"], cwd=REPO, capture_output=True, text=True
    )
    if source.returncode != 0:
        sys.exit(f"bench_canaries: cannot read canaries.py at {rev}: {source.stderr.strip()}")
    path = folder / "canaries_old.py"
    path.write_text(source.stdout)
    spec = importlib.util.spec_from_file_location("canaries_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["canaries_old"] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "breakable"):
        module.breakable = lambda *_: False  # the old builder always planted in the canary file
    if "must_fail" not in inspect.signature(module.plant).parameters:  # before twins were spread over files
        plant = module.plant

        def spread(target, text, ids, rng=None, fail_to_pass=(), must_fail=0, must_pass=0):
            return plant(
                target, text, ids, rng, fail_to_pass=fail_to_pass, twins=bool(must_fail or must_pass)
            )

        module.plant = spread
        module.twin_files = first_file_twins
    if "excused" not in inspect.signature(module.check).parameters:  # before the baseline run's excusal
        check = module.check
        module.check = lambda canaries, log_status, record, excused=frozenset(): check(
            canaries, log_status, record
        )
        module.passing_must_fail = new_builder.passing_must_fail
        module.Canaries.ids = lambda self: frozenset(self.expected)
    return module


def first_file_twins(sources, f2p, file, rng):
    """grader._twin_files as it was before stop 51: every twin in the first file with a FAIL_TO_PASS test a
    copy can break (grader.canary_tests is the old builder while it runs), else in the canary file."""
    builder = grader.canary_tests
    first = next((f for f, text in sources.items() if builder.breakable(f, text, f2p.get(f, []))), file)
    return Counter({first: builder.MUST_FAIL}), Counter({first: builder.MUST_PASS})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", required=True, help="tasks files (JSONL)")
    ap.add_argument("--repeat", type=int, default=3, help="gradings per task and builder (default 3)")
    ap.add_argument("--old-rev", default=OLD_REV, help=f"commit of the earlier builder (default {OLD_REV})")
    args = ap.parse_args()

    new_twin_files = grader._twin_files
    tasks = [t for path in args.tasks for t in load_tasks_for_command(path)]
    cfg = SandboxConfig()
    factory = lambda spec: make_sandbox(spec, cfg)  # noqa: E731
    times: dict[str, dict[str, list[float]]] = {t.instance_id: {"old": [], "new": []} for t in tasks}
    bad = []
    with tempfile.TemporaryDirectory(prefix="bench-canaries-") as tmp:
        builders = {"old": old_builder(args.old_rev, Path(tmp)), "new": new_builder}
        grader.grade_one(tasks[0], tasks[0].patch, factory, log_dir=Path(tmp) / "warmup")  # caches warm
        print(
            f"grading {len(tasks)} gold patches x {args.repeat} x 2 builders (old: {args.old_rev}, new: tree)"
        )
        for round_ in range(args.repeat):
            for i, task in enumerate(tasks):
                order = ("old", "new") if (i + round_) % 2 == 0 else ("new", "old")
                for which in order:
                    grader.canary_tests = builders[which]
                    grader._twin_files = getattr(builders[which], "twin_files", new_twin_files)
                    t0 = time.perf_counter()
                    r = grader.grade_one(
                        task, task.patch, factory, log_dir=Path(tmp) / f"{which}{round_}-{i}"
                    )
                    times[task.instance_id][which].append(time.perf_counter() - t0)
                    if not r.resolved or r.tampered:
                        bad.append(f"{which} {task.instance_id}: {r.status} {r.reason[:200]}")
        grader.canary_tests, grader._twin_files = new_builder, new_twin_files
    print(f"{'task':32} {'old s':>7} {'new s':>7} {'new/old':>8}")
    ratios = []
    for iid, t in times.items():
        old, new = statistics.median(t["old"]), statistics.median(t["new"])
        ratios.append(new / old)
        print(f"{iid:32} {old:7.2f} {new:7.2f} {new / old:8.3f}")
    old_sum = sum(statistics.median(t["old"]) for t in times.values())
    new_sum = sum(statistics.median(t["new"]) for t in times.values())
    print(
        f"median of per-task ratios {statistics.median(ratios):.3f}; sum of medians {old_sum:.1f} s -> "
        f"{new_sum:.1f} s (ratio {new_sum / old_sum:.3f})"
    )
    for line in bad:
        print("NOT RESOLVED OR FLAGGED:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
