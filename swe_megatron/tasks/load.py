"""Loading tasks: SWE-bench / SWE-rebench rows from JSONL, JSON, parquet or the Hugging Face hub.

Sources:
  PATH.jsonl / PATH.json      one object per line (a JSON list is accepted too)
  PATH.parquet                e.g. SWE-bench Verified or SWE-rebench exports (needs pyarrow)
  hf://datasets/NAME[:SPLIT]  the hub (default split "test"), when the network allows

FAIL_TO_PASS / PASS_TO_PASS may be lists or JSON strings of lists (as SWE-bench publishes them); `meta`
may be a dict or a JSON string. Fields outside the SWE-bench schema are kept in Task.extra. Relative paths in
extra (repo_dir, env_dir) are taken from the tasks file's folder (made absolute here, the only place).
A malformed row raises TaskFormatError naming the file, the line (or row) and the field. Each loaded task gets
its grading plan here (tasks/plan.py: Task.plan), or the one line saying why it cannot be graded (Task.plan_problem),
which the commands that grade report before any work starts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from swe_megatron.atomic_write import write_atomic
from swe_megatron.errors import UsageError
from swe_megatron.tasks.plan import PlanError, make_plan
from swe_megatron.tasks.schema import Task

HUB_PREFIX = "hf://datasets/"
REQUIRED_TEXT = ("instance_id", "repo", "base_commit", "patch", "problem_statement")
OPTIONAL_TEXT = (
    "test_patch",
    "hints_text",
    "created_at",
    "version",
    "environment_setup_commit",
    "docker_image",
)
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
ROW_FIELDS = tuple(f.name for f in dataclasses.fields(Task) if f.init)
"""The fields a tasks file holds (the plan is made again when it is read)."""
SWEBENCH_5X_FIELDS = ("image", "eval_script", "log_parser", "eval_type")
"""SWE-bench 5.x's grading columns (swebench 5.0.2 make_test_spec): kept in Task.extra when read, written as
top-level columns (as SWE-bench publishes them) by write_tasks."""


class TaskFormatError(ValueError):
    """A tasks file or row that cannot be read; the message names the file, line/row and field."""


class HubUnavailable(OSError):
    """The Hugging Face hub cannot be reached (or its client is missing)."""


def load_tasks(source: str | os.PathLike, *, hub_timeout_s: float = 10.0) -> list[Task]:
    """All tasks of a file or hub dataset, in file order; TaskFormatError on a malformed row or a duplicate
    instance_id, FileNotFoundError / HubUnavailable when the source cannot be read."""
    text = str(source)
    if text.startswith("hf://"):
        return _load_hub(text, hub_timeout_s)
    path = Path(text)
    if not path.is_file():
        raise FileNotFoundError(
            f"tasks file {path} does not exist (build one with `swe-megatron make-tasks --out DIR`)"
        )
    if path.suffix == ".parquet":
        rows = ((f"{path}: row {i}", row) for i, row in enumerate(_parquet_rows(path), 1))
    elif path.suffix in (".jsonl", ".json"):
        rows = _json_rows(path)
    else:
        raise TaskFormatError(f"{path}: unknown tasks format {path.suffix!r}; use .jsonl, .json or .parquet")
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for where, row in rows:
        task = task_from_row(row, where)
        _resolve_paths(task, path.parent)
        attach_plan(task)
        if task.instance_id in seen:
            raise TaskFormatError(
                f"{where}: field 'instance_id': {task.instance_id!r} repeats {seen[task.instance_id]}"
            )
        seen[task.instance_id] = where
        tasks.append(task)
    return tasks


def task_from_row(row: Any, where: str = "row") -> Task:
    """One Task from a SWE-bench/SWE-rebench row; TaskFormatError names `where` and the bad field."""
    if not isinstance(row, dict):
        raise TaskFormatError(f"{where}: expected a JSON object (one task), got {type(row).__name__}")
    values: dict[str, Any] = {}
    for name in REQUIRED_TEXT:
        if row.get(name) is None:
            raise TaskFormatError(
                f"{where}: field {name!r} is missing (SWE-bench rows need {', '.join(REQUIRED_TEXT)})"
            )
        values[name] = _text(row[name], name, where)
    if not values["instance_id"]:
        raise TaskFormatError(f"{where}: field 'instance_id' is empty")
    for name in OPTIONAL_TEXT:
        values[name] = "" if row.get(name) is None else _text(row[name], name, where)
    for name in TEST_LISTS:
        if name not in row or row[name] is None:
            raise TaskFormatError(f"{where}: field {name!r} is missing (a list of test ids, may be empty)")
        values[name] = _test_list(row[name], name, where)
    values["meta"] = _mapping(row.get("meta"), "meta", where)
    extra = _mapping(row.get("extra"), "extra", where)
    for key, value in row.items():
        if key not in ROW_FIELDS:
            extra.setdefault(key, _plain(value))
    if (
        row.get("install_config") is not None
    ):  # SWE-rebench's: an object, or a JSON string of one in some exports
        extra["install_config"] = _mapping(row["install_config"], "install_config", where)
    values["extra"] = extra
    return Task(**values)


def _resolve_paths(task: Task, folder: Path) -> None:
    """extra.repo_dir / env_dir relative to `folder` (the tasks file's) -> absolute host paths."""
    for key in ("repo_dir", "env_dir"):
        value = task.extra.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            task.extra[key] = str((folder / value).resolve())


def attach_plan(task: Task) -> None:
    """Make the task's grading plan (Task.plan), or record in one line why its row cannot be graded."""
    try:
        task.plan, task.plan_problem = make_plan(task), ""
    except PlanError as e:
        task.plan, task.plan_problem = None, str(e)


def load_tasks_for_command(
    source: str | os.PathLike, max_tasks: int | None = None, *, gradable: bool = True
) -> list[Task]:
    """load_tasks for a command's task-file argument, the first max_tasks (None: all). One UsageError, before
    any work starts, for a source that cannot be read, holds a malformed row or no task at all, a max_tasks
    below 1, a task whose local repository or environment (extra.repo_dir / env_dir) is not there (a tasks
    file moved away from the folders next to it), or (gradable) a task whose row cannot be graded."""
    if max_tasks is not None and max_tasks < 1:
        raise UsageError(
            f"--max-tasks {max_tasks} is invalid; allowed: an integer >= 1 (omit it for all tasks)"
        )
    if Path(source).is_dir():
        raise UsageError(
            f"tasks {source} is a folder; give a tasks file in it (e.g. {Path(source) / 'train.jsonl'})"
        )
    try:
        tasks = load_tasks(source)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read tasks from {source}: {e}") from None
    if not tasks:
        raise UsageError(f"tasks file {source} holds no task")
    tasks = tasks[:max_tasks]
    missing = [
        (t.instance_id, key, t.extra[key])
        for t in tasks
        for key in ("repo_dir", "env_dir")
        if isinstance(t.extra.get(key), str) and t.extra[key] and not Path(t.extra[key]).is_dir()
    ]
    if missing:
        iid, key, path = missing[0]
        raise UsageError(
            f"tasks file {source}: {len(missing)} local folder(s) are missing, e.g. {iid}'s {key} {path}; "
            "keep the tasks file next to the folders it names (relative paths are read from its folder)"
        )
    bad = [t.plan_problem for t in tasks if gradable and t.plan is None]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UsageError(
            f"tasks file {source}: {len(bad)} of {len(tasks)} tasks cannot be graded{more}: {bad[0]}"
        )
    return tasks


def write_tasks(tasks: list[Task], path: str | os.PathLike) -> None:
    """Write tasks as JSONL (FAIL_TO_PASS/PASS_TO_PASS as lists), atomically (temp file, then rename); SWE-bench
    5.x's grading columns (SWEBENCH_5X_FIELDS) top-level, the rest of extra under `extra`."""

    def row(t: Task) -> dict:
        top = {k: t.extra[k] for k in SWEBENCH_5X_FIELDS if k in t.extra}
        extra = {k: v for k, v in t.extra.items() if k not in top}
        return {**{f: getattr(t, f) for f in ROW_FIELDS}, "extra": extra, **top}

    rows = (row(t) for t in tasks)
    write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


# -- fields ---------------------------------------------------------------------------------------------


def _text(value: Any, name: str, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # e.g. version 0.12 written as a number
    raise TaskFormatError(
        f"{where}: field {name!r}: expected a string, got {type(value).__name__} {_show(value)}"
    )


def _test_list(value: Any, name: str, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as e:
            raise TaskFormatError(
                f"{where}: field {name!r}: a string that is not a JSON list ({e.msg}): {_show(value)}"
            ) from None
    if hasattr(value, "tolist"):  # numpy arrays from pandas-written parquet
        value = value.tolist()
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise TaskFormatError(
            f"{where}: field {name!r}: expected a list of test ids (or a JSON string of one), got {_show(value)}"
        )
    return list(value)


def _mapping(value: Any, name: str, where: str) -> dict:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TaskFormatError(
                f"{where}: field {name!r}: a string that is not a JSON object ({e.msg})"
            ) from None
    if not isinstance(value, dict):
        raise TaskFormatError(
            f"{where}: field {name!r}: expected an object, got {type(value).__name__} {_show(value)}"
        )
    return {k: _plain(v) for k, v in value.items()}


def _plain(value: Any) -> Any:
    """JSON-friendly copy (datetimes as ISO strings, arrays as lists)."""
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- sources --------------------------------------------------------------------------------------------


def _json_rows(path: Path):
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        for i, row in enumerate(rows, 1):
            yield f"{path}: item {i}", row
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
        yield f"{path}:{n}", row


def _parquet_rows(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskFormatError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise TaskFormatError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})") from None


def parse_hub_uri(uri: str) -> tuple[str, str]:
    """hf://datasets/OWNER/NAME[:SPLIT] -> (OWNER/NAME, SPLIT); split defaults to "test"."""
    if not uri.startswith(HUB_PREFIX) or len(uri) == len(HUB_PREFIX):
        raise TaskFormatError(
            f"{uri}: expected hf://datasets/OWNER/NAME[:SPLIT], e.g. hf://datasets/SWE-bench/SWE-bench_Verified:test"
        )
    rest = uri[len(HUB_PREFIX) :]
    name, _, split = rest.partition(":")
    return name.strip("/"), split or "test"


def _load_hub(uri: str, timeout_s: float) -> list[Task]:
    name, split = parse_hub_uri(uri)
    advice = (
        f"download the dataset's {split} split as parquet or JSONL where the hub is reachable and pass that file "
        "instead (e.g. tasks.train_file=data/swe-rebench/train.parquet)"
    )
    try:
        import httpx
        from huggingface_hub import HfApi, constants, hf_hub_download
    except ImportError as e:
        raise HubUnavailable(
            f"cannot load {uri}: the Hugging Face client is not installed ({e}); {advice}"
        ) from None
    endpoint = constants.ENDPOINT
    try:  # one quick request first: the hub client retries for minutes when offline
        httpx.head(f"{endpoint}/api/datasets/{name}", timeout=timeout_s, follow_redirects=True)
    except httpx.HTTPError as e:
        raise HubUnavailable(
            f"cannot load {uri}: the Hugging Face hub ({endpoint}) is not reachable from here "
            f"({type(e).__name__}: {e}); {advice}"
        ) from None
    try:
        files = HfApi().list_repo_files(name, repo_type="dataset")
        wanted = sorted(
            f
            for f in files
            if f.endswith((".parquet", ".jsonl"))
            and (Path(f).name.startswith(f"{split}-") or Path(f).stem == split or f"/{split}/" in f"/{f}")
        )
        if not wanted:
            raise TaskFormatError(f"{uri}: dataset {name} has no parquet/JSONL files for split {split!r}")
        tasks: list[Task] = []
        for f in wanted:
            local = hf_hub_download(name, f, repo_type="dataset")
            tasks += load_tasks(local)
    except TaskFormatError:
        raise
    except Exception as e:  # noqa: BLE001 - network and hub errors of many kinds
        raise HubUnavailable(f"cannot load {uri}: {type(e).__name__}: {e}; {advice}") from None
    return tasks
