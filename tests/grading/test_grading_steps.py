"""The steps of one grading through grade_one, fast, in the scripted fake sandbox: SWE-bench's apply chain
falling through, the test files' restore, the canaries and decoys planted in every file with FAIL_TO_PASS
tests, the message each failing step leaves, and grade_many's workers."""

from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from scripted_sandbox import FAIL, PASS, FakeSandbox
from tiny_task import F2P, GOLD_PATCH, P2P, TEST_BASIC, TEST_CLAMP, TEST_PATCH, UNBUILT_REPO, diff
from tiny_task import unbuilt_task as make_task

from swe_megatron.grading import eval_script, grader
from swe_megatron.grading.canaries import MUST_FAIL
from swe_megatron.grading.grader import (
    EMPTY_PATCH,
    ERROR,
    RECORD_MAX_BYTES,
    RESOLVED,
    TEST_FILE_MAX_BYTES,
    UNRESOLVED,
    compose_log,
    grade_many,
    grade_one,
    patch_bytes,
    task_grading,
)
from swe_megatron.grading.swebench_light import import_swebench_grading
from swe_megatron.sandbox.base import ExecResult

pytestmark = pytest.mark.usefixtures("planted_canaries")

WORKDIR = "/testbed"
REFUSED = ExecResult(b"error: patch failed: calc/ops.py:1\n", 1)
OUTPUT = b"x" * 100 + b"y" * 400
"""What a failing step printed: only its last 400 characters reach the reason."""
# A patch touching a file, creating one in a new folder and editing one named without the a/ b/ prefixes.
PATCH = (
    GOLD_PATCH
    + diff(("calc/util/extra.py", None, "X = 1\n"))
    + "--- setup.py\n+++ setup.py\n@@ -1 +1 @@\n-a\n+b\n"
)
TOUCHED = ["calc/ops.py", "calc/util/extra.py", "setup.py"]

# FAIL_TO_PASS tests in three files: the canary file, one that does not exist, one with a method to rename.
OTHER = TEST_BASIC + "\n\nclass TestMore:\n    def test_twice(self):\n        assert add(2, 2) == 4\n"
TWICE = "tests/test_basic.py::TestMore::test_twice"
SPREAD_F2P = [F2P[0], "tests/test_absent.py::test_gone", TWICE]
SPREAD_PASS = {t: "PASSED" for t in SPREAD_F2P + P2P}


def spread_task():
    return replace(make_task(), FAIL_TO_PASS=list(SPREAD_F2P))


def run(tmp_path, task=None, patch=GOLD_PATCH, outcomes=PASS, sandbox=FakeSandbox, files=None, **kw):
    """grade_one of `patch` for `task` (the tiny task) in `sandbox`(outcomes, files=...) fakes; grade_one's and
    the fake's keyword arguments both from kw."""
    limits = {k: kw.pop(k) for k in list(kw) if k.endswith(("_s", "_bytes"))}
    files = {"test_basic.py": OTHER.encode(), **(files or {})}
    FakeSandbox.made = []
    return grade_one(
        task or make_task(),
        patch,
        lambda spec: sandbox(outcomes, files=files, **kw),
        log_dir=tmp_path,
        **limits,
    )


def grade_dir(fake: FakeSandbox) -> str:
    """The grading's folder in the sandbox (absolute), from where the harness wrote its copy of the test patch."""
    (rel,) = [p.rsplit("/", 1)[0] for p in fake.written if p.endswith("/test.diff")]
    return f"{WORKDIR}/{rel}"


def commands(fake: FakeSandbox) -> list[str]:
    return [c.removeprefix(f"cd {WORKDIR} && ") for c, _ in fake.execs]


# --- SWE-bench's apply chain ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("refused", "applied_with"),
    [
        (r"git apply --verbose \S*model", "git apply --verbose --3way"),
        (r"git apply --verbose (--3way )?\S*model", "git apply --verbose --reject"),
        (r"git apply --verbose.*model", "patch --batch --forward --fuzz=5 -p1 -i"),
        (r"(git apply --verbose|patch).*model", "already applied"),  # SWE-bench's reverse check
    ],
)
def test_the_apply_chain_falls_through_to_the_first_command_that_applies(tmp_path, refused, applied_with):
    """Each refused attempt is logged with its output and status and undone (the patch's files reset) before
    the next; the command that worked is reported and the tests run."""
    result = run(tmp_path, patch=PATCH, fail=refused, answer=REFUSED, apply_timeout_s=0.5)
    assert (result.status, result.applied_with) == (RESOLVED, applied_with), result.reason
    fake = FakeSandbox.made[0]
    cmds = eval_script.GIT_APPLY_CMDS
    tried = cmds[: cmds.index(applied_with) + 1] if applied_with in cmds else cmds
    model = f"{grade_dir(fake)}/model.diff"
    reset = eval_script.reset_command(TOUCHED)
    expected = []
    for i, cmd in enumerate(tried):
        expected += [reset] if i else []
        expected.append(eval_script.apply_command(cmd, model))
    if applied_with == "already applied":
        expected.append(eval_script.reverse_check_command(model))
    ran = commands(fake)
    start = ran.index(expected[0])
    assert ran[start : start + len(expected)] == expected
    applied = applied_with in cmds
    refusals = "".join(f"$ {c}\n{REFUSED.output.decode()}exit 1\n" for c in tried[: len(tried) - applied])
    assert (tmp_path / "apply.log").read_text().startswith(refusals + f"$ {applied_with}\nexit 0\n" * applied)
    # every attempt within the patch's one apply budget, never past it
    assert all(0.1 <= t <= 0.5 for c, t in fake.execs if "model.diff" in c), fake.execs


def test_a_patch_no_command_applies_is_unresolved_with_every_attempt_logged(tmp_path):
    result = run(tmp_path, patch=PATCH, fail="model.diff", answer=REFUSED)
    assert (result.status, result.reason, result.applied_with, result.excluded) == (
        UNRESOLVED, "patch did not apply", None, "",
    )  # fmt: skip
    assert (tmp_path / "apply.log").read_text() == "".join(
        f"$ {cmd}\nerror: patch failed: calc/ops.py:1\nexit 1\n" for cmd in eval_script.GIT_APPLY_CMDS
    )
    assert len(FakeSandbox.made) == 1 and not any(
        "bash --noprofile" in c for c, _ in FakeSandbox.made[0].execs
    )


def test_a_patch_that_does_not_apply_within_its_budget_says_so(tmp_path):
    result = run(tmp_path, fail="model.diff", timeout=True, apply_timeout_s=2.5)
    assert (result.status, result.reason, result.excluded) == (
        UNRESOLVED,
        "patch did not apply within 2.5 s",
        "",
    )


# --- restoring the test files ------------------------------------------------------------------------------


def test_the_test_files_go_back_to_the_base_commit_with_the_test_patch_on_top(tmp_path):
    """SWE-bench's restore: the test patch's files that exist at base_commit checked out, the patch applied."""
    task = make_task()
    task = replace(task, test_patch=task.test_patch + diff(("tests/test_basic.py", TEST_BASIC, OTHER)))
    assert run(tmp_path, task=task).status == RESOLVED
    fake = FakeSandbox.made[0]
    restore = eval_script.restore_tests_command(
        task.base_commit, ["tests/test_basic.py"], f"{grade_dir(fake)}/test.diff"
    )
    assert restore in commands(fake)
    (written,) = [v for k, v in fake.written.items() if k.endswith("/test.diff")]
    assert written == task.test_patch.encode()


def test_without_a_test_patch_only_the_test_files_are_restored(tmp_path):
    result = run(tmp_path, task=replace(make_task(), test_patch=""))
    fake = FakeSandbox.made[0]
    assert result.status == RESOLVED and not any(k.endswith("/test.diff") for k in fake.written)
    assert eval_script.restore_tests_command("0" * 40, [], None) in commands(fake)


# --- a failing harness step: what it says, how it is excluded ----------------------------------------------


@pytest.mark.parametrize(
    ("step", "kind", "reason"),
    [
        ("mkdir -m", "harness_step", "the test run could not be set up"),
        ("set -e", "task", "the test patch did not apply (task broken?)"),
        (
            "canaried",
            "harness_step",
            "cannot plant the canary tests in tests/test_clamp.py, tests/test_basic.py",
        ),
    ],
)
def test_a_failing_step_names_itself_and_the_tail_of_its_output(tmp_path, step, kind, reason):
    """Excluded (the control run fails so too, or the step ran before the patch) with the step's last 400
    characters of output; restoring the tests logs its output in apply.log."""
    answer = ExecResult(OUTPUT, 2)
    result = run(
        tmp_path, task=spread_task(), outcomes=SPREAD_PASS, fail=step, answer=answer, fail_control=True
    )
    assert (result.status, result.excluded) == (ERROR, kind)
    assert result.reason == f"infrastructure: {reason}: {'y' * 400}"
    if step == "set -e":
        log = (tmp_path / "apply.log").read_text()
        assert log.endswith(f"$ restore test files and apply test_patch\n{OUTPUT.decode()}exit 2\n")


@pytest.mark.parametrize(
    ("step", "what"), [("mkdir -m", "setting up the test run"), ("canaried", "planting the canary tests")]
)
def test_a_step_that_times_out_names_the_step(tmp_path, step, what):
    result = run(tmp_path, fail=step, timeout=True, fail_control=True, step_timeout_s=30)
    assert (result.status, result.excluded) == (ERROR, "harness_step")
    assert result.reason == f"infrastructure: {what} timed out after 30 s"


@pytest.mark.parametrize(
    ("unreadable", "why"),
    [
        (FileNotFoundError("no such file"), "no such file"),
        (b"\xff", "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
    ],
)
def test_a_canary_file_that_cannot_be_read_is_a_task_failure(tmp_path, unreadable, why):
    """The test patch restored no readable canary file: the task is broken (excluded `task` when the control
    run finds it so too, as docs/security.md says)."""
    result = run(tmp_path, files={"test_clamp.py": unreadable}, fail_control=True)
    assert (result.status, result.excluded) == (ERROR, "task")
    assert (
        result.reason
        == f"infrastructure: cannot read the canary file tests/test_clamp.py (task broken?): {why}"
    )


def test_a_patch_that_leaves_the_canary_file_unreadable_is_scored_not_excluded(tmp_path):
    """Attack on the label above: the patch (a `.gitattributes` encoding filter, say) makes the restored canary
    file unreadable. The control run with an empty patch reads it, so the failure is the patch's: unresolved
    and flagged, never excluded."""

    class Garbling(FakeSandbox):
        def read_file(self, path, max_bytes=None):
            if self.patched and path == F2P[0].split("::")[0]:
                return b"\xff"
            return super().read_file(path, max_bytes)

    result = run(tmp_path, sandbox=Garbling)
    assert (result.status, result.excluded) == (UNRESOLVED, "")
    assert "cannot read the canary file" in result.tampered and "control run" in result.tampered


# --- canaries and decoys in every file with FAIL_TO_PASS tests ---------------------------------------------


def test_every_file_with_fail_to_pass_tests_gets_decoys_and_twins_beside_its_breakable_ones(tmp_path):
    """The FAIL_TO_PASS tests of the other files are renamed too (a class's method where it is defined), a
    must-fail decoy under each old name; a test file that does not exist gets none. Twins go into every file
    holding a FAIL_TO_PASS test a copy can break, copies of that file's tests (test_twice here, beside
    test_clamp_high in the canary file). The run is graded under the new names and reported under the task's."""
    in_other = Counter()
    for i in range(12):
        result = run(tmp_path / str(i), task=spread_task(), outcomes=SPREAD_PASS)
        assert (result.status, result.tampered) == (RESOLVED, ""), result.reason
        assert result.tests_status["FAIL_TO_PASS"] == {"success": SPREAD_F2P, "failure": []}
        planted = FakeSandbox.planted[-1]
        basic = {k: v for k, v in planted.expected.items() if k.startswith("tests/test_basic.py")}
        assert basic.pop(TWICE) == "FAILED"
        for node, want in basic.items():  # twins copying test_basic.py's own tests
            assert want == "PASSED" or planted.copies[node].startswith("tests/test_basic.py::"), node
        in_other[sum(want == "FAILED" for want in basic.values())] += 1
        twins = [
            node
            for node, want in planted.expected.items()
            if want == "FAILED" and node not in planted.renamed
        ]
        assert len(twins) == MUST_FAIL
    assert in_other == {2: 12}, in_other  # one breakable FAIL_TO_PASS test in each file: the twins halved
    planted, fake = FakeSandbox.planted[-1], FakeSandbox.made[-1]
    assert not any(k.startswith("tests/test_absent.py") for k in planted.expected)
    new = planted.renamed[TWICE].rsplit("::", 1)[1]
    texts = {k.rsplit("/", 1)[1]: v.decode() for k, v in fake.written.items() if "/canaried-" in k}
    assert texts["canaried-0"] == planted.text and set(texts) == {"canaried-0", "canaried-1"}
    assert (
        f"    def {new}(self):" in texts["canaried-1"] and "    def test_twice(self):" in texts["canaried-1"]
    )
    assert fake.reads["tests/test_basic.py"] == TEST_FILE_MAX_BYTES + 1


def test_a_rewrite_of_the_known_failing_names_flips_decoys_in_every_file(tmp_path):
    """A patch that knows which tests failed before the fix and reports those names passed: the decoys under
    them, in the canary file and in the other file, come out passing -- unresolved and tampered."""

    class RewritingKnownNames(FakeSandbox):
        def write_file(self, path, data):
            super().write_file(path, data)
            if path.endswith("/canaried-0"):
                self.outcomes.update(dict.fromkeys(SPREAD_F2P, "PASSED"))

    result = run(tmp_path, task=spread_task(), outcomes=SPREAD_PASS, sandbox=RewritingKnownNames)
    assert result.status == UNRESOLVED and result.tampered == result.reason
    head, _, wrong = result.reason.partition(": ")
    assert head == "the harness's canary tests came out wrong"
    assert sorted(wrong.split("; ")) == sorted(
        f"{source}: {name} PASSED, expected FAILED"
        for source in ("log", "record")
        for name in ("test_clamp_high", "test_twice")
    )


@pytest.mark.parametrize(("size", "decoyed"), [(TEST_FILE_MAX_BYTES, True), (TEST_FILE_MAX_BYTES + 1, False)])
def test_a_test_file_over_the_cap_gets_no_decoys(tmp_path, size, decoyed):
    big = OTHER.encode().rjust(size, b"#")
    result = run(tmp_path, task=spread_task(), outcomes=SPREAD_PASS, files={"test_basic.py": big})
    assert result.status == RESOLVED, result.reason
    assert (TWICE in FakeSandbox.planted[-1].renamed) is decoyed


def test_planting_rewrites_each_file_in_place_keeping_its_time_and_removes_the_harness_copies(tmp_path):
    """The planting step, run for real in a folder standing in for the sandbox's repository."""
    run(tmp_path / "logs", task=spread_task(), outcomes=SPREAD_PASS)
    fake = FakeSandbox.made[0]
    (plant,) = [c for c in commands(fake) if "canaried-" in c]
    repo = tmp_path / "repo"
    originals = {"tests/test_clamp.py": TEST_CLAMP, "tests/test_basic.py": OTHER}
    for rel, text in originals.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
        os.utime(repo / rel, (1_000_000, 1_000_000))
    for rel, data in fake.written.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    harness = repo / grade_dir(fake).removeprefix(f"{WORKDIR}/")
    subprocess.run(["bash", "-c", plant.replace(WORKDIR, str(repo))], cwd=repo, check=True)
    written = {k.rsplit("/", 1)[1]: v for k, v in fake.written.items() if "/canaried-" in k}
    assert (repo / "tests/test_clamp.py").read_bytes() == written["canaried-0"]
    assert (repo / "tests/test_basic.py").read_bytes() == written["canaried-1"]
    assert all(os.stat(repo / rel).st_mtime == 1_000_000 for rel in originals)
    assert not list(harness.glob("canaried-*")) and not (harness / "test.diff").exists()


# --- grade_many --------------------------------------------------------------------------------------------


def test_one_worker_grades_in_the_calling_thread_into_each_job_s_log_dir(tmp_path):
    caller, threads = threading.get_ident(), []

    def factory(spec):
        threads.append(threading.get_ident())
        return FakeSandbox(PASS)

    jobs = [(make_task(), GOLD_PATCH, tmp_path / "a"), (make_task(), GOLD_PATCH, tmp_path / "b")]
    assert [r.status for r in grade_many(jobs, factory)] == [RESOLVED, RESOLVED]
    assert threads == [caller, caller]
    assert (tmp_path / "a" / "result.json").exists() and (tmp_path / "b" / "result.json").exists()
    (small,) = grade_many(jobs[:1], factory, max_patch_bytes=10)  # grade_one's arguments reach it
    assert small.reason == f"the patch has {len(GOLD_PATCH.encode())} bytes, over the 10 graded at most"


def test_workers_grade_that_many_jobs_at_once_and_no_more(tmp_path):
    """Two workers: the first two gradings meet (both run at once); four jobs never have three running."""
    lock, running, peak, first_two = threading.Lock(), [0], [0], threading.Barrier(2, timeout=10)

    class Counted(FakeSandbox):
        def start(self):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
                meet = len(FakeSandbox.made) <= 2
            if meet:
                first_two.wait()
            threading.Event().wait(0.05)  # time for a third grading to start, were it allowed to

        def stop(self):
            with lock:
                running[0] -= 1

    FakeSandbox.made = []
    jobs = [(make_task(), GOLD_PATCH, tmp_path / str(i)) for i in range(4)]
    results = grade_many(jobs, lambda spec: Counted(FAIL), workers=2)
    assert [r.status for r in results] == [UNRESOLVED] * 4 and peak[0] == 2
    assert all((tmp_path / str(i) / "result.json").exists() for i in range(4))


# --- grade_one's front door and its files ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"test_cmd": ""}, "task calc__calc-0001 has no extra.test_cmd"),
        (
            {"test_patch": "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n-a\n"},
            "task calc__calc-0001: test_patch does not parse: Hunk is shorter than expected",
        ),
        (
            {"env_dir": "envs/e"},
            "task calc__calc-0001: extra.env_dir 'envs/e' is relative; load tasks with swe_megatron.tasks.load "
            "(it resolves paths against the tasks file's folder)",
        ),
    ],
)
def test_a_task_that_cannot_be_graded_is_a_task_error_without_a_sandbox(tmp_path, extra, why):
    task = make_task(**{k: v for k, v in extra.items() if k != "test_patch"})
    task = replace(task, test_patch=extra.get("test_patch", task.test_patch))
    result = grade_one(task, GOLD_PATCH, _no_sandbox, log_dir=tmp_path)
    assert (result.status, result.excluded, result.reason) == (ERROR, "task", f"task cannot be graded: {why}")


def _no_sandbox(spec):
    raise AssertionError("no sandbox may start here")


def test_what_grading_reads_from_a_task():
    """An image instead of a repository; protected: every file the test patch touches; the test files that
    exist at base_commit (a patch's a/ prefix stripped, or none); the canary file: the first test id's file,
    also for a class's method and a single id."""
    image = task_grading(
        make_task(repo_dir=None, image="swe/calc:1")
    ).spec  # the SIF build-sifs writes for it
    assert (image.repo_dir, image.env_dir, image.image) == ("", None, "swe_calc_1.sif")
    fixture = diff(("tests/fixtures.json", None, "{}\n"))
    prefixless = "--- tests/test_basic.py\n+++ tests/test_basic.py\n@@ -1 +1 @@\n-a\n+b\n"
    tg = task_grading(replace(make_task(), test_patch=TEST_PATCH + fixture + prefixless))
    assert "tests/fixtures.json" in tg.protected and tg.existing_test_files == ["tests/test_basic.py"]
    assert task_grading(replace(make_task(), FAIL_TO_PASS=[TWICE])).canary_file == "tests/test_basic.py"
    assert task_grading(replace(make_task(), PASS_TO_PASS=[])).canary_file == "tests/test_clamp.py"


def test_a_patch_at_the_size_cap_is_graded_and_one_byte_more_is_not(tmp_path):
    size = len(GOLD_PATCH.encode())
    assert run(tmp_path / "at", max_patch_bytes=size).status == RESOLVED
    over = grade_one(make_task(), GOLD_PATCH, _no_sandbox, log_dir=tmp_path / "o", max_patch_bytes=size - 1)
    assert (over.status, over.reason) == (
        UNRESOLVED,
        f"the patch has {size} bytes, over the {size - 1} graded at most",
    )


def test_the_logs_keep_the_patch_as_given_and_as_sanitised(tmp_path):
    """patch.diff (SWE-bench's name) is the model's patch; sanitized.patch what was applied, without the edit of
    a protected test file, which the result lists as dropped (with every outcome, applied or not)."""
    protected = diff(("calc/data.txt", "1\n", "2\n"))  # a test file of the task's (extra.test_files)
    patch = GOLD_PATCH + protected + "+\ud800\n"  # a lone surrogate: written replaced, never a crash
    task = make_task(test_files=["calc/data.txt"])
    result = run(tmp_path / "ok", task=task, patch=patch)
    assert result.status == RESOLVED and [d.path for d in result.dropped] == ["calc/data.txt"]
    assert (tmp_path / "ok" / "patch.diff").read_text() == patch.replace("\ud800", "?")
    assert "calc/data.txt" not in (tmp_path / "ok" / "sanitized.patch").read_text()
    assert "calc/ops.py" in (tmp_path / "ok" / "sanitized.patch").read_text()
    refused = run(tmp_path / "no", task=task, patch=patch, fail="model.diff", answer=REFUSED)
    assert refused.status == UNRESOLVED and [d.path for d in refused.dropped] == ["calc/data.txt"]
    assert set(refused.timings) == {"start", "stop"}
    failed = run(
        tmp_path / "f", task=task, patch=patch, fail="PYTEST_PLUGINS"
    )  # the control run does not fail: scored
    assert (
        failed.status == UNRESOLVED and failed.dropped and set(failed.timings) == {"start", "apply", "stop"}
    )
    assert (tmp_path / "f" / "control" / "eval.sh").exists()  # the control run's files, beside the run's
    excluded = run(tmp_path / "e", task=task, patch=patch, fail="PYTEST_PLUGINS", fail_control=True)
    assert excluded.status == ERROR and excluded.dropped
    empty = grade_one(task, protected, _no_sandbox, log_dir=tmp_path / "empty")
    assert empty.status == EMPTY_PATCH and [d.path for d in empty.dropped] == ["calc/data.txt"]


def test_no_patch_is_logged_as_an_empty_one(tmp_path):
    result = grade_one(make_task(), None, _no_sandbox, log_dir=tmp_path)
    assert (result.status, (tmp_path / "patch.diff").read_text()) == (EMPTY_PATCH, "")


def test_the_default_limits_and_where_the_logs_go_without_a_log_dir(tmp_path):
    """Without log_dir a fresh swe-grade-* temporary folder; a nested log_dir is created; the sandbox is made
    from the task's spec; by default the tests get 900 s (plus the kill delay and a step), each harness step
    120 s, and the patch 60 s to apply."""
    specs = []

    def factory(spec):
        specs.append(spec)
        return FakeSandbox(PASS)

    result = grade_one(make_task(), GOLD_PATCH, factory)
    logs = Path(result.log_path).parent
    assert (
        result.status == RESOLVED and logs.name.startswith("swe-grade-") and (logs / "result.json").exists()
    )
    assert specs[0].repo_dir == UNBUILT_REPO and 0 < result.duration_s < 60
    assert all(t < 1 for t in result.timings.values())
    nested = tmp_path / "a" / "b"
    FakeSandbox.made = []
    assert grade_one(make_task(), GOLD_PATCH, lambda spec: FakeSandbox(PASS), log_dir=nested).resolved
    asked = FakeSandbox.made[0].execs
    assert [t for c, t in asked if c.startswith("bash --noprofile")] == [900 + eval_script.KILL_AFTER_S + 120]
    assert {t for c, t in asked if "model.diff" not in c and not c.startswith("bash")} == {120}
    late = run(tmp_path / "late", fail="model.diff", timeout=True)
    assert late.reason == "patch did not apply within 60 s"


def test_the_harness_files_are_staged_before_the_patch(tmp_path):
    """eval.sh (kept in the logs) is what runs, with the task's command in the workdir, pytest's summary and the
    record plugin; the plugin goes to the grade folder and the repository root, the token names the record the
    host reads back; the write-only record folder is made by a harness step."""
    task = make_task()
    run(tmp_path, task=task, test_timeout_s=50)
    fake = FakeSandbox.made[0]
    d = grade_dir(fake)
    assert d.startswith(f"{WORKDIR}/{grader.GRADE_DIR}/")  # under .git: no path of the repository's
    script = eval_script.test_script(task.extra["test_cmd"], WORKDIR, d, 50, pytest_summary=True, record=True)
    assert (tmp_path / "eval.sh").read_text() == script
    assert f"bash --noprofile --norc -c {shlex.quote(script)}" in commands(fake)
    assert eval_script.setup_command(d, True) in commands(fake)
    plugin = (Path(grader.__file__).parent / "pytest_record.py").read_bytes()
    rel = d.removeprefix(f"{WORKDIR}/")
    module = f"{eval_script.PLUGIN_MODULE}.py"
    assert fake.written[f"{rel}/plugin/{module}"] == fake.written[module] == plugin
    (record,) = [p for p in fake.reads if "/out/" in p]
    assert fake.written[f"{rel}/token"] == f"{WORKDIR}/{record}".encode()
    assert fake.reads[record] == RECORD_MAX_BYTES + 1


def test_a_run_without_a_harness_record_reads_none_back(tmp_path):
    result = run(tmp_path, task=make_task(harness_record=False))
    assert result.status == RESOLVED and not (tmp_path / "record.json").exists()
    assert not any("/out/" in p for p in FakeSandbox.made[0].reads)
    script = (tmp_path / "eval.sh").read_text()
    assert "PYTEST_PLUGINS" not in script and "-rA" in script


def test_a_sandbox_that_will_not_stop_leaves_a_note_and_the_outcome_stands(tmp_path):
    class Stuck(FakeSandbox):
        def stop(self):
            raise RuntimeError("still running")

    assert run(tmp_path, sandbox=Stuck).status == RESOLVED
    assert (tmp_path / "stop_error.txt").read_text() == "RuntimeError: still running\n"


# --- what the run left behind ------------------------------------------------------------------------------


def test_an_eval_script_held_past_its_timeout_says_so(tmp_path):
    result = run(tmp_path, outcomes=FAIL, fail="bash --noprofile", timeout=True)
    assert (result.status, result.excluded) == (UNRESOLVED, "")
    assert result.reason == (
        "the eval script was held past its test timeout (its `timeout` or shell stopped or traced)"
    )


@pytest.mark.parametrize(("cap", "cut"), [(40, False), (39, True)])
def test_output_is_cut_only_past_the_cap(tmp_path, cap, cut):
    run(tmp_path, outcomes=FAIL, files={"test_output.txt": b"x" * 40}, output_cap_bytes=cap)
    log = (tmp_path / "test_output.txt").read_text()
    assert ("[harness: the test output was cut" in log) is cut


def test_a_run_that_printed_nothing_has_no_test_results(tmp_path):
    result = run(tmp_path, files={"test_output.txt": FileNotFoundError("test_output.txt")})
    assert (result.status, result.reason) == (UNRESOLVED, "no test results in the log")
    _, _, c = import_swebench_grading()
    log = (tmp_path / "test_output.txt").read_text()
    assert log.startswith(f"{c.START_TEST_OUTPUT}\n{c.END_TEST_OUTPUT}\n")


def test_no_test_results_pass_on_swebench_s_hint(tmp_path):
    output = b"E   ModuleNotFoundError: No module named 'calc'\n"
    result = run(tmp_path, files={"test_output.txt": output})
    assert result.reason == "no test results in the log (swebench's hint: missing_module)"


def test_a_run_without_its_record_is_not_trusted(tmp_path):
    class NoRecord(FakeSandbox):
        def read_file(self, path, max_bytes=None):
            if "/out/" in path:
                raise FileNotFoundError(path)
            return super().read_file(path, max_bytes)

    result = run(tmp_path, sandbox=NoRecord)
    assert result.status == UNRESOLVED
    assert result.reason == (
        "the test process ended before pytest finished (no harness record); printed results not trusted"
    )


class RecordDisagreeing(FakeSandbox):
    """The log prints every test passed; the record has `changes` (task id -> outcome, None: missing)."""

    changes: dict[str, str | None] = {}

    def read_file(self, path, max_bytes=None):
        if "/out/" not in path:
            return super().read_file(path, max_bytes)
        planted, tests = FakeSandbox.planted[-1], dict(self.outcomes)
        for test, outcome in self.changes.items():
            tests.pop(planted.task_id(test))
            tests.update({planted.task_id(test): outcome} if outcome else {})
        return json.dumps({"finished": True, "exitstatus": 1, "tests": tests}).encode()


def test_the_record_s_failures_are_named_under_the_task_s_ids(tmp_path):
    RecordDisagreeing.changes = {F2P[0]: "FAILED"}
    result = run(tmp_path, sandbox=RecordDisagreeing)
    assert (result.status, result.tampered) == (UNRESOLVED, "")
    assert (
        result.reason
        == f"the harness record disagrees with the printed results: FAIL_TO_PASS failing: {F2P[0]}"
    )


def test_the_record_is_judged_by_the_task_s_eval_type(tmp_path):
    """fail_only: a PASS_TO_PASS test missing from the record is not a failure."""
    RecordDisagreeing.changes = {P2P[0]: None}
    assert run(tmp_path / "pf", sandbox=RecordDisagreeing).status == UNRESOLVED
    fail_only = run(tmp_path / "fo", task=make_task(eval_type="fail_only"), sandbox=RecordDisagreeing)
    assert fail_only.resolved, fail_only.reason


# --- pure helpers --------------------------------------------------------------------------------------------


def test_the_composed_log_holds_the_output_between_the_harness_s_markers():
    _, _, c = import_swebench_grading()
    start, end, code = c.START_TEST_OUTPUT, c.END_TEST_OUTPUT, c.TEST_EXIT_CODE
    assert compose_log("a >>>>> b", 3, False, None) == f"{start}\na >>>> > b\n{end}\n{code}: 3\n"
    assert compose_log("a\n", 0, False, None) == f"{start}\na\n{end}\n{code}: 0\n"
    assert compose_log("", None, True, None) == (
        f"{start}\n{end}\n[harness: the test command's exit status was not recorded]\n{c.TESTS_TIMEOUT}\n"
    )


def test_patch_bytes_gives_back_escaped_bytes_and_keeps_other_surrogates():
    assert patch_bytes("caf\udce9\n") == b"caf\xe9\n"
    odd = "a\udc80\udcff\udc7f\udd00\ud800"
    assert patch_bytes(odd) == b"a\x80\xff\xed\xb1\xbf\xed\xb4\x80\xed\xa0\x80"


@pytest.mark.parametrize("test_patch", [TEST_PATCH, TEST_PATCH.removesuffix("\n")])
def test_the_test_patch_is_staged_ending_in_a_newline(tmp_path, test_patch):
    run(tmp_path, task=replace(make_task(), test_patch=test_patch))
    (written,) = [v for k, v in FakeSandbox.made[0].written.items() if k.endswith("/test.diff")]
    assert written == TEST_PATCH.encode()


def test_a_parametrised_fail_to_pass_test_takes_its_pass_to_pass_cases_along(tmp_path):
    """Renaming a parametrised FAIL_TO_PASS test renames the function, so its PASS_TO_PASS cases run under the
    new name too and are graded there (reported under the task's ids)."""
    source = (
        "import pytest\nfrom calc import clamp\n\n\n@pytest.mark.parametrize('x', [1, 2])\n"
        "def test_clamp_high(x):\n    assert clamp(15, 0, 10) == 10\n"
    )
    f2p, p2p = f"{F2P[0]}[1]", [f"{F2P[0]}[2]", *P2P]
    task = replace(make_task(), FAIL_TO_PASS=[f2p], PASS_TO_PASS=p2p)
    outcomes = dict.fromkeys([f2p, *p2p], "PASSED")
    result = run(tmp_path, task=task, outcomes=outcomes, files={"test_clamp.py": source.encode()})
    assert (result.status, result.tampered) == (RESOLVED, ""), result.reason
    assert result.tests_status["PASS_TO_PASS"]["success"] == p2p


def test_a_task_with_only_pass_to_pass_tests_gets_its_canaries(tmp_path):
    task = replace(make_task(), FAIL_TO_PASS=[], PASS_TO_PASS=[*P2P[2:], *P2P[:2]])
    result = run(tmp_path, task=task, outcomes=dict.fromkeys(P2P, "PASSED"))
    assert (result.status, result.tampered) == (RESOLVED, ""), result.reason
    assert FakeSandbox.planted[-1].expected and not FakeSandbox.planted[-1].renamed


@pytest.mark.parametrize(("took", "timed_out"), [(95.0, True), (94.9, False)])
def test_a_timeout_status_counts_only_from_95_percent_of_the_test_timeout(
    tmp_path, monkeypatch, took, timed_out
):
    """`timeout`'s exit status 124 is a timeout when the tests took at least 95% of test_timeout_s (a test's
    own exit 124 earlier is a failure); a clock the test command advances stands in for the wall clock."""
    now = [1000.0]
    monkeypatch.setattr(grader, "time", SimpleNamespace(monotonic=lambda: now[0]))

    class Slow(FakeSandbox):
        def exec(self, command, timeout_s=None):
            now[0] += took if command.startswith("bash --noprofile") else 0
            return super().exec(command, timeout_s)

    result = run(tmp_path, outcomes=FAIL, sandbox=Slow, files={"exit_code": b"124\n"}, test_timeout_s=100)
    assert result.timings["tests"] == took
    assert (result.reason == "tests ran past the 100 s test timeout") is timed_out, result.reason


def test_twins_are_drawn_over_every_files_breakable_fail_to_pass_tests_alike():
    """_twin_files: each must-fail twin goes beside a FAIL_TO_PASS test a copy can break, over all files alike
    (one per such test before any gets a second); the must-pass one to a file drawn the same way; where no file
    has one, all of them in the canary file."""
    one = "def test_{}():\n    assert f() == 1\n"
    loop = "def test_c():\n    for x in y:\n        assert x == 1\n"
    sources = {"a.py": one.format("a"), "b.py": "".join(one.format(n) for n in "xyz"), "c.py": loop}
    f2p = {"a.py": ["a.py::test_a"], "b.py": [f"b.py::test_{n}" for n in "xyz"], "c.py": ["c.py::test_c"]}
    passing = Counter()
    for seed in range(300):
        must_fail, must_pass = grader._twin_files(sources, f2p, "c.py", random.Random(seed))
        assert must_fail == {"a.py": 1, "b.py": 3}
        assert sum(must_pass.values()) == 1 and set(must_pass) <= {"a.py", "b.py"}
        passing.update(must_pass)
    assert 0.65 < passing["b.py"] / 300 < 0.85  # 3 of the 4 breakable tests are b.py's
    f2p["b.py"] = f2p["b.py"][:2]  # three such tests for four twins: one file gets a second
    extra = Counter()
    for seed in range(300):
        must_fail, _ = grader._twin_files(sources, f2p, "c.py", random.Random(seed))
        assert sum(must_fail.values()) == MUST_FAIL and must_fail["a.py"] >= 1 and must_fail["b.py"] >= 2
        extra[must_fail["a.py"] == 2] += 1
    assert 0.2 < extra[True] / 300 < 0.47  # a.py's test is 1 of the 3
    alone = grader._twin_files({"c.py": loop}, {"c.py": ["c.py::test_c"]}, "c.py", random.Random(0))
    assert alone == ({"c.py": MUST_FAIL}, {"c.py": 1})
