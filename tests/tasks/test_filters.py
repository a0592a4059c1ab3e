"""The training pool's filters: each TasksConfig option drops what it should, and the counts say so."""

from __future__ import annotations

import re

import pytest

from swe_megatron.config.schema import TasksConfig
from swe_megatron.tasks.filters import filter_tasks, llm_quality, patch_size
from swe_megatron.tasks.schema import Task


def diff(files: int, lines_per_file: int) -> str:
    """A unified diff changing `files` files, each with `lines_per_file` lines replaced (2 changed lines each)."""
    out = []
    for f in range(files):
        out += [f"diff --git a/m{f}.py b/m{f}.py", f"--- a/m{f}.py", f"+++ b/m{f}.py"]
        out.append(f"@@ -1,{lines_per_file} +1,{lines_per_file} @@")
        out += [f"-old{i}" for i in range(lines_per_file)] + [f"+new{i}" for i in range(lines_per_file)]
    return "\n".join(out) + "\n"


def task(i: int, patch: str | None = None, meta: dict | None = None, extra: dict | None = None) -> Task:
    return Task(
        instance_id=f"t-{i}",
        repo="o/r",
        base_commit="0" * 40,
        patch=patch if patch is not None else diff(1, 1),
        test_patch="",
        problem_statement="bug",
        FAIL_TO_PASS=["t::a"],
        PASS_TO_PASS=[],
        meta=meta or {},
        extra=extra if extra is not None else {"f2p_errors": {"t::a": "AssertionError"}},
    )


def test_patch_size_counts_files_and_changed_lines():
    assert patch_size(diff(3, 5)) == (3, 30)
    with pytest.raises(ValueError, match="not a unified diff"):
        patch_size("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n-a\n")


def test_files_and_lines_limits_match_the_paper():
    cfg = TasksConfig()  # <= 7 files, < 500 lines
    tasks = [task(0, diff(7, 1)), task(1, diff(8, 1)), task(2, diff(1, 249)), task(3, diff(1, 250))]
    kept, report = filter_tasks(tasks, cfg)
    assert [t.instance_id for t in kept] == ["t-0", "t-2"]  # 8 files; 500 changed lines
    assert report.dropped == {"max_files_changed": 1, "max_lines_changed": 1}
    assert (report.total, report.kept) == (4, 2)
    assert "kept 2/4" in report.summary()


def test_llm_quality_from_rebench_scores():
    assert llm_quality({"llm_score": {"issue_text_score": 0, "test_score": 1, "difficulty_score": 3}}) == 2.0
    assert llm_quality({"llm_score": {"issue_text_score": 3}}) == 0.0
    assert llm_quality({"llm_score": 7.5}) == 7.5
    assert llm_quality({}) is None and llm_quality({"llm_score": {"difficulty_score": 1}}) is None


def test_min_llm_score_drops_low_quality_and_counts_unscored():
    cfg = TasksConfig(min_llm_score=2.0)
    tasks = [
        task(0, meta={"llm_score": {"issue_text_score": 0, "test_score": 1}}),
        task(1, meta={"llm_score": {"issue_text_score": 2, "test_score": 0}}),
        task(2),
    ]
    kept, report = filter_tasks(tasks, cfg)
    assert [t.instance_id for t in kept] == ["t-0", "t-2"]
    assert report.dropped == {"min_llm_score": 1}
    assert report.unknown["min_llm_score"] == 1
    assert filter_tasks(tasks, TasksConfig(min_llm_score=None))[1].dropped == {}


def test_import_and_attribute_error_failures_are_dropped():
    cfg = TasksConfig()
    tasks = [
        task(0, extra={"f2p_errors": {"t::a": "AssertionError"}}),
        task(1, extra={"f2p_errors": {"t::a": "AttributeError"}}),
        task(2, extra={"failure_log": "E   ModuleNotFoundError: No module named 'x'"}),
        task(3, meta={"failure_log": "E   ImportError: cannot import name 'y'"}),
        task(4, extra={}),  # no record: kept, counted as unknown
    ]
    kept, report = filter_tasks(tasks, cfg)
    assert [t.instance_id for t in kept] == ["t-0", "t-4"]
    assert report.dropped == {"drop_import_attribute_errors": 3}
    assert report.unknown == {"drop_import_attribute_errors": 1}
    kept_all, _ = filter_tasks(tasks, TasksConfig(drop_import_attribute_errors=False))
    assert len(kept_all) == 5


def test_first_filter_that_drops_is_the_one_counted():
    cfg = TasksConfig()
    both = task(0, diff(9, 300), extra={"f2p_errors": {"t::a": "AttributeError"}})
    _, report = filter_tasks([both, task(1, "not a diff")], cfg)
    assert report.dropped == {"max_files_changed": 1, "unreadable_patch": 1}


def test_factory_rejects_every_failure_the_import_attribute_filter_drops():
    """The embedded default's tasks come from the factory: it records every FAIL_TO_PASS failure type
    (extra.f2p_errors) and refuses the ones drop_import_attribute_errors drops, so its tasks pass that
    filter with evidence (not as unknown); a factory-shaped row passes the default filters."""
    from swe_megatron.tasks.factory.build import BAD_FAILURES
    from swe_megatron.tasks.filters import IMPORT_ATTRIBUTE

    names = re.findall(r"\w+Error", IMPORT_ATTRIBUTE.pattern)
    assert names and all(IMPORT_ATTRIBUTE.search(n) and n in BAD_FAILURES for n in names), names
    row = task(0, diff(1, 1), extra={"f2p_errors": {"tests/test_a.py::test_x": "AssertionError"}})
    kept, report = filter_tasks([row], TasksConfig())
    assert len(kept) == 1 and report.unknown == {} and "none dropped" in report.summary()
