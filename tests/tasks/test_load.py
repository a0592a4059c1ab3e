"""Task loaders: JSONL, JSON, parquet, string-encoded test lists, malformed rows, the hub when offline."""

from __future__ import annotations

import json
import time

import pytest

from swe_megatron.tasks.load import (
    HubUnavailable,
    TaskFormatError,
    load_tasks,
    parse_hub_uri,
    task_from_row,
    write_tasks,
)
from swe_megatron.tasks.schema import Task


def swebench_row(i: int = 1, **over) -> dict:
    """A row as SWE-bench publishes it (test lists as JSON strings)."""
    row = {
        "repo": "astropy/astropy",
        "instance_id": f"astropy__astropy-{i:05d}",
        "base_commit": "a" * 40,
        "patch": "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n",
        "test_patch": "",
        "problem_statement": "a is wrong",
        "hints_text": "",
        "created_at": "2023-01-01T00:00:00Z",
        "version": "5.1",
        "FAIL_TO_PASS": json.dumps(["tests/test_x.py::test_a"]),
        "PASS_TO_PASS": json.dumps(["tests/test_x.py::test_b", "tests/test_x.py::test_c[1 2]"]),
        "environment_setup_commit": "b" * 40,
    }
    row.update(over)
    return row


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_jsonl_with_string_encoded_lists(tmp_path):
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [swebench_row(1), swebench_row(2, FAIL_TO_PASS=["a::b"], PASS_TO_PASS=[])])
    tasks = load_tasks(path)
    assert [t.instance_id for t in tasks] == ["astropy__astropy-00001", "astropy__astropy-00002"]
    assert tasks[0].FAIL_TO_PASS == ["tests/test_x.py::test_a"]
    assert tasks[0].PASS_TO_PASS == ["tests/test_x.py::test_b", "tests/test_x.py::test_c[1 2]"]
    assert tasks[1].FAIL_TO_PASS == ["a::b"] and tasks[1].PASS_TO_PASS == []
    assert tasks[0].version == "5.1" and tasks[0].environment_setup_commit == "b" * 40


def test_rebench_extras_meta_and_unknown_fields(tmp_path):
    meta = {
        "llm_score": {"difficulty_score": 1, "issue_text_score": 0, "test_score": 2},
        "num_modified_files": 1,
    }
    row = swebench_row(
        1, meta=json.dumps(meta), docker_image="swerebench/x:1", install_config={"python": "3.9"}
    )
    row["extra"] = {"repo_dir": "repos/x"}
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [row])
    (task,) = load_tasks(path)
    assert task.meta == meta
    assert task.docker_image == "swerebench/x:1"
    assert task.extra == {"repo_dir": str(tmp_path / "repos" / "x"), "install_config": {"python": "3.9"}}


def test_version_number_and_missing_optionals():
    row = swebench_row(1, version=0.12)
    for key in ("hints_text", "created_at", "environment_setup_commit", "test_patch"):
        del row[key]
    task = task_from_row(row)
    assert task.version == "0.12" and task.hints_text == "" and task.test_patch == ""


def test_write_then_load_round_trips(tmp_path):
    tasks = [
        Task(
            instance_id=f"x__y-{i}",
            repo="x/y",
            base_commit="c" * 40,
            patch="p",
            test_patch="tp",
            problem_statement="ünïcode statement",
            FAIL_TO_PASS=["t::a"],
            PASS_TO_PASS=["t::b"],
            meta={"llm_score": {"test_score": 0}},
            extra={"repo_dir": str(tmp_path / "repos" / "x"), "mutation": {"line": 3}},
        )
        for i in range(3)
    ]
    path = tmp_path / "sub" / "tasks.jsonl"
    write_tasks(tasks, path)
    assert load_tasks(path) == tasks
    assert [p.name for p in path.parent.iterdir()] == ["tasks.jsonl"]  # no temp file left behind


def test_json_list_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([swebench_row(1), swebench_row(2)]))
    assert len(load_tasks(path)) == 2


def test_parquet_swebench_and_rebench_exports(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [swebench_row(i) for i in range(1, 4)]
    path = tmp_path / "verified.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    tasks = load_tasks(path)
    assert [t.instance_id for t in tasks] == [r["instance_id"] for r in rows]
    assert tasks[2].PASS_TO_PASS == ["tests/test_x.py::test_b", "tests/test_x.py::test_c[1 2]"]
    # SWE-rebench style: lists as list columns, meta as a struct.
    meta = {"llm_score": {"difficulty_score": 1, "issue_text_score": 1, "test_score": 0}, "is_lite": False}
    rebench = [swebench_row(9, FAIL_TO_PASS=["a::x"], PASS_TO_PASS=["a::y"], meta=meta, docker_image="img")]
    path2 = tmp_path / "rebench.parquet"
    pq.write_table(pa.Table.from_pylist(rebench), path2)
    (task,) = load_tasks(path2)
    assert task.FAIL_TO_PASS == ["a::x"] and task.meta == meta and task.docker_image == "img"


def test_parquet_bad_row_names_the_row_and_field(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [swebench_row(1), swebench_row(2, FAIL_TO_PASS="not json")]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(TaskFormatError, match=r"bad\.parquet: row 2: field 'FAIL_TO_PASS'"):
        load_tasks(path)


@pytest.mark.parametrize(
    ("change", "field", "what"),
    [
        ({"FAIL_TO_PASS": "[1, 2]"}, "FAIL_TO_PASS", "list of test ids"),
        ({"PASS_TO_PASS": "tests/test_x.py::test_b"}, "PASS_TO_PASS", "not a JSON list"),
        ({"PASS_TO_PASS": None}, "PASS_TO_PASS", "missing"),
        ({"patch": None}, "patch", "missing"),
        ({"base_commit": ["a"]}, "base_commit", "expected a string"),
        ({"meta": "[1]"}, "meta", "expected an object"),
        ({"instance_id": ""}, "instance_id", "empty"),
    ],
)
def test_malformed_row_names_file_line_and_field(tmp_path, change, field, what):
    path = tmp_path / "t.jsonl"
    bad = swebench_row(2)
    bad.update(change)
    lines = [json.dumps(swebench_row(1)), "", json.dumps(bad)]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TaskFormatError) as e:
        load_tasks(path)
    assert f"{path}:3: field '{field}'" in str(e.value)
    assert what in str(e.value)


def test_invalid_json_and_non_object_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(swebench_row(1)) + "\n{oops\n")
    with pytest.raises(TaskFormatError, match=r"t\.jsonl:2: not valid JSON"):
        load_tasks(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(TaskFormatError, match=r"t\.jsonl:1: expected a JSON object"):
        load_tasks(path)


def test_duplicate_instance_id_names_both_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [swebench_row(1), swebench_row(1)])
    with pytest.raises(TaskFormatError, match=r"t\.jsonl:2: field 'instance_id'.*repeats .*t\.jsonl:1"):
        load_tasks(path)


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="make-tasks"):
        load_tasks(tmp_path / "nope.jsonl")
    (tmp_path / "t.csv").write_text("x")
    with pytest.raises(TaskFormatError, match="unknown tasks format"):
        load_tasks(tmp_path / "t.csv")


def test_hub_uri_parsing():
    assert parse_hub_uri("hf://datasets/SWE-bench/SWE-bench_Verified") == (
        "SWE-bench/SWE-bench_Verified",
        "test",
    )
    assert parse_hub_uri("hf://datasets/nebius/SWE-rebench:train") == ("nebius/SWE-rebench", "train")
    with pytest.raises(TaskFormatError, match="expected hf://datasets/OWNER/NAME"):
        parse_hub_uri("hf://models/x")


def test_hub_without_network_fails_fast_with_a_clear_message():
    """This machine reaches PyPI only: loading from the hub must say so (and how to go on) within seconds."""
    start = time.monotonic()
    try:
        tasks = load_tasks("hf://datasets/SWE-bench/SWE-bench_Verified:test", hub_timeout_s=3.0)
    except HubUnavailable as e:
        message = str(e)
    else:  # pragma: no cover - only where the hub is reachable
        assert tasks
        pytest.skip("the Hugging Face hub is reachable here")
    assert time.monotonic() - start < 15
    assert "hf://datasets/SWE-bench/SWE-bench_Verified:test" in message
    assert "not reachable" in message
    assert "parquet or JSONL" in message  # what to do instead


def test_relative_repo_and_env_dirs_are_taken_from_the_tasks_files_folder(tmp_path, monkeypatch):
    """The one task loader resolves extra.repo_dir / env_dir against the file's folder, whatever the working
    directory (the sandboxes and the grader get host paths); absolute ones and a missing env_dir stay."""
    row = swebench_row(1)
    row["extra"] = {"repo_dir": "repos/x", "env_dir": "../envs/x"}
    other = swebench_row(2, repo_dir="/abs/repo")
    path = tmp_path / "sub" / "t.jsonl"
    path.parent.mkdir()
    write_jsonl(path, [row, other])
    monkeypatch.chdir(tmp_path)
    first, second = load_tasks(path.relative_to(tmp_path))
    assert first.extra["repo_dir"] == str(tmp_path / "sub" / "repos" / "x")
    assert first.extra["env_dir"] == str(tmp_path / "envs" / "x")
    assert second.extra == {"repo_dir": "/abs/repo"}
