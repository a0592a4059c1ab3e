"""The run's tasks: the training pool and the held-out tasks named by the config, built offline when missing.

The training pool goes through the config's filters (tasks.max_files_changed, max_lines_changed,
min_llm_score, drop_import_attribute_errors; tasks/filters.py) before tasks.max_train_tasks picks from it;
the held-out tasks are not filtered (they are the benchmark as given). The counts go to the run's log here
and to TensorBoard (tasks/*) through log_task_filter.
"""

from __future__ import annotations

import sys
from pathlib import Path

from swe_megatron.errors import UsageError
from swe_megatron.tasks.factory.build import FactoryConfig, make_tasks
from swe_megatron.tasks.filters import FilterReport, filter_tasks
from swe_megatron.tasks.load import load_tasks


def spread_over_repos(tasks: list) -> list:
    """Tasks in round-robin order over their repositories (each repository's own order kept), so that the first
    N span as many libraries as possible."""
    by_repo: dict[str, list] = {}
    for t in tasks:
        by_repo.setdefault(t.repo, []).append(t)
    queues = [by_repo[r] for r in sorted(by_repo)]
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def ensure_tasks(cfg) -> tuple[dict, list, FilterReport]:
    """Training tasks that pass the filters (dict by id; at most tasks.max_train_tasks, spread over the
    repositories), held-out tasks, and the filters' report; built with the factory if missing."""
    train_file = Path(cfg.tasks.train_file)
    if not train_file.exists():
        if train_file.name != "train.jsonl":
            raise UsageError(f"tasks.train_file={train_file} does not exist; build tasks with make-tasks")
        print(
            f"run: {train_file} is missing; building tasks offline into {train_file.parent} (cached)",
            flush=True,
        )
        make_tasks(FactoryConfig(out=str(train_file.parent), max_tasks=cfg.tasks.factory_max_tasks),
                   log=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    try:
        train = load_tasks(train_file)
        test_file = Path(cfg.eval.tasks or cfg.tasks.test_file)
        test = load_tasks(test_file) if test_file.exists() else []
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read tasks: {e}") from None
    train, report = filter_tasks(train, cfg.tasks)
    print(f"run: task filters on {train_file}: {report.summary()}", flush=True)
    if not train and report.total:
        raise UsageError(
            f"no task of {train_file} passes the filters ({report.summary()}): relax tasks.max_files_changed, "
            "tasks.max_lines_changed, tasks.min_llm_score or tasks.drop_import_attribute_errors"
        )
    train = sorted(train, key=lambda t: t.instance_id)
    if cfg.tasks.max_train_tasks:
        train = spread_over_repos(train)[: cfg.tasks.max_train_tasks]
    if not train:
        raise UsageError(f"{train_file} holds no tasks")
    return {t.instance_id: t for t in train}, test, report


def log_task_filter(monitor, report: FilterReport) -> None:
    """The filters' counts as TensorBoard scalars tasks/* at step 0 (the pool is filtered once per run)."""
    monitor.scalars("tasks", report.scalars(), 0)
