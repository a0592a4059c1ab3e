"""The training pool's filters (the paper's task filters), each a TasksConfig option, with counts.

  max_files_changed             the gold patch changes at most this many files (paper: 7)
  max_lines_changed             ... and at most this many lines, added + removed (paper: fewer than 500)
  min_llm_score                 SWE-rebench's LLM quality annotation is at least this (see llm_quality)
  drop_import_attribute_errors  the failing tests do not fail with ImportError/AttributeError

Filters run in that order; a task is counted under the first filter that drops it. A task that lacks the
data a filter reads (no llm_score, no recorded failures) is kept, and counted under `unknown` for that
filter, which the run prints and logs beside the drops: never dropped for a missing field, never kept
silently. (The task factory's rows record every FAIL_TO_PASS failure in extra.f2p_errors, and the factory
itself rejects import/attribute failures; they carry no llm_score, so min_llm_score counts them unknown.)
`swe-megatron run` applies them to the training pool as it loads it (pipeline/tasks.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from swe_megatron.tasks.schema import Task

LLM_SCORE_SCALE = 3.0
"""SWE-rebench's llm_score sub-scores follow SWE-bench Verified's annotation scale: 0 (no problem) to 3."""
IMPORT_ATTRIBUTE = re.compile(r"\b(ImportError|ModuleNotFoundError|AttributeError)\b")


@dataclass
class FilterReport:
    """What the filters did to one list of tasks."""

    total: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    """Filter name -> tasks it dropped."""
    unknown: dict[str, int] = field(default_factory=dict)
    """Filter name -> tasks it kept for lack of the data it reads (no llm_score, no failure record)."""

    def summary(self) -> str:
        """One line: kept/total, the drops per filter, and the tasks kept for lack of a filter's data."""
        drops = ", ".join(f"{k}: -{v}" for k, v in self.dropped.items()) or "none dropped"
        unknown = "".join(f"; {k}: kept {v} without the data it reads" for k, v in self.unknown.items())
        return f"kept {self.kept}/{self.total} ({drops}){unknown}"

    def scalars(self) -> dict[str, int]:
        """The counts as flat scalars: total, kept, dropped_<filter>, unknown_<filter>."""
        return {
            "total": self.total,
            "kept": self.kept,
            **{f"dropped_{k}": v for k, v in self.dropped.items()},
            **{f"unknown_{k}": v for k, v in self.unknown.items()},
        }


def patch_size(patch: str) -> tuple[int, int]:
    """(files changed, lines added + removed) of a unified diff; raises ValueError when it is not one."""
    try:
        ps = PatchSet(patch)
    except UnidiffParseError as e:
        raise ValueError(f"not a unified diff: {e}") from None
    if not len(ps):
        raise ValueError("not a unified diff: it changes no file")
    return len(ps), sum(f.added + f.removed for f in ps)


def llm_quality(meta: dict[str, Any]) -> float | None:
    """A quality number, higher is better, from meta.llm_score: a bare number is taken as it is; SWE-rebench's
    {issue_text_score, test_score, difficulty_score} (0 best .. 3 worst) gives 3 - max(issue_text_score,
    test_score), so a threshold of 2 keeps tasks whose issue text and tests both scored 0 or 1. None when absent."""
    score = (meta or {}).get("llm_score")
    if isinstance(score, int | float) and not isinstance(score, bool):
        return float(score)
    if isinstance(score, dict):
        parts = [score.get(k) for k in ("issue_text_score", "test_score")]
        parts = [float(p) for p in parts if isinstance(p, int | float) and not isinstance(p, bool)]
        if parts:
            return LLM_SCORE_SCALE - max(parts)
    return None


def failure_evidence(task: Task) -> str | None:
    """The recorded failure output of the task's FAIL_TO_PASS tests before the fix, or None when the row has
    none. Read from extra["f2p_errors"] ({test: exception type or text}, written by make-tasks) or
    extra["failure_log"] / meta["failure_log"] (a test log)."""
    extra = task.extra or {}
    parts = []
    errors = extra.get("f2p_errors")
    if isinstance(errors, dict):
        parts += [str(v) for v in errors.values()]
    for holder in (extra, task.meta or {}):
        log = holder.get("failure_log")
        if isinstance(log, str):
            parts.append(log)
    return "\n".join(parts) if parts else None


def filter_tasks(tasks: list[Task], cfg: Any) -> tuple[list[Task], FilterReport]:
    """The tasks that pass every filter of `cfg` (a TasksConfig), and the report of what each dropped."""
    report = FilterReport(total=len(tasks))
    kept = []
    for task in tasks:
        reason = _drop_reason(task, cfg, report)
        if reason is None:
            kept.append(task)
        else:
            report.dropped[reason] = report.dropped.get(reason, 0) + 1
    report.kept = len(kept)
    return kept, report


def _drop_reason(task: Task, cfg: Any, report: FilterReport) -> str | None:
    try:
        files, lines = patch_size(task.patch)
    except ValueError:
        return "unreadable_patch"
    if cfg.max_files_changed is not None and files > cfg.max_files_changed:
        return "max_files_changed"
    if cfg.max_lines_changed is not None and lines > cfg.max_lines_changed:
        return "max_lines_changed"
    if cfg.min_llm_score is not None:
        quality = llm_quality(task.meta)
        if quality is None:
            report.unknown["min_llm_score"] = report.unknown.get("min_llm_score", 0) + 1
        elif quality < cfg.min_llm_score:
            return "min_llm_score"
    if cfg.drop_import_attribute_errors:
        evidence = failure_evidence(task)
        if evidence is None:
            report.unknown["drop_import_attribute_errors"] = (
                report.unknown.get("drop_import_attribute_errors", 0) + 1
            )
        elif IMPORT_ATTRIBUTE.search(evidence):
            return "drop_import_attribute_errors"
    return None
