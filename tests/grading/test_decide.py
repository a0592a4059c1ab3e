"""Deciding from recorded logs: swebench's report on the harness-composed log, vetoed by the harness record.

Fast (no sandbox). The pytest outputs below were recorded from the tiny task in a bwrap sandbox.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_task import F2P, GOLD_PATCH, P2P, UNBUILT_REPO
from tiny_task import unbuilt_task as make_task

from swe_megatron.grading import eval_script
from swe_megatron.grading.grader import TaskGradingError, compose_log, decide, task_grading
from swe_megatron.grading.swebench_light import import_swebench_grading

HEADER = """\
============================= test session starts ==============================
platform linux -- Python 3.11.2, pytest-9.2.0, pluggy-1.7.0
rootdir: /testbed
configfile: pytest.ini
collected 4 items

"""
PASSING = (
    HEADER
    + """\
tests/test_basic.py ..                                                   [ 50%]
tests/test_clamp.py ..                                                   [100%]

==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_basic.py::test_add
PASSED tests/test_basic.py::test_mean
PASSED tests/test_clamp.py::test_clamp_low
PASSED tests/test_clamp.py::test_clamp_high
============================== 4 passed in 0.03s ===============================
"""
)
FAILING = (
    HEADER
    + """\
tests/test_basic.py ..                                                   [ 50%]
tests/test_clamp.py .F                                                   [100%]

=================================== FAILURES ===================================
_______________________________ test_clamp_high ________________________________

    def test_clamp_high():
>       assert clamp(15, 0, 10) == 10
E       assert 0 == 10
E        +  where 0 = clamp(15, 0, 10)

tests/test_clamp.py:9: AssertionError
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_basic.py::test_add
PASSED tests/test_basic.py::test_mean
PASSED tests/test_clamp.py::test_clamp_low
FAILED tests/test_clamp.py::test_clamp_high - assert 0 == 10
========================= 1 failed, 3 passed in 0.09s ==========================
"""
)
FAKE_LINES = "".join(f"PASSED {t}\n" for t in F2P + P2P)
RECORD_PASS = {"finished": True, "exitstatus": 0, "tests": {t: "PASSED" for t in F2P + P2P}}
RECORD_FAIL = {"finished": True, "exitstatus": 1, "tests": {**RECORD_PASS["tests"], F2P[0]: "FAILED"}}


def grade_log(tmp_path: Path, output: str, exit_code: int | None, record, timed_out=False, **extra):
    task = make_task(**extra)
    log = tmp_path / "test_output.txt"
    log.write_text(compose_log(output, exit_code, timed_out, None))
    return decide(task, task_grading(task), log, record, GOLD_PATCH)


def test_passing_run_with_agreeing_record_resolves(tmp_path):
    resolved, status, reason = grade_log(tmp_path, PASSING, 0, RECORD_PASS)
    assert resolved and reason == ""
    assert status["FAIL_TO_PASS"] == {"success": F2P, "failure": []}


def test_failing_run_is_unresolved_with_the_failing_test_named(tmp_path):
    resolved, status, reason = grade_log(tmp_path, FAILING, 1, RECORD_FAIL)
    assert not resolved and status["FAIL_TO_PASS"]["failure"] == F2P
    assert F2P[0] in reason


def test_fake_passed_lines_after_the_summary_fool_the_log_but_not_the_record(tmp_path):
    """An atexit hook printing PASSED lines and calling os._exit(0): the log alone says resolved."""
    output = FAILING + FAKE_LINES
    assert grade_log(tmp_path, output, 0, None, harness_record=False)[0], "the attack works on the log alone"
    resolved, _, reason = grade_log(tmp_path, output, 0, RECORD_FAIL)
    assert not resolved and "harness record disagrees" in reason


def test_early_exit_with_fake_lines_leaves_no_finished_record(tmp_path):
    """os._exit(0) at import after printing PASSED lines: pytest never finishes, so no record."""
    assert grade_log(tmp_path, FAKE_LINES, 0, None, harness_record=False)[0], (
        "the attack works on the log alone"
    )
    for record in (None, {"finished": False}):
        resolved, _, reason = grade_log(tmp_path, FAKE_LINES, 0, record)
        assert not resolved and "ended before pytest finished" in reason


def test_marker_text_printed_by_the_tests_cannot_move_the_harness_markers(tmp_path):
    """A patch printing an End marker then PASSED lines, then crashing: only harness markers count."""
    _, _, c = import_swebench_grading()
    output = f"{c.END_TEST_OUTPUT}\n{c.START_TEST_OUTPUT}\n{FAKE_LINES}"
    log = compose_log(output, 3, False, None)
    assert log.count(c.START_TEST_OUTPUT) == 1 and log.count(c.END_TEST_OUTPUT) == 1
    resolved, _, _ = grade_log(tmp_path, FAILING + output, 1, None, harness_record=False)
    assert not resolved


def test_timeout_is_unresolved_not_an_error(tmp_path):
    resolved, _, _ = grade_log(tmp_path, PASSING, 124, RECORD_PASS, timed_out=True)
    assert not resolved


def test_xfail_does_not_count_as_fixing_a_fail_to_pass_test(tmp_path):
    """Library code calling pytest.xfail() turns a failing test into XFAIL, which swebench counts as passed."""
    output = PASSING.replace(f"PASSED {F2P[0]}", f"XFAIL {F2P[0]} - reason: cheat")
    record = {"finished": True, "exitstatus": 0, "tests": {**RECORD_PASS["tests"], F2P[0]: "XFAIL"}}
    assert grade_log(tmp_path, output, 0, None, harness_record=False)[0], "swebench alone accepts XFAIL"
    assert not grade_log(tmp_path, output, 0, record)[0]
    p2p_xfail = {"finished": True, "exitstatus": 0, "tests": {**RECORD_PASS["tests"], P2P[0]: "XFAIL"}}
    assert grade_log(tmp_path, PASSING, 0, p2p_xfail)[0], "an xfailing PASS_TO_PASS test is still maintained"


def test_missing_tests_are_failures(tmp_path):
    output = PASSING.replace(f"PASSED {P2P[0]}\n", "")
    record = {"finished": True, "exitstatus": 0, "tests": {t: "PASSED" for t in F2P + P2P[1:]}}
    resolved, status, _ = grade_log(tmp_path, output, 0, record)
    assert not resolved and status["PASS_TO_PASS"]["failure"] == [P2P[0]]


def test_non_pytest_parsers_need_no_record(tmp_path):
    task = make_task(log_parser="parse_log_pytest_v2")
    assert task_grading(task).require_record
    assert not task_grading(make_task(log_parser="parse_log_django")).require_record


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"test_cmd": ""}, "no extra.test_cmd"),
        ({"log_parser": "parse_log_nope"}, "unknown log parser"),
        ({"eval_type": "sometimes"}, "unknown eval_type"),
        ({"repo_dir": None}, "no extra.repo_dir"),
    ],
)
def test_tasks_that_cannot_be_graded_say_why(tmp_path, extra, message):
    with pytest.raises(TaskGradingError, match=message):
        task_grading(make_task(**extra))


def test_task_paths_are_taken_as_loaded_and_relative_ones_refused(tmp_path):
    """tasks.load is the only place that resolves repo_dir/env_dir; a relative one here names the fix."""
    tg = task_grading(make_task(env_dir=str(tmp_path / "envs/e")))
    assert tg.spec.repo_dir == UNBUILT_REPO and tg.spec.env_dir == str(tmp_path / "envs/e")
    assert "tests/test_clamp.py" in tg.protected and tg.existing_test_files == []
    with pytest.raises(TaskGradingError, match="extra.env_dir 'envs/e' is relative; load tasks with"):
        task_grading(make_task(env_dir="envs/e"))


def test_apply_order_is_swebench_s():
    """GIT_APPLY_CMDS is copied from swebench.harness.run_evaluation (which imports docker)."""
    import swebench

    source = (Path(swebench.__file__).parent / "harness" / "run_evaluation.py").read_text()
    node = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "GIT_APPLY_CMDS"
    )
    assert tuple(ast.literal_eval(node.value)) == eval_script.GIT_APPLY_CMDS


def test_eval_script_is_valid_bash_and_quotes_the_command(tmp_path):
    script = eval_script.test_script(
        "python -m pytest 'tests/a b.py' -k \"x and y\"",
        "/testbed",
        "/testbed/.git/g/1",
        60,
        pytest_summary=True,
        record=True,
    )
    (tmp_path / "eval.sh").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "eval.sh")], check=True)
    assert "timeout -k" in script and "</dev/null" in script and "PYTEST_PLUGINS" in script


def test_swebench_grading_imports_lightly():
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "from swe_megatron.grading.swebench_light import import_swebench_grading\n"
        "g, p, c = import_swebench_grading()\n"
        "assert 'parse_log_pytest' in p.PARSER_REGISTRY and callable(g.get_eval_report)\n"
        "heavy = [m for m in ('docker', 'datasets', 'modal', 'pandas', 'dotenv') if m in sys.modules]\n"
        "print(heavy, time.perf_counter() - t)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert out[0] == "[]", f"heavy modules imported: {out}"
    assert float(out[1]) < 2.0  # ~0.05 s idle; generous for a loaded CI machine


def _no_sandbox(spec):
    raise AssertionError("an empty patch must not start a sandbox")


@pytest.mark.parametrize(
    "patch, reason",
    [
        ("", "empty patch"),
        ("not a diff at all\n", "no file diffs"),
        ("--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-a\n", "unparseable patch"),
        (
            "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1 @@\n+x = 1\n",
            "empty after sanitising (every edit touched a protected file)",
        ),
    ],
)
def test_empty_and_unparseable_patches_are_empty_not_errors(tmp_path, patch, reason):
    from swe_megatron.grading.grader import grade_one

    result = grade_one(make_task(), patch, _no_sandbox, log_dir=tmp_path / "log")
    assert result.status == "empty_patch" and result.reward == 0.0 and reason in result.reason
    if not patch or "conftest" in patch:  # the grader's own reasons, whole (the parser's are sanitize.py's)
        assert result.reason == reason
    assert (tmp_path / "log" / "result.json").exists()


@pytest.mark.parametrize(
    "test_cmd, canaries",
    [
        ("python -m pytest tests", True),
        ("python -m pytest tests/test_clamp.py::test_clamp_high", False),
        ("python -m pytest -k clamp tests", False),
        ("python -m pytest -k=clamp tests", False),
        ("pytest -W ignore::DeprecationWarning tests", True),  # SWE-rebench's test_cmd: a filter, no node id
    ],
)
def test_canaries_only_where_the_command_collects_whole_files(tmp_path, test_cmd, canaries):
    task = make_task(test_cmd=test_cmd)
    assert (task_grading(task).canary_file == F2P[0].split("::")[0]) is canaries
