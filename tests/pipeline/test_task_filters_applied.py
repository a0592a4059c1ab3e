"""A run's training pool goes through the config's task filters (tasks.max_files_changed, max_lines_changed,
min_llm_score, drop_import_attribute_errors) when the run loads its tasks, with the counts in the run's log
and TensorBoard."""

from __future__ import annotations

import sys
from pathlib import Path

from swe_megatron.config.load import load_config
from swe_megatron.pipeline.tasks import ensure_tasks
from swe_megatron.tasks.load import write_tasks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tasks"))
from test_filters import diff, task  # noqa: E402  (the filter tests' task builder)


def _pool(tmp_path: Path) -> list[str]:
    """A train file with two good rows, one row violating each filter, and one without failure records."""
    rows = [
        task(0, meta={"llm_score": {"issue_text_score": 0, "test_score": 1}}),
        task(1, diff(7, 1), meta={"llm_score": 3.0}),
        task(2, diff(8, 1), meta={"llm_score": 3.0}),  # 8 files
        task(3, diff(1, 250), meta={"llm_score": 3.0}),  # 500 changed lines
        task(4, meta={"llm_score": {"issue_text_score": 2, "test_score": 0}}),  # quality 1 < 2
        task(5, meta={"llm_score": 3.0}, extra={"f2p_errors": {"t::a": "AttributeError"}}),
        task(
            6, meta={"llm_score": 3.0}, extra={"failure_log": "E   ModuleNotFoundError: No module named 'x'"}
        ),
        task(7, meta={"llm_score": 3.0}, extra={}),  # no failure record: kept, counted as unknown
    ]
    train = tmp_path / "pool" / "train.jsonl"
    write_tasks(rows, train)
    return [f"tasks.train_file={train}", f"tasks.test_file={tmp_path}/none.jsonl", "tasks.min_llm_score=2",
            f"run_dir={tmp_path}/run"]  # fmt: skip


def test_run_loads_only_tasks_that_pass_the_filters(tmp_path, capsys):
    cfg = load_config("embedded", _pool(tmp_path))
    train, test, *report = ensure_tasks(cfg)
    assert sorted(train) == ["t-0", "t-1", "t-7"] and test == []
    report = report[0]
    assert report.dropped == {"max_files_changed": 1, "max_lines_changed": 1, "min_llm_score": 1,
                              "drop_import_attribute_errors": 2}  # fmt: skip
    assert report.unknown == {"drop_import_attribute_errors": 1}
    log = capsys.readouterr().out
    assert "run: task filters on " in log and "kept 3/8" in log and "max_files_changed: -1" in log
    assert "drop_import_attribute_errors: kept 1 without the data it reads" in log


def test_filter_counts_go_to_tensorboard(tmp_path):
    from swe_megatron.monitor import read_scalars
    from swe_megatron.pipeline.driver import _open
    from swe_megatron.pipeline.run_dir import RunDir, open_monitor
    from swe_megatron.pipeline.tasks import log_task_filter

    cfg = load_config("embedded", _pool(tmp_path))
    run_dir = RunDir(cfg.run_dir)
    train, _test, report, _state = _open(cfg, run_dir)
    monitor = open_monitor(run_dir, cfg)
    log_task_filter(monitor, report)
    monitor.close()
    scalars = {k: v[-1][1] for k, v in read_scalars(run_dir.tensorboard).items() if k.startswith("tasks/")}
    assert scalars == {"tasks/total": 8, "tasks/kept": 3, "tasks/dropped_max_files_changed": 1,
                       "tasks/dropped_max_lines_changed": 1, "tasks/dropped_min_llm_score": 1,
                       "tasks/dropped_drop_import_attribute_errors": 2,
                       "tasks/unknown_drop_import_attribute_errors": 1}  # fmt: skip
    assert len(train) == 3
