"""grading/exclusion.py's rule through grade_one, fast: a labelled fake sandbox (the outer boundary) that answers
every harness step and hands back whatever test output, exit status and harness record a test scripts -- the
things a patch's code can write. Nothing after the patch is applied may become an excluded error unless the
control run (empty patch, fresh sandbox) fails the same way.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted_sandbox import FAIL, PASS, FakeSandbox
from tiny_task import F2P, GOLD_PATCH, P2P
from tiny_task import unbuilt_task as make_task

from swe_megatron.grading import canaries as canary_tests
from swe_megatron.grading.canaries import Canaries
from swe_megatron.grading.eval_script import KILL_AFTER_S
from swe_megatron.grading.exclusion import Phase, deadline_excluded, excludable, needs_control
from swe_megatron.grading.grader import (
    EMPTY_PATCH,
    ERROR,
    RECORD_MAX_BYTES,
    RESOLVED,
    UNRESOLVED,
    Excluded,
    _failures,
    grade_many,
    grade_one,
    parse_record,
)
from swe_megatron.sandbox.base import SandboxServerLost

pytestmark = pytest.mark.usefixtures("planted_canaries")


def grade(tmp_path, outcomes, **fake):
    FakeSandbox.made = []
    return grade_one(make_task(), GOLD_PATCH, lambda spec: FakeSandbox(outcomes, **fake), log_dir=tmp_path)


def test_the_fake_grades_like_a_run(tmp_path):
    """The fake is honest: passing outcomes resolve, a failing F2P does not (checks the harness around it)."""
    assert grade(tmp_path / "p", PASS).status == RESOLVED
    result = grade(tmp_path / "f", FAIL)
    assert (result.status, result.excluded, result.tampered) == (UNRESOLVED, "", "")


@pytest.mark.parametrize("where", ["start", "write"])
def test_a_sandbox_failure_before_the_patch_is_excluded_as_sandbox(tmp_path, where):
    """(GR4) before the patch is applied a SandboxError is excluded, labelled `sandbox` (not harness_step)."""
    result = grade(tmp_path, PASS, fail=where)
    assert (result.status, result.excluded, result.reward) == (ERROR, Excluded.SANDBOX.value, None)
    assert len(FakeSandbox.made) == 1  # no control run is needed before model content


@pytest.mark.parametrize(
    ("fail", "timeout", "kind"),
    [
        ("PYTEST_PLUGINS", False, "sandbox"),  # the sandbox dies while the tests run
        ("test.diff", True, "harness_step"),  # restoring the tests times out
        ("canaried", False, "sandbox"),  # planting the canaries
    ],
)
def test_a_failure_after_the_patch_is_excluded_only_when_the_control_fails_the_same_way(
    tmp_path, fail, timeout, kind
):
    scored = grade(tmp_path / "scored", FAIL, fail=fail, timeout=timeout)
    assert (scored.status, scored.excluded, scored.reward) == (UNRESOLVED, "", 0.0), scored.reason
    assert "control run" in scored.reason and scored.tampered
    assert len(FakeSandbox.made) == 2  # the control run had a fresh sandbox of its own
    both = grade(tmp_path / "both", FAIL, fail=fail, timeout=timeout, fail_control=True)
    assert (both.status, both.excluded, both.reward) == (ERROR, kind, None), both.reason


def test_a_sandbox_server_that_stopped_answering_is_excluded_without_a_control(tmp_path):
    """Rule 3: SandboxServerLost (the server failed its health probe) is outside every sandbox."""
    FakeSandbox.made = []

    class ServerGone(FakeSandbox):
        def exec(self, command, timeout_s=None):
            if "PYTEST_PLUGINS" in command:
                raise SandboxServerLost("sandbox server http://b stopped answering")
            return super().exec(command, timeout_s)

    result = grade_one(make_task(), GOLD_PATCH, lambda spec: ServerGone(PASS), log_dir=tmp_path)
    assert (result.status, result.excluded) == (ERROR, "sandbox") and len(FakeSandbox.made) == 1


NESTED = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize(
    "record",
    [NESTED, b'{"finished": true, "exitstatus": 0, "tests": []}', b"{", b"\xff", b'{"finished": true}'],
)
def test_a_record_that_is_not_the_plugins_is_unresolved_and_flagged_not_excluded(tmp_path, record):
    """Issue 24 attack 2: a record whose `tests` is a list, or 200,000 nested arrays, once crashed the grader's
    record check (excluded harness_bug)."""
    FakeSandbox.made = []

    class Forged(FakeSandbox):
        def read_file(self, path, max_bytes=None):
            return record[-max_bytes:] if "/out/" in path else super().read_file(path, max_bytes)

    result = grade_one(make_task(), GOLD_PATCH, lambda spec: Forged(PASS), log_dir=tmp_path)
    assert (result.status, result.excluded) == (UNRESOLVED, ""), result.reason
    assert "harness record is invalid" in result.tampered


def test_everything_read_back_is_capped(tmp_path):
    """Issue 24 attack 8: the host reads only the tail of what the sandbox wrote (read_file max_bytes)."""
    FakeSandbox.made = []
    grade_one(
        make_task(), GOLD_PATCH, lambda spec: FakeSandbox(PASS), log_dir=tmp_path, output_cap_bytes=1000
    )
    asked = {
        p.rsplit("/", 1)[-1] if "/out/" not in p else "record": n
        for p, n in FakeSandbox.made[0].reads.items()
    }
    assert asked["test_output.txt"] == 1001 and asked["exit_code"] <= 64 and asked["record"] is not None


def test_a_patch_over_the_size_cap_is_unresolved_without_a_sandbox(tmp_path):
    """Issue 24 attack 5: a 1.2 MB patch ground the fuzzy `patch` fallback past the step timeout (excluded)."""
    big = GOLD_PATCH + "".join(f"+{i}\n" for i in range(10))

    def no_sandbox(spec):
        raise AssertionError("a patch over the cap must not start a sandbox")

    result = grade_one(make_task(), big, no_sandbox, log_dir=tmp_path, max_patch_bytes=len(GOLD_PATCH))
    assert (result.status, result.excluded) == (UNRESOLVED, "") and "bytes" in result.reason


def test_check_canaries_names_the_forged_must_fail_canary():
    """(GR1) `forged` comes from the must-fail canary reported passing, not from the must-pass one missing."""
    c = Canaries("t.py", "", {"t.py::test_a": "PASSED", "t.py::test_b": "FAILED"})
    ok, bad = c.expected.items()
    passing_missing = {bad[0]: "FAILED"}
    wrong, forged = canary_tests.check(c, passing_missing, {"tests": passing_missing})
    assert wrong and not forged
    flipped = {ok[0]: "PASSED", bad[0]: "PASSED"}
    wrong, forged = canary_tests.check(c, flipped, {"tests": {ok[0]: "PASSED", bad[0]: "FAILED"}})
    assert len(wrong) == 1 and forged


def test_a_forged_canary_flags_tampered_even_when_the_run_failed(tmp_path):
    """(GR2) a run whose tests failed but whose must-fail canaries came out PASSED was forged: tampered. Only the
    patched run forges (the baseline run without the patch reports them failing, so nothing is excused), and the
    real failing test keeps failing under its name in this run: swebench does not call it resolved."""
    FakeSandbox.made = []

    class Forging(FakeSandbox):
        def read_file(self, path, max_bytes=None):
            if (
                self.patched
            ):  # every must-fail canary (planted by now when outcomes are read) reported passing
                self.outcomes.update({k: "PASSED" for k in self.canary_ids if self.outcomes[k] == "FAILED"})
            return super().read_file(path, max_bytes)

    result = grade_one(make_task(), GOLD_PATCH, lambda spec: Forging(FAIL), log_dir=tmp_path)
    assert "FAILED" in [
        v for k, v in FakeSandbox.made[0].outcomes.items() if k not in FakeSandbox.made[0].canary_ids
    ]
    assert result.status == UNRESOLVED and "canary" in result.tampered, (result.reason, result.tampered)


def test_the_rule():
    assert excludable(Phase.HARNESS, "sandbox") and not needs_control(Phase.HARNESS)
    assert needs_control(Phase.MODEL) and not excludable(Phase.MODEL, "sandbox")
    assert excludable(Phase.MODEL, "sandbox", "sandbox") and not excludable(Phase.MODEL, "sandbox", "task")
    assert deadline_excluded(10, 30) and not deadline_excluded(15, 30)


# Odd records, logs and exit statuses the patch's code could leave: whatever they are, once the patch is
# applied the outcome is scored (resolved or not), never excluded.
_statuses = st.sampled_from(["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS", "", "passed", "\x00"])
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
_records = st.one_of(
    st.binary(max_size=64),
    _json.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(F2P + P2P + ["x::y"]), _statuses).map(
        lambda t: json.dumps({"finished": True, "exitstatus": 0, "tests": t}).encode()
    ),
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
)
_logs = st.one_of(
    st.binary(max_size=200),
    st.lists(st.tuples(_statuses, st.sampled_from(F2P + P2P + [">>>>> Start Test Output"])), max_size=6).map(
        lambda rows: "".join(f"{s} {t}\n" for s, t in rows).encode()
    ),
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(record=_records, log=_logs, exit_code=st.binary(max_size=8))
def test_no_outcome_after_the_patch_is_applied_is_excluded(tmp_path_factory, record, log, exit_code):
    assert parse_record(record)[0] is None or isinstance(parse_record(record)[0]["tests"], dict)
    FakeSandbox.made = []
    files = {"test_output.txt": log, "exit_code": exit_code}

    class Odd(FakeSandbox):
        def read_file(self, path, max_bytes=None):
            return record[-max_bytes:] if "/out/" in path else super().read_file(path, max_bytes)

    result = grade_one(
        make_task(), GOLD_PATCH, lambda spec: Odd(PASS, files=files), log_dir=tmp_path_factory.mktemp("odd")
    )
    assert result.status in (RESOLVED, UNRESOLVED) and result.excluded == "", (result.status, result.reason)


@settings(max_examples=60, deadline=None)
@given(
    patch=st.text(max_size=300)
    | st.builds(lambda p, s: f"--- a/{p}\n+++ b/{p}\n{s}", st.text(max_size=20), st.text(max_size=80))
)
def test_odd_patches_are_never_excluded(tmp_path_factory, patch):
    FakeSandbox.made = []
    result = grade_one(
        make_task(), patch, lambda spec: FakeSandbox(FAIL), log_dir=tmp_path_factory.mktemp("patch")
    )
    assert result.status != ERROR and result.excluded == "", (result.status, result.reason)


def test_the_result_files_say_what_the_result_says(tmp_path):
    """result.json is GradeResult.to_dict (with resolved and reward); report.json, SWE-bench's per-instance
    report, is written for scored patches only: an excluded error is no outcome of the patch."""
    ok = grade(tmp_path / "ok", PASS)
    saved = json.loads((tmp_path / "ok" / "result.json").read_text())
    assert saved["status"] == RESOLVED and saved["resolved"] is True and saved["reward"] == 1.0
    assert (saved["excluded"], saved["tampered"], ok.error) == ("", "", None)
    assert set(ok.timings) == {"start", "apply", "tests", "stop"} and saved["timings"] == ok.timings
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert report == {
        "calc__calc-0001": {
            "patch_is_None": False,
            "patch_exists": True,
            "patch_successfully_applied": True,
            "resolved": True,
            "tests_status": ok.tests_status,
        }
    }
    assert ok.tests_status["FAIL_TO_PASS"]["success"] == list(F2P)
    err = grade(tmp_path / "err", PASS, fail="start")
    saved = json.loads((tmp_path / "err" / "result.json").read_text())
    assert (saved["status"], saved["excluded"], saved["reward"], saved["resolved"]) == (
        ERROR,
        "sandbox",
        None,
        False,
    )
    assert err.error == err.reason == "infrastructure: sandbox: no sandbox today"
    assert not (tmp_path / "err" / "report.json").exists()


def test_grade_many_keeps_job_order_and_reports_each_result(tmp_path):
    """One worker or several: results in job order, on_result called once per grading, kwargs reach grade_one."""
    jobs = [(make_task(), GOLD_PATCH, tmp_path / "a"), (make_task(), "", tmp_path / "b")]
    for workers in (1, 2):
        seen = []
        results = grade_many(
            jobs,
            lambda spec: FakeSandbox(PASS),
            workers=workers,
            on_result=seen.append,
            max_patch_bytes=10**6,
        )
        assert [r.status for r in results] == [RESOLVED, EMPTY_PATCH], workers
        assert sorted(r.status for r in seen) == sorted([RESOLVED, EMPTY_PATCH]) and len(seen) == 2
    small = grade_many(jobs[:1], lambda spec: FakeSandbox(PASS), workers=2, max_patch_bytes=10)
    assert small[0].status == UNRESOLVED and "bytes" in small[0].reason


def test_failing_tests_are_named_in_the_reason():
    """At most five ids per kind, then how many more; no failures named: the generic reason."""
    status = {
        "FAIL_TO_PASS": {"success": [], "failure": [f"t{i}" for i in range(7)]},
        "PASS_TO_PASS": {"success": ["p0"], "failure": ["p1"]},
    }
    assert _failures(status) == "FAIL_TO_PASS failing: t0, t1, t2, t3, t4 (+2 more); PASS_TO_PASS failing: p1"
    assert _failures({"FAIL_TO_PASS": {"failure": [f"t{i}" for i in range(5)]}}) == (
        "FAIL_TO_PASS failing: t0, t1, t2, t3, t4"
    )
    assert _failures({"PASS_TO_PASS": {"failure": ["p1"]}}) == "PASS_TO_PASS failing: p1"
    assert (
        _failures(None)
        == _failures({})
        == _failures({"FAIL_TO_PASS": {"success": ["t0"]}})
        == ("tests did not pass")
    )


def test_parse_record_says_why_a_record_is_invalid():
    good = b'{"finished": true, "exitstatus": 0, "tests": {"t::a": "PASSED"}}'
    assert parse_record(good) == ({"finished": True, "exitstatus": 0, "tests": {"t::a": "PASSED"}}, None)
    assert parse_record(None) == (None, None)
    at_cap = good + b" " * (RECORD_MAX_BYTES - len(good))
    assert parse_record(at_cap)[1] is None and parse_record(at_cap + b" ") == (
        None,
        f"over {RECORD_MAX_BYTES} bytes",
    )
    assert parse_record(b"{") == (None, "not JSON (JSONDecodeError)")
    assert parse_record(b"[]") == (None, "not an object with finished, exitstatus and tests")
    assert parse_record(b'{"finished": true, "exitstatus": 0}') == (
        None,
        "not an object with finished, exitstatus and tests",
    )
    wrong_types = "finished is not true, exitstatus not an integer or tests not an object"
    for bad in (
        b'{"finished": 1, "exitstatus": 0, "tests": {}}',
        b'{"finished": true, "exitstatus": true, "tests": {}}',
        b'{"finished": true, "exitstatus": 0, "tests": []}',
    ):
        assert parse_record(bad) == (None, wrong_types), bad
    assert parse_record(b'{"finished": true, "exitstatus": 0, "tests": {"t::a": "XPASS"}}') == (
        None,
        "a test outcome is not one of ERROR, FAILED, PASSED, SKIPPED, XFAIL",
    )


def test_the_run_s_files_reach_the_logs_and_the_composed_log(tmp_path):
    """record.json is the record as read back; test_output.txt (result.log_path) holds the output between the
    harness's markers, a cut noted, the exit status, and the model patch as written into the sandbox."""
    made = []

    def factory(spec):
        made.append(FakeSandbox(FAIL))
        return made[-1]

    result = grade_one(make_task(), GOLD_PATCH, factory, log_dir=tmp_path, output_cap_bytes=40)
    assert result.log_path == str(tmp_path / "test_output.txt")
    log = (tmp_path / "test_output.txt").read_text()
    assert "[harness: the test output was cut to its last 40 bytes]" in log
    assert ">>>>> Test Exit Code: 1\n" in log and ">>>>> Tests Timed Out" not in log
    assert json.loads((tmp_path / "record.json").read_text())["tests"][F2P[0]] == "FAILED"
    (model_diff,) = [v for k, v in made[0].written.items() if k.endswith("/model.diff")]
    assert model_diff == GOLD_PATCH.encode()
    full = grade(
        tmp_path / "full", FAIL
    )  # the whole output: the failing test under the task's name, not a decoy's
    assert full.reason == f"FAIL_TO_PASS failing: {F2P[0]}" and FakeSandbox.planted[-1].renamed


@pytest.mark.parametrize(
    ("exit_code", "test_timeout_s", "timed_out"),
    [(b"124\n", 0, True), (b"1\n", 0, False), (b"124\n", 900, False)],
)
def test_a_timeout_is_the_timeout_exit_status_past_the_test_timeout(
    tmp_path, exit_code, test_timeout_s, timed_out
):
    result = grade_one(
        make_task(),
        GOLD_PATCH,
        lambda spec: FakeSandbox(FAIL, files={"exit_code": exit_code}),
        log_dir=tmp_path,
        test_timeout_s=test_timeout_s,
    )
    assert result.status == UNRESOLVED
    assert (result.reason == f"tests ran past the {test_timeout_s} s test timeout") is timed_out, (
        result.reason
    )
    assert (">>>>> Tests Timed Out" in (tmp_path / "test_output.txt").read_text()) is timed_out


def test_a_missing_exit_status_is_noted_in_the_log(tmp_path):
    no_exit_code = {"exit_code": FileNotFoundError("exit_code")}
    result = grade_one(
        make_task(), GOLD_PATCH, lambda spec: FakeSandbox(PASS, files=no_exit_code), log_dir=tmp_path
    )
    assert result.excluded == "" and result.status in (RESOLVED, UNRESOLVED)
    assert (
        "[harness: the test command's exit status was not recorded]"
        in (tmp_path / "test_output.txt").read_text()
    )


def test_each_step_runs_under_its_own_time_limit(tmp_path):
    """Harness steps get step_timeout_s, every apply attempt what is left of the apply budget, the tests their
    timeout plus the kill delay and a step."""
    FakeSandbox.made = []
    grade_one(
        make_task(), GOLD_PATCH, lambda spec: FakeSandbox(PASS), log_dir=tmp_path, step_timeout_s=7,
        apply_timeout_s=3, test_timeout_s=50,
    )  # fmt: skip
    asked = FakeSandbox.made[0].execs
    applies = [t for c, t in asked if "model.diff" in c]
    assert applies and all(2 < t <= 3 for t in applies), asked
    tests = [t for c, t in asked if c.startswith("bash --noprofile")]
    assert tests == [50 + KILL_AFTER_S + 7]
    assert {t for c, t in asked if "model.diff" not in c and not c.startswith("bash --noprofile")} == {7}


def test_a_harness_step_that_times_out_names_the_step(tmp_path):
    result = grade(tmp_path, FAIL, fail="test.diff", timeout=True, fail_control=True)
    assert (result.status, result.excluded) == (ERROR, "harness_step")
    assert result.reason == "infrastructure: restoring the test files timed out after 120 s"


def test_a_crash_of_the_grader_is_a_harness_bug_with_its_traceback(tmp_path):
    """Before the patch: excluded as harness_bug, the traceback kept; after it, the control run decides."""

    class Crashing(FakeSandbox):
        def exec(self, command, timeout_s=None):
            if "PYTEST_PLUGINS" in command and (self.patched or self.fail_control):
                raise RuntimeError("boom")
            return super().exec(command, timeout_s)

    FakeSandbox.made = []
    both = grade_one(
        make_task(), GOLD_PATCH, lambda spec: Crashing(PASS, fail_control=True), log_dir=tmp_path / "b"
    )
    assert (both.status, both.excluded) == (ERROR, "harness_bug")
    assert both.reason == "infrastructure: grading crashed: RuntimeError: boom"
    assert "RuntimeError: boom" in (tmp_path / "b" / "harness_error.txt").read_text()
    FakeSandbox.made = []
    once = grade_one(make_task(), GOLD_PATCH, lambda spec: Crashing(PASS), log_dir=tmp_path / "o")
    assert (once.status, once.excluded) == (UNRESOLVED, "") and len(FakeSandbox.made) == 2, once.reason


def test_a_run_claiming_success_with_a_failing_must_pass_canary_is_tampered(tmp_path):
    """resolved, nothing forged, but two must-pass canaries FAILED: unresolved, tampered, both named."""

    class Breaking(FakeSandbox):
        def write_file(self, path, data):
            super().write_file(path, data)
            if path.endswith("/canaried-0"):
                must_pass = [k for k, v in FakeSandbox.planted[-1].expected.items() if v == "PASSED"]
                for k in must_pass[:2]:
                    self.outcomes[k] = "FAILED"

    result = grade_one(make_task(), GOLD_PATCH, lambda spec: Breaking(PASS), log_dir=tmp_path)
    assert result.status == UNRESOLVED
    assert result.tampered == result.reason and result.reason.startswith(
        "the harness's canary tests came out wrong: "
    )
    assert result.reason.count("; ") == 1, result.reason


def test_without_canaries_the_run_is_decided_as_reported(tmp_path):
    """A command that selects test ids plants no canaries: swebench's decision on the log and record stands."""
    task = make_task(test_cmd=f"python -m pytest {F2P[0]}")
    ok = grade_one(task, GOLD_PATCH, lambda spec: FakeSandbox(PASS), log_dir=tmp_path / "ok")
    assert (ok.status, ok.tampered, ok.reason) == (RESOLVED, "", "")
    bad = grade_one(task, GOLD_PATCH, lambda spec: FakeSandbox(FAIL), log_dir=tmp_path / "bad")
    assert (bad.status, bad.tampered, bad.reason) == (UNRESOLVED, "", f"FAIL_TO_PASS failing: {F2P[0]}")


def test_a_patch_that_does_not_apply_has_no_tests_status_in_its_report(tmp_path):
    result = grade(tmp_path, FAIL, fail="model.diff", timeout=True)
    assert result.status == UNRESOLVED and "did not apply" in result.reason
    report = json.loads((tmp_path / "report.json").read_text())["calc__calc-0001"]
    assert report["patch_successfully_applied"] is False and "tests_status" not in report
