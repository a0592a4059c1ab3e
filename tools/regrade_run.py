"""Did a grading change move the reward? Regrade the patches a run's agents submitted with an earlier canary builder.

Reads every stage unit's trajectories.jsonl under a run folder, grades each distinct non-empty patch once through
the real grader and bwrap sandboxes with grading/canaries.py as it was at `--old-rev` (and its placement of the
twins; tools/bench_canaries.py's old_builder), and prints how many of the run's recorded verdicts that builder
gives too, and each one it does not (with the flags the run recorded).

    .venv/bin/python tools/regrade_run.py /tmp/lc51/sync-s2 --old-rev 7a66828

Needs the bwrap sandbox (tools/sandbox_setup.sh) and the run's tasks file (its config's tasks.train_file).
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tools")]

import bench_canaries  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from swe_megatron.config.schema import SandboxConfig  # noqa: E402
from swe_megatron.grading import grader  # noqa: E402
from swe_megatron.sandbox import make_sandbox  # noqa: E402
from swe_megatron.tasks.load import load_tasks_for_command  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a run folder (run_dir)")
    ap.add_argument("--old-rev", required=True, help="commit of the earlier canary builder")
    ap.add_argument("--tasks", help="tasks file (default: the run's tasks.train_file)")
    args = ap.parse_args()
    run = Path(args.run)
    tasks_file = args.tasks or OmegaConf.load(run / "config.yaml").tasks.train_file
    tasks = {t.instance_id: t for t in load_tasks_for_command(tasks_file)}
    cfg = SandboxConfig()
    factory = lambda spec: make_sandbox(spec, cfg)  # noqa: E731
    verdicts: dict[tuple[str, str], bool] = {}
    same, other = 0, []
    with tempfile.TemporaryDirectory(prefix="regrade-") as tmp:
        old = bench_canaries.old_builder(args.old_rev, Path(tmp))
        grader.canary_tests = old
        grader._twin_files = getattr(old, "twin_files", grader._twin_files)
        for path in sorted(glob.glob(str(run / "units" / "stage*" / "trajectories.jsonl"))):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    t = json.loads(line)
                    if not t["patch"].strip() or t.get("infra_failure"):
                        continue
                    key = (t["task_id"], t["patch"])
                    if key not in verdicts:
                        log = Path(tmp) / str(len(verdicts))
                        verdicts[key] = grader.grade_one(
                            tasks[t["task_id"]], t["patch"], factory, log_dir=log
                        ).resolved
                    if verdicts[key] == bool(t["resolved"]):
                        same += 1
                    else:
                        other.append(
                            f"  {path}: {t['task_id']} sample {t['sample_index']}: run {t['resolved']}, "
                            f"{args.old_rev} {verdicts[key]} (run flags {t.get('grading_flags')})"
                        )
    print(
        f"{run}: {same + len(other)} patches graded ({len(verdicts)} distinct); the run's verdict {same}, "
        f"another {len(other)}"
    )
    print("\n".join(other))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
