"""`swe-megatron grade --tasks FILE --predictions FILE [--sandbox bwrap] [--workers N] [--out REPORT.json]`.

Grades SWE-bench predictions against local tasks in sandboxes and writes the report JSON atomically
(swe_megatron/grading/report.py describes it). Per-instance logs go where SWE-bench's harness puts them:
LOGS/run_evaluation/<run_id>/<model>/<instance_id>/ (test_output.txt, patch.diff, eval.sh, report.json),
LOGS being --log-dir (default: `logs` next to the report), run_id --run-id (default: the predictions
file's name without .jsonl), <model> the prediction's model_name_or_path with "/" as "__".

One prediction's failure never costs the others their results: it is recorded as that instance's result, and
the report is written whatever happens (also when the command is interrupted: then the ungraded instances are
its incomplete_ids). Exit status: 0 when every prediction was graded; 100 + N when N of them were not, or the
harness failed on them (error_ids and harness_fault_ids; N capped at 25, so 125 means 25 or more); 2 for a
usage error and 128 + signal for an interrupt, as for every command.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from swe_megatron.config.load import load_config
from swe_megatron.errors import UsageError
from swe_megatron.grading.grader import GradeResult, TaskGradingError, grade_many, task_grading
from swe_megatron.grading.report import (
    PredictionsError,
    build_report,
    load_predictions,
    log_folder_name,
    write_report,
)
from swe_megatron.grading.swebench_light import import_swebench_grading
from swe_megatron.sandbox import SandboxError, check_host, make_sandbox
from swe_megatron.tasks.load import load_tasks_for_command


def _grade(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.sandbox:
        overrides.append(f"sandbox.backend={args.sandbox}")
    cfg = load_config(args.config, overrides).sandbox
    if args.timeout is not None and not 0 < args.timeout < math.inf:
        raise UsageError(f"--timeout {args.timeout} is invalid; allowed: a finite number of seconds > 0")
    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    try:
        predictions = load_predictions(args.predictions)
    except PredictionsError as e:
        raise UsageError(str(e)) from None
    tasks = load_tasks_for_command(args.tasks)
    by_id = {t.instance_id: t for t in tasks}
    unknown = [iid for iid in predictions if iid not in by_id]
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" (+{len(unknown) - 5} more)" if len(unknown) > 5 else "")
        raise UsageError(
            f"predictions {args.predictions}: instance ids not in tasks file {args.tasks}: {shown}"
        )
    for iid in predictions:
        try:
            task_grading(by_id[iid])
        except TaskGradingError as e:
            raise UsageError(f"tasks file {args.tasks}: {e}") from None

    out = Path(args.out) if args.out else Path(args.predictions).with_suffix(".report.json")
    if out.is_dir() or any(p.exists() and not p.is_dir() for p in out.parents):
        raise UsageError(f"--out {out}: give a report file path (REPORT.json) in a folder")
    if out.exists():
        print(f"replacing the report {out}", file=sys.stderr)
    run_id = args.run_id or Path(args.predictions).name.removesuffix(".jsonl").removesuffix(".json")
    if run_id in (".", "..") or "/" in run_id or "\0" in run_id:
        raise UsageError(f"--run-id {run_id!r} is invalid; allowed: a folder name (no '/')")
    try:
        check_host(cfg)
    except SandboxError as e:
        raise UsageError(f"sandbox backend {cfg.backend.value}: {e}") from None
    swebench = import_swebench_grading()[2]  # constants: logs/run_evaluation
    runs = (
        (Path(args.log_dir) if args.log_dir else out.parent / "logs")
        / swebench.RUN_EVALUATION_LOG_DIR.name
        / run_id
    )
    jobs = [
        (by_id[iid], p["model_patch"], runs / log_folder_name(p["model_name_or_path"]) / _safe(iid))
        for iid, p in predictions.items()
    ]
    results: list[GradeResult] = []

    def progress(r: GradeResult) -> None:
        results.append(r)
        why = f" ({r.reason})" if r.reason else ""
        print(
            f"[{len(results)}/{len(jobs)}] {r.instance_id}: {r.status}{why} {r.duration_s:.1f} s",
            file=sys.stderr,
        )

    try:
        grade_many(
            jobs,
            lambda spec: make_sandbox(spec, cfg),
            workers=args.workers,
            on_result=progress,
            test_timeout_s=float(args.timeout if args.timeout is not None else cfg.grade_timeout_s),
            max_patch_bytes=cfg.grade_max_patch_bytes,
            apply_timeout_s=cfg.grade_apply_timeout_s,
        )
    finally:  # what was graded is kept, even when the rest is interrupted
        report = build_report(results, by_id, predictions)
        write_report(report, out)
    failed = len(set(report["error_ids"]) | set(report["harness_fault_ids"]))
    print(
        f"resolved {report['resolved_instances']}/{report['submitted_instances']}, "
        f"unresolved {report['unresolved_instances']}, empty {report['empty_patch_instances']}, "
        f"errors {report['error_instances']}, harness faults {len(report['harness_fault_ids'])}; report: {out}"
    )
    return FAILED_STATUS + min(failed, MAX_FAILED_COUNTED) if failed else 0


FAILED_STATUS = 100
"""Exit status of a run in which some predictions were not graded, plus how many (see the module docstring)."""
MAX_FAILED_COUNTED = 25
"""Failures the exit status counts at most (100 + 25: below the statuses shells give meanings to)."""


def _safe(instance_id: str) -> str:
    return instance_id.replace("/", "__").replace("\0", "")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the grade subcommand."""
    p = sub.add_parser(
        "grade",
        help="grade SWE-bench predictions (JSONL) against tasks in sandboxes; write a report JSON",
        description="Sanitise each model patch, apply it, restore the tests, run them in a fresh sandbox and "
        "decide with swebench's log parsers. Infrastructure failures go to error_ids, never unresolved_ids.",
        epilog="Exit status: 0 when every prediction was graded; 100 + N when N were not or the harness failed on "
        "them (error_ids, harness_fault_ids; N at most 25); 2 for a usage error. The report is always written.",
    )
    p.add_argument(
        "--tasks",
        required=True,
        metavar="FILE",
        help="tasks file (SWE-bench JSONL/parquet, e.g. data/tasks/test.jsonl)",
    )
    p.add_argument(
        "--predictions",
        required=True,
        metavar="FILE",
        help="JSONL of {instance_id, model_name_or_path, model_patch}",
    )
    p.add_argument(
        "--sandbox",
        choices=["bwrap", "apptainer", "local"],
        help="sandbox backend (default: the config's sandbox.backend)",
    )
    p.add_argument("--workers", type=int, default=1, metavar="N", help="concurrent graders (default 1)")
    p.add_argument(
        "--out", metavar="REPORT.json", help="report path (default: PREDICTIONS with .report.json)"
    )
    p.add_argument(
        "--log-dir",
        metavar="DIR",
        help="SWE-bench's logs folder: DIR/run_evaluation/RUN_ID/MODEL/INSTANCE/ (default: logs/ next to the report)",
    )
    p.add_argument(
        "--run-id",
        metavar="ID",
        help="SWE-bench run id of the log folders (default: the predictions file's stem)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="test-command limit in seconds (default sandbox.grade_timeout_s)",
    )
    p.add_argument(
        "--config", default="embedded", metavar="CONFIG", help="preset or YAML the sandbox settings come from"
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted config overrides, e.g. sandbox.memory_mb=4096",
    )
    p.set_defaults(func=_grade)
