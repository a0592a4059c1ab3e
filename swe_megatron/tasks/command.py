"""`swe-megatron make-tasks --out DIR [--package NAME==VERSION ...] [--max-tasks N] [--seed S]`.

Builds SWE-bench-format tasks offline from pinned PyPI sdists (swe_megatron/tasks/factory/build.py says
how and what lands in DIR). Reruns with the same inputs return at once from DIR's cache.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from swe_megatron.errors import UsageError
from swe_megatron.tasks.factory.build import FactoryConfig, NoTasks, make_tasks
from swe_megatron.tasks.factory.pypi import DEFAULT_PACKAGES, PackageSpec


def _make_tasks(args: argparse.Namespace) -> int:
    try:
        packages = tuple(PackageSpec.parse(p) for p in args.package) if args.package else DEFAULT_PACKAGES
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.max_tasks < 1 or args.workers < 1:
        raise UsageError("--max-tasks and --workers must be >= 1")
    cfg = FactoryConfig(
        out=args.out,
        packages=packages,
        test_libraries=tuple(args.test_library) if args.test_library else None,
        max_tasks=args.max_tasks,
        seed=args.seed,
        workers=args.workers,
    )
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} is a file; give a folder (new, or an earlier make-tasks output)")
    _refuse_other_task_set(out, cfg, args)
    try:  # a library's refusal is logged as it happens; its reason is printed once, at the end
        report = make_tasks(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
    except NoTasks as e:
        raise UsageError(str(e)) from None
    for lib in report["libraries"]:
        if lib.get("status") == "used":
            print(f"{lib['package']}: {lib['tasks']} tasks ({lib.get('split')})")
        else:
            print(f"{lib['package']}: not used ({lib.get('stage')}: {lib.get('reason')})")
    print(f"tasks: {report['tasks']['train']} train, {report['tasks']['test']} test -> {args.out}")
    return 0


def _refuse_other_task_set(out: Path, cfg: FactoryConfig, args: argparse.Namespace) -> None:
    """An --out holding a task set built with other settings is rebuilt only with --replace: it may be a run's
    tasks.train_file (data/tasks is the pipeline's cache), and a rebuild changes its tasks silently."""
    try:
        old = json.loads((out / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(old, dict) or old.get("cache_key") in (None, cfg.cache_key()) or args.replace:
        return
    built = ", ".join(f"{k} {old[k]}" for k in ("max_tasks", "seed") if k in old)
    raise UsageError(
        f"--out {args.out} holds {sum((old.get('tasks') or {}).values())} tasks built with other settings "
        f"({built}; a run's tasks.train_file may point there): give another --out, or pass --replace to rebuild "
        "them there"
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add the make-tasks subcommand."""
    defaults = ", ".join(p.requirement for p in DEFAULT_PACKAGES)
    p = sub.add_parser(
        "make-tasks",
        help="build SWE-bench-format tasks offline from PyPI sdists and their test suites",
        description=f"Mutates tested functions of real libraries into tasks. Default libraries: {defaults}.",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output folder (train.jsonl, test.jsonl, repos/, envs/ ...)",
    )
    p.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="a library to use (repeatable); default: the pinned list above",
    )
    p.add_argument("--max-tasks", type=int, default=72, metavar="N", help="tasks in all (default 72)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="mutation choice and order (default 0)")
    p.add_argument("--workers", type=int, default=2, help="test runs in parallel (default 2)")
    p.add_argument(
        "--test-library",
        action="append",
        default=[],
        metavar="NAME",
        help="a library whose tasks go to test.jsonl (repeatable); default: inflection and tabulate for the "
        "default list, else a seeded quarter of the libraries",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="rebuild an --out that holds a task set built with other settings (refused without it)",
    )
    p.set_defaults(func=_make_tasks)
