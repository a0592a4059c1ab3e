"""Grading real pytest runs in bwrap sandboxes: gold resolves, empty does not, cheating patches do not.

Each attack is also run with its defence switched off (the sanitiser bypassed, or the harness record
not required) to show that the attack is real and that this defence is what stops it.
"""

from __future__ import annotations

import dataclasses

import pytest
from attacks import ATTACKS, FIX
from tiny_task import F2P, OPS, TEST_BASIC, diff

from swe_megatron.grading import grader
from swe_megatron.grading.grader import ERROR, RESOLVED, UNRESOLVED, grade_one
from swe_megatron.grading.sanitize import SanitizedPatch
from swe_megatron.sandbox.base import ExecResult, SandboxError

pytestmark = pytest.mark.sandbox


def grade(task, patch, factory, tmp_path, **kw):
    return grade_one(task, patch, factory, log_dir=tmp_path / "log", **kw)


def test_gold_patch_resolves(tiny, sandbox_factory, tmp_path):
    task = tiny
    result = grade(task, task.patch, sandbox_factory, tmp_path)
    assert result.status == RESOLVED, result.reason
    assert result.reward == 1.0 and result.applied_with == "git apply --verbose"
    assert result.tests_status["FAIL_TO_PASS"]["success"] == F2P
    assert ">>>>> Start Test Output" in (tmp_path / "log" / "test_output.txt").read_text()


def test_record_survives_a_test_command_that_sets_its_own_pythonpath(tiny, sandbox_factory, tmp_path):
    """The factory's src-layout tasks run `PYTHONPATH=src python -m pytest ...`."""
    task = tiny
    own_path = dataclasses.replace(
        task, extra={**task.extra, "test_cmd": "PYTHONPATH=calc " + task.extra["test_cmd"]}
    )
    result = grade(own_path, task.patch, sandbox_factory, tmp_path)
    assert result.status == RESOLVED, result.reason
    assert (tmp_path / "log" / "record.json").exists()


def test_failures_print_one_line_tracebacks_unless_the_test_command_asks_otherwise(
    tiny, sandbox_factory, tmp_path
):
    """Every grading has must-fail canaries: their long tracebacks were a tenth of a grading's time. The
    summary keeps each failure's message; a test command's own --tb comes after the harness's and wins."""
    ran = grade(tiny, "", sandbox_factory, tmp_path, skip_empty=False)
    log = (tmp_path / "log" / "test_output.txt").read_text()
    assert ran.status == UNRESOLVED and "FAILED tests/" in log
    assert "def test_" not in log and "_____ " not in log  # no source listings, no per-failure sections

    long_tb = dataclasses.replace(
        tiny, extra={**tiny.extra, "test_cmd": tiny.extra["test_cmd"] + " --tb=long"}
    )
    ran = grade(long_tb, "", sandbox_factory, tmp_path, skip_empty=False)
    log = (tmp_path / "log" / "test_output.txt").read_text()
    assert ran.status == UNRESOLVED and "def test_" in log


def test_empty_patch_does_not_resolve(tiny, sandbox_factory, tmp_path):
    task = tiny
    skipped = grade(task, "", sandbox_factory, tmp_path)
    assert skipped.status == "empty_patch" and skipped.reward == 0.0
    ran = grade(task, "", sandbox_factory, tmp_path, skip_empty=False)
    assert ran.status == UNRESOLVED and ran.tests_status["FAIL_TO_PASS"]["failure"] == F2P


def test_patch_that_does_not_apply_is_unresolved(tiny, sandbox_factory, tmp_path):
    task = tiny
    bad = FIX.replace("-        return lo", "-        return low")  # a removed line no fuzz can match
    result = grade(task, bad, sandbox_factory, tmp_path)
    assert result.status == UNRESOLVED and result.reason == "patch did not apply" and result.reward == 0.0


def test_fuzzy_patch_applies_with_a_later_command(tiny, sandbox_factory, tmp_path):
    """Context off by a line: git apply refuses, `patch --fuzz` (SWE-bench's last command) takes it."""
    task = tiny
    fuzzy = FIX.replace("     if x < lo:\n", "     if x < lo:  # moved\n")
    result = grade(task, fuzzy, sandbox_factory, tmp_path)
    assert result.status == RESOLVED, result.reason
    assert result.applied_with.startswith("patch ")


@pytest.mark.parametrize("name", list(ATTACKS))
def test_cheating_patch_does_not_resolve(name, tiny, sandbox_factory, tmp_path, monkeypatch):
    task = tiny
    patch, defence, undefended = ATTACKS[name]
    result = grade(task, patch, sandbox_factory, tmp_path / "defended")
    assert result.status == UNRESOLVED, (result.status, result.reason)
    assert result.reward == 0.0
    if defence == "sanitiser":
        assert result.dropped, "the sanitiser should have dropped the cheat"
        monkeypatch.setattr(grader, "sanitize_patch", lambda p, protected=(): SanitizedPatch(patch=p))
        undefended_task = task
    else:
        undefended_task = dataclasses.replace(task, extra={**task.extra, "harness_record": False})
    monkeypatch.setattr(
        grader, "CANARIES", False
    )  # they catch the outcome rewrites too (test_runner_tampering)
    control = grade(undefended_task, patch, sandbox_factory, tmp_path / "undefended")
    assert control.status == undefended, (control.status, control.reason)


def test_hanging_patch_is_unresolved_not_excluded(tiny, sandbox_factory, tmp_path):
    task = tiny
    hang = diff(
        (
            "calc/ops.py",
            OPS,
            OPS.replace(
                "        return lo\n    return x", "        while True:\n            pass\n    return x"
            ),
        )
    )
    result = grade(task, hang, sandbox_factory, tmp_path, test_timeout_s=3)
    assert result.status == UNRESOLVED and "timeout" in result.reason


def test_sandbox_failure_is_an_error_not_a_zero(tiny, tmp_path):
    task = tiny

    def broken(spec):
        raise SandboxError("no sandbox today")

    result = grade(task, task.patch, broken, tmp_path)
    assert result.status == ERROR and result.reward is None and "no sandbox today" in result.error


def _dies_on_eval(sandbox_factory, deaths: list[int]):
    """A sandbox factory whose sandboxes' shells die when the test command runs, for the first deaths[0] of
    them (the others run normally): a labelled fake around the real bwrap sandbox."""

    class DiesOnEval:
        def __init__(self, spec):
            self.inner = sandbox_factory(spec)
            self.dies = deaths[0] > 0
            deaths[0] -= 1

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def exec(self, command, timeout_s=None):
            if self.dies and "PYTEST_PLUGINS" in command:  # the eval script (bash -c)
                raise SandboxError("the sandbox shell died")
            return self.inner.exec(command, timeout_s)

    return DiesOnEval


def test_sandbox_dying_during_the_tests_is_excluded_only_when_a_control_run_dies_too(
    tiny, sandbox_factory, tmp_path
):
    """exclusion.py's rule: after the patch is applied, a sandbox failure is excluded only when the control run
    (empty patch, fresh sandbox) fails the same way; when the control runs, it is the patch's: scored 0."""
    task = tiny
    result = grade(task, task.patch, _dies_on_eval(sandbox_factory, [2]), tmp_path / "both")
    assert result.status == ERROR and result.excluded == "sandbox" and "shell died" in result.reason
    result = grade(task, task.patch, _dies_on_eval(sandbox_factory, [1]), tmp_path / "first")
    assert result.status == UNRESOLVED and result.reward == 0.0 and result.excluded == "", result.reason
    assert "control run" in result.reason and result.tampered


def test_broken_test_patch_is_an_error(tiny, sandbox_factory, tmp_path):
    task = tiny
    broken = dataclasses.replace(
        task, test_patch=diff(("tests/test_basic.py", TEST_BASIC + "# gone\n", TEST_BASIC))
    )
    result = grade(broken, task.patch, sandbox_factory, tmp_path)
    assert result.status == ERROR and "test patch did not apply" in result.reason


def test_long_output_is_cut_to_its_tail(tiny, sandbox_factory, tmp_path):
    task = tiny
    result = grade(task, task.patch, sandbox_factory, tmp_path, output_cap_bytes=700)
    log = (tmp_path / "log" / "test_output.txt").read_text()
    assert "test output was cut to its last 700 bytes" in log and "test session starts" not in log
    assert result.status == RESOLVED, result.reason


@pytest.mark.parametrize(
    ("slow", "status", "excluded"),
    [
        ("mkdir -m 0333", ERROR, "harness_step"),  # setup, before the patch is applied
        ("model.diff", UNRESOLVED, ""),  # applying the patch: its own time (sandbox.grade_apply_timeout_s)
        ("test.diff", ERROR, "harness_step"),  # restoring the tests: the control run times out too
    ],
)
def test_a_step_timing_out_is_excluded_only_under_the_rule(
    tiny, sandbox_factory, tmp_path, slow, status, excluded
):
    task = tiny

    class SlowStep:  # labelled fake: the real bwrap sandbox, with one kind of step reported as timed out
        def __init__(self, spec):
            self.inner = sandbox_factory(spec)

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def exec(self, command, timeout_s=None):
            if slow in command:
                return ExecResult(output=b"", exit_code=-1, timed_out=True)
            return self.inner.exec(command, timeout_s)

    result = grade(task, task.patch, SlowStep, tmp_path)
    assert (result.status, result.excluded) == (status, excluded), result.reason
    assert "timed out" in result.reason or "did not apply within" in result.reason
