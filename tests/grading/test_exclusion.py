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
from tiny_task import F2P, GOLD_PATCH, P2P, TEST_CLAMP
from tiny_task import unbuilt_task as make_task

from swe_megatron.grading import canaries as canary_tests
from swe_megatron.grading.canaries import Canaries
from swe_megatron.grading.exclusion import Phase, deadline_excluded, excludable, needs_control
from swe_megatron.grading.grader import (
    ERROR,
    RESOLVED,
    UNRESOLVED,
    Excluded,
    grade_one,
    parse_record,
)
from swe_megatron.sandbox.base import ExecResult, SandboxError, SandboxServerLost


class FakeSandbox:
    """Test fake of the Sandbox protocol (not isolated, runs nothing): every command succeeds unless `fail`
    names a piece of it (then SandboxError, or a timeout with `timeout=True`); read_file serves the test run's
    files from `outcomes` (test id -> PASSED/FAILED, canaries added by the grader's own names) or `files`."""

    made: list[FakeSandbox] = []
    planted: list[Canaries] = []
    """The canaries the grader drew (canaries.plant is wrapped by the autouse fixture below)."""

    def __init__(self, outcomes, fail=None, timeout=False, files=None, fail_control=False):
        self.outcomes, self.fail, self.timeout, self.files = dict(outcomes), fail, timeout, dict(files or {})
        self.fail_control, self.written, self.patched, self.canary_ids = fail_control, {}, False, set()
        FakeSandbox.made.append(self)

    def start(self):
        if self.fail == "start":
            raise SandboxError("no sandbox today")

    def exec(self, command, timeout_s=None):
        self.patched |= "model.diff" in command
        failing = self.fail and self.fail in command and (self.patched or self.fail_control)
        if failing and self.timeout:
            return ExecResult(b"", -1, timed_out=True)
        if failing:
            raise SandboxError("the sandbox shell died")
        return ExecResult(b"", 0)

    def write_file(self, path, data):
        if self.fail == "write":
            raise SandboxError("the sandbox's disk is gone")
        self.written[path] = data
        if path.endswith("/canaried-0"):  # the canaries the grader drew: report them as an honest run would
            planted = FakeSandbox.planted[-1]
            for node in [k for k in self.outcomes if k.partition("[")[0] in planted.renamed]:
                self.outcomes[planted.task_id(node)] = self.outcomes.pop(node)  # renamed FAIL_TO_PASS tests
            expected = planted.expected
            self.canary_ids |= set(expected)
            for node, want in expected.items():
                self.outcomes.setdefault(node, want)

    def read_file(self, path, max_bytes=None):
        name = path.rsplit("/", 1)[-1]
        if name in self.files:
            data = self.files[name]
        elif path == F2P[0].split("::")[0]:  # the canary file, as the test patch restored it
            data = TEST_CLAMP.encode()
        elif name == "exit_code":
            data = (
                b"0\n"
                if all(v == "PASSED" for k, v in self.outcomes.items() if k not in self.canary_ids)
                else b"1\n"
            )
        elif name == "test_output.txt":
            data = "".join(f"{v} {k}\n" for k, v in self.outcomes.items()).encode()
        elif "/out/" in path:
            data = json.dumps({"finished": True, "exitstatus": 0, "tests": self.outcomes}).encode()
        else:
            raise FileNotFoundError(path)
        return data if max_bytes is None else data[-max_bytes:]

    def stop(self):
        pass


PASS = {t: "PASSED" for t in F2P + P2P}
FAIL = {**PASS, F2P[0]: "FAILED"}


@pytest.fixture(autouse=True)
def _record_planted(monkeypatch):
    FakeSandbox.planted = []
    plant = canary_tests.plant

    def recording(*args, **kwargs):
        FakeSandbox.planted.append(plant(*args, **kwargs))
        return FakeSandbox.planted[-1]

    monkeypatch.setattr(canary_tests, "plant", recording)


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
    asked = {}

    class Watched(FakeSandbox):
        def read_file(self, path, max_bytes=None):
            asked[path.rsplit("/", 1)[-1] if "/out/" not in path else "record"] = max_bytes
            return super().read_file(path, max_bytes)

    FakeSandbox.made = []
    grade_one(make_task(), GOLD_PATCH, lambda spec: Watched(PASS), log_dir=tmp_path, output_cap_bytes=1000)
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
    """(GR2) a run whose tests failed but whose must-fail canary came out PASSED was forged: tampered."""
    FakeSandbox.made = []

    class Flipping(FakeSandbox):
        def write_file(self, path, data):
            super().write_file(path, data)
            if path.endswith("/canaried-0"):
                self.outcomes = {
                    k: "PASSED" if "::test_" in k and k not in FAIL else v for k, v in self.outcomes.items()
                }

    result = grade_one(make_task(), GOLD_PATCH, lambda spec: Flipping(FAIL), log_dir=tmp_path)
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
