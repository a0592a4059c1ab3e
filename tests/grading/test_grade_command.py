"""`swe-megatron grade`: bad input ends in one clear message; a real run writes SWE-bench's report keys."""

from __future__ import annotations

import dataclasses
import json

import pytest
from attacks import ATTACKS, FIX, RUNNER_ATTACKS
from tiny_task import INIT, diff
from tiny_task import unbuilt_task as make_task

from swe_megatron.cli import main
from swe_megatron.grading.report import PredictionsError, load_predictions


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def task_row(task) -> dict:
    return dataclasses.asdict(task)


@pytest.fixture
def files(tmp_path):
    # repo_dir: a folder that exists (tasks whose folders are missing are refused at load)
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [task_row(make_task(repo_dir=str(tmp_path)))])
    return tasks, tmp_path


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"instance_id": "a", "model_patch": ""}\nnot json\n', "line 2: not valid JSON"),
        ('{"model_patch": ""}\n', "line 1: missing or empty instance_id"),
        ('{"instance_id": "a"}\n', "missing model_patch"),
        ('{"instance_id": "a", "model_patch": 3}\n', "model_patch must be a string or null"),
        (
            '{"instance_id": "a", "model_patch": ""}\n{"instance_id": "a", "model_patch": ""}\n',
            "appears twice",
        ),
        ("\n", "no predictions"),
        ('[{"instance_id": "a", "model_patch": null}, 5]', "item 2: expected an object"),
        # a non-string model name was stored as its repr ("{'x': 1}") in the report
        (
            '{"instance_id": "a", "model_patch": "", "model_name_or_path": {"x": 1}}\n',
            "model_name_or_path must be",
        ),
        ('{"instance_id": "a", "model_patch": "", "model_name_or_path": 7}\n', "model_name_or_path must be"),
    ],
)
def test_malformed_predictions_are_named(tmp_path, content, message):
    path = tmp_path / "preds.jsonl"
    path.write_text(content)
    with pytest.raises(PredictionsError, match=message):
        load_predictions(path)


def test_null_patch_is_an_empty_string(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl", [{"instance_id": "a", "model_name_or_path": "m", "model_patch": None}]
    )
    assert load_predictions(path)["a"]["model_patch"] == ""


@pytest.mark.parametrize(
    "predictions, message",
    [
        ([{"instance_id": "nope__nope-1", "model_patch": ""}], "instance ids not in tasks file"),
        (None, "cannot read it"),
        ("broken", "line 1: not valid JSON"),
    ],
)
def test_grade_command_rejects_bad_input_with_one_line(files, capsys, predictions, message):
    tasks, tmp = files
    preds = tmp / "preds.jsonl"
    if predictions == "broken":
        preds.write_text("{oops\n")
    elif predictions is not None:
        write_jsonl(preds, predictions)
    code = main(["grade", "--tasks", str(tasks), "--predictions", str(preds)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp / "preds.report.json").exists()


@pytest.mark.parametrize(
    "flag, value", [("--timeout", v) for v in ("nan", "inf", "-5", "0")] + [("--workers", "0")]
)
def test_grade_command_refuses_a_bad_limit(files, capsys, flag, value):
    """--timeout nan|inf exited 0 with every instance "grading crashed"; -5 and 0 silently became 1 s."""
    tasks, tmp = files
    preds = write_jsonl(tmp / "p.jsonl", [{"instance_id": "calc__calc-0001", "model_patch": ""}])
    code = main(["grade", "--tasks", str(tasks), "--predictions", str(preds), f"{flag}={value}"])
    err = capsys.readouterr().err
    assert code == 2 and flag in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp / "p.report.json").exists()


def test_grade_command_rejects_tasks_it_cannot_grade(files, capsys):
    tasks, tmp = files
    write_jsonl(tasks, [task_row(make_task(test_cmd="", repo_dir=str(tmp)))])
    preds = write_jsonl(tmp / "p.jsonl", [{"instance_id": "calc__calc-0001", "model_patch": ""}])
    assert main(["grade", "--tasks", str(tasks), "--predictions", str(preds)]) == 2
    assert "no extra.test_cmd" in capsys.readouterr().err


@pytest.mark.sandbox
def test_grade_command_end_to_end(tiny, sandbox_factory, tmp_path, capsys):
    """Gold, empty, cheating and tampering predictions for copies of the tiny task, two graders at once."""
    task = tiny
    rows, preds = [], []
    for name, patch in [
        ("gold", task.patch),
        ("empty", ""),
        ("cheat", ATTACKS["conftest_rewrites_outcomes"][0]),
        ("tamper", FIX + diff(("calc/__init__.py", INIT, RUNNER_ATTACKS["runtest_noop"] + INIT))),
    ]:
        iid = f"calc__calc-{name}"
        rows.append({**task_row(task), "instance_id": iid})
        preds.append({"instance_id": iid, "model_name_or_path": "tiny-model", "model_patch": patch})
    tasks_file = write_jsonl(tmp_path / "grade_cmd_tasks.jsonl", rows)
    preds_file = write_jsonl(tmp_path / "preds.jsonl", preds)
    out = tmp_path / "report.json"
    argv = [
        "grade",
        "--tasks",
        str(tasks_file),
        "--predictions",
        str(preds_file),
        "--workers",
        "2",
        "--out",
        str(out),
    ]
    assert main([*argv, "--sandbox", "bwrap"]) == 0
    report = json.loads(out.read_text())
    assert report["resolved_ids"] == ["calc__calc-gold"]
    assert report["unresolved_ids"] == ["calc__calc-cheat", "calc__calc-tamper"]
    assert report["tampered_ids"] == report["suspicious_ids"] == ["calc__calc-tamper"]
    assert report["empty_patch_ids"] == ["calc__calc-empty"] and report["error_ids"] == []
    cheat = report["instances"]["calc__calc-cheat"]
    assert cheat["dropped"] == [{"path": "conftest.py", "reason": "conftest.py"}]
    assert report["instances"]["calc__calc-gold"]["FAIL_TO_PASS"]["success"] == task.FAIL_TO_PASS
    assert report["model_name_or_path"] == "tiny-model" and report["submitted_instances"] == 4
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert (tmp_path / "report.logs" / "calc__calc-gold" / "test_output.txt").exists()
    assert "resolved 1/4" in capsys.readouterr().out


@pytest.mark.parametrize(
    "tasks_text, message",
    [(None, "does not exist"), ('{"instance_id": "x"}\n', "tasks.jsonl:1: field 'repo' is missing")],
)
def test_grade_command_names_a_bad_tasks_file(tmp_path, capsys, tasks_text, message):
    tasks = tmp_path / "tasks.jsonl"
    if tasks_text is not None:
        tasks.write_text(tasks_text)
    preds = write_jsonl(tmp_path / "p.jsonl", [{"instance_id": "x", "model_patch": ""}])
    assert main(["grade", "--tasks", str(tasks), "--predictions", str(preds)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
