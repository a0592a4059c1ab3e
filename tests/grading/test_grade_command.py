"""`swe-megatron grade`: bad input ends in one clear message; a real run writes SWE-bench's report keys."""

from __future__ import annotations

import dataclasses
import json

import pytest
from attacks import ATTACKS, FIX, RUNNER_ATTACKS
from tiny_task import INIT, diff
from tiny_task import unbuilt_task as make_task

from swe_megatron.cli import main
from swe_megatron.grading.grader import GradeResult
from swe_megatron.grading.report import PredictionsError, build_report, load_predictions


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
        ('{"instance_id": "a", "model_patch": "", "model_name_or_path": ".."}\n', "cannot name a log folder"),
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
    # The cheat (its conftest dropped) leaves the bug in place, and the unfixed clamp returns a constant its broken
    # copies may expect: they pass, but they pass without the patch too, so that is no sign of forging
    # (test_false_tampered.py): only the rewrite is flagged.
    assert report["tampered_ids"] == ["calc__calc-tamper"]
    assert report["suspicious_ids"] == ["calc__calc-tamper"]
    assert report["empty_patch_ids"] == ["calc__calc-empty"] and report["error_ids"] == []
    cheat = report["instances"]["calc__calc-cheat"]
    assert cheat["dropped"] == [{"path": "conftest.py", "reason": "conftest.py"}]
    assert report["instances"]["calc__calc-gold"]["FAIL_TO_PASS"]["success"] == task.FAIL_TO_PASS
    assert report["model_name_or_path"] == "tiny-model" and report["submitted_instances"] == 4
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # SWE-bench's layout: logs/run_evaluation/<run_id>/<model>/<instance_id>/ with its file names
    gold = tmp_path / "logs" / "run_evaluation" / "preds" / "tiny-model" / "calc__calc-gold"
    assert {"test_output.txt", "patch.diff", "eval.sh", "report.json"} <= {p.name for p in gold.iterdir()}
    assert json.loads((gold / "report.json").read_text())["calc__calc-gold"]["resolved"] is True
    assert "resolved 1/4" in capsys.readouterr().out


NOT_OCTAL = "diff --git a/x.py b/x.py\nnew file mode 100999\n--- /dev/null\n+++ b/x.py\n@@ -0,0 +1 @@\n+a\n"


@pytest.mark.sandbox
def test_one_bad_prediction_costs_no_other_its_result(tiny, sandbox_factory, tmp_path, capsys, monkeypatch):
    """A patch header with a mode that is not octal (once a ValueError that ended the whole command) is graded
    like any patch; a harness bug on one patch (injected: the sanitiser crashes on it) is that instance's result,
    scored and listed in harness_fault_ids; the report has every instance and the exit status counts the one."""
    from swe_megatron.grading import grader

    sanitize = grader.sanitize_patch

    def crashes_on_one(patch, protected=()):
        if "CRASH-ME" in patch:
            raise RuntimeError("a harness bug on this patch")
        return sanitize(patch, protected)

    monkeypatch.setattr(grader, "sanitize_patch", crashes_on_one)
    patches = {"gold": tiny.patch, "mode": tiny.patch + NOT_OCTAL, "crash": tiny.patch + "# CRASH-ME\n",
               "gold2": tiny.patch}  # fmt: skip
    rows = [{**task_row(tiny), "instance_id": f"calc__calc-{name}"} for name in patches]
    preds = [{"instance_id": f"calc__calc-{n}", "model_patch": p} for n, p in patches.items()]
    out = tmp_path / "report.json"
    argv = ["grade", "--tasks", str(write_jsonl(tmp_path / "t.jsonl", rows)), "--sandbox", "bwrap"]
    code = main([*argv, "--predictions", str(write_jsonl(tmp_path / "p.jsonl", preds)), "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 101, capsys.readouterr().err  # 100 + the one instance the harness failed on
    assert report["resolved_ids"] == ["calc__calc-gold", "calc__calc-gold2", "calc__calc-mode"]
    assert report["instances"]["calc__calc-mode"]["dropped"] == [
        {"path": "x.py", "reason": "invalid file mode"}
    ]
    crash = report["instances"]["calc__calc-crash"]
    assert report["unresolved_ids"] == report["harness_fault_ids"] == ["calc__calc-crash"]
    assert crash["reward"] == 0.0 and "RuntimeError: a harness bug on this patch" in crash["harness_fault"]
    assert report["error_ids"] == [] and "harness faults 1" in capsys.readouterr().out


def test_the_report_is_written_when_grading_is_interrupted(files, monkeypatch):
    """Ctrl-C during grading: the command ends as interrupted, with the report of what was graded written."""
    from swe_megatron.grading import command

    tasks, tmp = files
    preds = write_jsonl(tmp / "p.jsonl", [{"instance_id": "calc__calc-0001", "model_patch": ""}])

    def interrupted(jobs, *a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "grade_many", interrupted)
    monkeypatch.setattr(command, "check_host", lambda cfg: None)
    assert main(["grade", "--tasks", str(tasks), "--predictions", str(preds)]) == 130
    report = json.loads((tmp / "p.report.json").read_text())
    assert report["incomplete_ids"] == ["calc__calc-0001"] and report["submitted_instances"] == 1


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


def _swebench_run_report_keys() -> set[str]:
    """The keys of the run report SWE-bench's own make_run_report writes (read from the installed source:
    importing it needs docker)."""
    import ast
    import importlib.util
    from pathlib import Path

    src = Path(importlib.util.find_spec("swebench").origin).parent / "harness" / "reporting.py"
    for node in ast.walk(ast.parse(src.read_text())):
        if (
            isinstance(node, ast.Assign)
            and getattr(node.targets[0], "id", "") == "report"
            and isinstance(node.value, ast.Dict)
        ):
            return {k.value for k in node.value.keys}
    raise AssertionError(f"no report = {{...}} in {src}")


def test_report_has_swebench_keys_and_a_model_name_string_per_instance():
    """Every key of SWE-bench 5.0.2's run report is there (same names); predictions of two models keep
    model_name_or_path a string: per instance, and at the top ("" when several, all in model_names)."""
    preds = {
        "a": {"instance_id": "a", "model_name_or_path": "m1", "model_patch": "x"},
        "b": {"instance_id": "b", "model_name_or_path": "org/m2", "model_patch": "y"},
        "c": {"instance_id": "c", "model_name_or_path": "m1", "model_patch": "z"},
    }
    results = [
        GradeResult("a", "resolved"),
        GradeResult("b", "unresolved"),
        GradeResult("c", "error", "sandbox died"),
    ]
    report = build_report(results, ["a", "b", "c", "d"], preds)
    expected = _swebench_run_report_keys()
    assert "schema_version" in expected and expected <= report.keys(), expected - report.keys()
    assert report["model_name_or_path"] == "" and report["model_names"] == ["m1", "org/m2"]
    assert {k: v["model_name_or_path"] for k, v in report["instances"].items()} == {
        "a": "m1",
        "b": "org/m2",
        "c": "m1",
    }
    assert report["infra_failure_ids"] == report["error_ids"] == ["c"] and report["failure_reasons"] == {
        "c": "sandbox died"
    }
    assert report["incomplete_ids"] == ["d"] and report["schema_version"] == 2
    one = build_report(results[:1], ["a"], {"a": preds["a"]})
    assert one["model_name_or_path"] == "m1" and one["model_names"] == ["m1"]
