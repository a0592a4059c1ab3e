"""Grade one model patch for one task: sanitise, apply, restore tests, run them in a fresh sandbox, decide.

    result = grade_one(task, patch, lambda spec: make_sandbox(spec, cfg.sandbox), log_dir="runs/x/grade/0")
    result.reward  # 1.0 resolved, 0.0 unresolved or empty, None for an infrastructure error

The decision is swebench's own (`get_eval_report` with the task's log parser) on a log whose markers the
harness writes; for pytest tasks the harness's record of the run (pytest_record.py) must agree.

The code under test runs inside the pytest process that prints the log and keeps the record, so it can
rewrite both (docs/security.md). What the patch cannot know is the harness's canaries (canaries.py):
twins of the task's own tests, planted beside them at grading time, named and written like them, a few
that must fail and one that must pass. Any canary reported wrong in the log or the record makes the
run unresolved; when the run otherwise claimed success, or a must-fail canary came out passing, the
result is flagged `tampered` (a rewrite of outcomes that cannot tell the twins from real tests turns a
failing twin into a pass; a forged record or log lacks the twins or gets them wrong). Unfixed code may return the
constant a twin expects, so a flag resting only on must-fail canaries reported passing is checked against the
same canaries run without the patch: those that pass there too are excused from the flag (never from the verdict).

What counts as what (the excluded kinds are the Excluded enum; when one may be used is exclusion.py's rule):
- error (excluded, never a 0): the sandbox failed (SandboxError), a harness step failed or timed out, the
  task cannot be graded (no test command, the test patch does not apply), or a bug in the harness -- and
  either before the patch was applied, or a control run (the same grading with an empty patch, in a fresh
  sandbox) failed the same way. Otherwise the failure is the patch's: unresolved, flagged `tampered`.
- unresolved (reward 0): the patch did not apply (within sandbox.grade_apply_timeout_s), or is larger than
  sandbox.grade_max_patch_bytes; the tests failed; the harness record is missing or invalid (what the sandbox
  hands back is read capped and schema-checked); the test process was killed or ended before pytest
  finished; the printed results disagree with the harness record; a canary came out wrong; the tests ran
  past the test timeout, or the eval script was held past it (its `timeout` or shell stopped or traced by
  the patch). A suite that only hangs because of the patch must not be excluded as
  "infrastructure", or hanging becomes a way to dodge a 0 on hard tasks; the timeout is generous
  (sandbox.grade_timeout_s, minutes against suites of seconds) so load alone does not reach it.
- empty_patch (reward 0): nothing left to apply after sanitising, or the patch did not parse.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from unidiff import PatchSet

from swe_megatron.atomic_write import write_atomic
from swe_megatron.grading import canaries as canary_tests
from swe_megatron.grading import eval_script
from swe_megatron.grading.canaries import Canaries
from swe_megatron.grading.exclusion import Phase, excludable, needs_control
from swe_megatron.grading.sanitize import DroppedFile, sanitize_patch, task_test_paths
from swe_megatron.grading.swebench_light import import_swebench_grading
from swe_megatron.sandbox.base import Sandbox, SandboxError, SandboxServerLost, SandboxSpec
from swe_megatron.tasks.plan import PlanError, plan_of
from swe_megatron.tasks.schema import Task

SandboxFactory = Callable[[SandboxSpec], Sandbox]
"""Makes a new, not yet started sandbox (e.g. `lambda spec: make_sandbox(spec, cfg.sandbox)`)."""

RESOLVED, UNRESOLVED, EMPTY_PATCH, ERROR = "resolved", "unresolved", "empty_patch", "error"
PYTEST_PARSERS = frozenset({"parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2"})
GRADE_DIR = ".git/swe_megatron_grade"
"""Harness files inside the sandbox's repository (git ignores .git; the sanitiser drops edits under it)."""
_PLUGIN_SOURCE = Path(__file__).with_name("pytest_record.py")


class Excluded(str, Enum):
    """The kinds of grading failure that may be excluded (status error, reward None) instead of scored, and
    only under exclusion.py's rule: before the patch was applied, or when a control run with an empty patch
    fails with the same kind. Everything else (a killed, stopped or traced `timeout` or shell, missing or
    forged output, undecodable bytes, a hang) is the patch's outcome: unresolved, reward 0."""

    TASK = "task"
    """The task cannot be graded: no repository or test command, an unknown parser, a test patch that
    does not apply or a canary file missing (after the patch: only when the control run fails so too)."""
    SANDBOX = "sandbox"
    """The sandbox itself failed (SandboxError: it did not start, its server or shell died)."""
    HARNESS_STEP = "harness_step"
    """A harness step (setup, restore, canaries, reading the results) failed or timed out."""
    HARNESS_BUG = "harness_bug"
    """An exception in the grader's own code."""


class GradingInfraError(Exception):
    """A grading step outside the model's control failed: the result is an error, never a 0."""

    def __init__(self, message: str, kind: Excluded = Excluded.HARNESS_STEP):
        super().__init__(message)
        self.kind = kind


class TaskGradingError(ValueError):
    """The task lacks what grading needs (repository, test command, a valid log parser)."""


@dataclass
class GradeResult:
    """The outcome of grading one patch for one task."""

    instance_id: str
    """The task."""
    status: str
    """resolved | unresolved | empty_patch | error."""
    reason: str = ""
    """Why it is not resolved (one line); for errors, the infrastructure failure."""
    tests_status: dict[str, Any] | None = None
    """swebench's FAIL_TO_PASS / PASS_TO_PASS success and failure lists (None when the tests did not run)."""
    dropped: list[DroppedFile] = field(default_factory=list)
    """Edits the sanitiser removed from the patch."""
    suspicious: list[str] = field(default_factory=list)
    """Kept added lines that mention the test runner or os._exit (reported, not acted on)."""
    excluded: str = ""
    """For errors, which Excluded failure it is (empty otherwise)."""
    tampered: str = ""
    """Why the run's own reports are not trusted (a canary test came out wrong); empty when they are."""
    harness_fault: str = ""
    """The harness's own failure (an unexpected exception) while it handled model-controlled content: the patch,
    or what its run left behind. Scored 0 and counted, never excluded (exclusion.py); empty when none."""
    applied_with: str | None = None
    """The apply command that worked."""
    log_path: str | None = None
    """The test log swebench graded (with the harness's markers), when the tests ran."""
    duration_s: float = 0.0
    """Wall-clock seconds of the whole grading."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: start (sandbox), apply (patch and test patch), tests, stop."""

    @property
    def resolved(self) -> bool:
        """All FAIL_TO_PASS and PASS_TO_PASS tests pass."""
        return self.status == RESOLVED

    @property
    def error(self) -> str | None:
        """The infrastructure failure, or None when the grading itself worked."""
        return self.reason if self.status == ERROR else None

    @property
    def reward(self) -> float | None:
        """1.0 resolved, 0.0 unresolved or empty; None for errors (exclude the trajectory: not the model's failure)."""
        return None if self.status == ERROR else float(self.status == RESOLVED)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the grade report's per-instance entry)."""
        d = asdict(self)
        d["resolved"] = self.resolved
        d["reward"] = self.reward
        return d


@dataclass
class TaskGrading:
    """What grading needs from a task, checked and resolved to host paths."""

    spec: SandboxSpec
    """Sandbox to grade in."""
    test_cmd: str
    """Test command run at the workdir."""
    log_parser: str
    """swebench parser name (PARSER_REGISTRY)."""
    eval_type: str
    """swebench EvalType value."""
    require_record: bool
    """pytest run: the harness record must exist and agree with the log."""
    protected: set[str]
    """Paths the model patch may not touch (the task's test files)."""
    existing_test_files: list[str]
    """Test-patch files that exist at base_commit (checked out before the test patch)."""
    canary_file: str | None = None
    """Test file the canaries are planted in (that of the first FAIL_TO_PASS/PASS_TO_PASS pytest id);
    None where the run keeps no record, no test id names a .py file, or the command selects tests (`::`, -k)."""


def task_grading(task: Task) -> TaskGrading:
    """What grading needs from a task: its grading plan (Task.plan, made once when its row was loaded; tasks/plan.py
    reads the row's fields) and the test files its test patch and test ids name."""
    try:
        plan = plan_of(task)
    except PlanError as e:
        raise TaskGradingError(str(e)) from None
    try:
        protected = task_test_paths(
            task.test_patch, [*task.FAIL_TO_PASS, *task.PASS_TO_PASS], plan.test_files
        )
        existing = [
            pf.source_file[2:] if pf.source_file.startswith("a/") else pf.source_file
            for pf in PatchSet(_with_newline(task.test_patch))
            if pf.source_file != "/dev/null"
        ]
    except Exception as e:
        raise TaskGradingError(f"task {task.instance_id}: test_patch does not parse: {e}") from None
    require_record = plan.log_parser in PYTEST_PARSERS and plan.harness_record
    files = [t.split("::", 1)[0] for t in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS] if "::" in t]
    # A command that selects node ids or filters by -k would not collect the canaries (false "tampered"); a
    # warning filter's "::" (SWE-rebench's `-W ignore::DeprecationWarning`) selects nothing.
    selects = re.search(r"\.py::|(^|\s)-k(\s|=|$)", plan.test_cmd) is not None
    return TaskGrading(
        spec=plan.sandbox_spec(),
        test_cmd=plan.command,
        log_parser=plan.log_parser,
        eval_type=plan.eval_type,
        require_record=require_record,
        protected=protected,
        existing_test_files=sorted(set(existing)),
        canary_file=files[0]
        if require_record and not selects and files and files[0].endswith(".py")
        else None,
    )


CANARIES = True
"""Plant the canary tests (tests switch this off only to show what the canaries stop)."""


def grade_one(
    task: Task,
    patch: str | None,
    sandbox_factory: SandboxFactory,
    *,
    log_dir: str | Path | None = None,
    test_timeout_s: float = 900.0,
    step_timeout_s: float = 120.0,
    output_cap_bytes: int = 8 << 20,
    skip_empty: bool = True,
    max_patch_bytes: int = 1 << 20,
    apply_timeout_s: float = 60.0,
) -> GradeResult:
    """Grade `patch` (a unified diff, "" or None for none) against `task` in a new sandbox.

    log_dir: where this grading's files go (a fresh temporary folder when None; give each concurrent
    grading its own); test_timeout_s: limit of the test command (past it: unresolved); step_timeout_s:
    limit of each harness step (past it: a failure, see exclusion.py); output_cap_bytes: test output kept
    (its tail); max_patch_bytes, apply_timeout_s: the patch's size and apply-time caps (past them:
    unresolved); skip_empty: do not start a sandbox for an empty patch (it is empty_patch, reward 0).
    """
    logs = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="swe-grade-"))
    logs.mkdir(parents=True, exist_ok=True)
    done = _Done(task.instance_id, logs, time.monotonic())
    try:
        tg = task_grading(task)
    except TaskGradingError as e:
        return done(ERROR, f"task cannot be graded: {e}", excluded=Excluded.TASK.value)
    limits = _Limits(test_timeout_s, step_timeout_s, output_cap_bytes, apply_timeout_s)
    try:
        return _grade_patch(task, tg, patch, sandbox_factory, limits, done, skip_empty, max_patch_bytes)
    except Exception as e:  # noqa: BLE001 - the harness's own bug; whose outcome it is depends on the patch
        what = f"{type(e).__name__}: {e}"
        _write_text(logs / "harness_error.txt", traceback.format_exc())
        if not (patch or "").strip():  # no model content was handled: provably not the model's doing
            return done(
                ERROR, f"infrastructure: grading crashed: {what}", excluded=Excluded.HARNESS_BUG.value
            )
        why = f"the harness failed on the patch: {what}"
        return done(UNRESOLVED, why, harness_fault=why)


def _grade_patch(
    task: Task,
    tg: TaskGrading,
    patch: str | None,
    sandbox_factory: SandboxFactory,
    limits: _Limits,
    done: _Done,
    skip_empty: bool,
    max_patch_bytes: int,
) -> GradeResult:
    """grade_one from the model's patch on: size cap, sanitiser, then the sandbox run."""
    logs = done.logs
    size = len(patch_bytes(patch or ""))
    if size > max_patch_bytes:  # before the sanitiser: parsing a huge patch would cost the host
        return done(UNRESOLVED, f"the patch has {size} bytes, over the {max_patch_bytes} graded at most")
    clean = sanitize_patch(patch, tg.protected)
    _write_text(logs / "patch.diff", patch or "")  # SWE-bench's name for the model's patch
    _write_text(logs / "sanitized.patch", clean.patch)
    common = {"dropped": clean.dropped, "suspicious": clean.suspicious}
    if clean.is_empty and skip_empty:
        return done(EMPTY_PATCH, _empty_reason(clean), **common)
    return _grade_in_sandbox(task, tg, clean.patch, sandbox_factory, limits, done, common)


@dataclass
class _Done:
    """Ends one grading: its GradeResult, also written to <logs>/result.json."""

    instance_id: str
    logs: Path
    t0: float

    def __call__(self, status: str, reason: str = "", **kw: Any) -> GradeResult:
        """The result with this status and reason (kw: further GradeResult fields), written to the logs."""
        result = GradeResult(self.instance_id, status, reason, duration_s=time.monotonic() - self.t0, **kw)
        _write_text(self.logs / "result.json", json.dumps(result.to_dict(), indent=2, default=str))
        if status in (RESOLVED, UNRESOLVED):  # SWE-bench's instance report: what its make_run_report reads
            _write_text(self.logs / "report.json", json.dumps(swebench_instance_report(result), indent=4))
        return result


def swebench_instance_report(result: GradeResult) -> dict[str, Any]:
    """The per-instance report.json of SWE-bench's harness (grading.get_eval_report's form) for a graded patch."""
    ran = result.tests_status is not None
    return {
        result.instance_id: {
            "patch_is_None": False,
            "patch_exists": True,
            "patch_successfully_applied": ran,
            "resolved": result.resolved,
            **({"tests_status": result.tests_status} if ran else {}),
        }
    }


def _grade_in_sandbox(
    task: Task,
    tg: TaskGrading,
    patch: str,
    sandbox_factory: SandboxFactory,
    limits: _Limits,
    done: _Done,
    common: dict[str, Any],
) -> GradeResult:
    """Apply the sanitised patch and run the tests in a new sandbox; decide. A failure of the grading itself
    is excluded only under exclusion.py's rule (else scored 0 and flagged `tampered`)."""
    sandbox_run = _SandboxRun(task, tg, done.logs, limits)
    try:
        run = sandbox_run.run(sandbox_factory, patch)
        if run.apply_failed:
            return done(UNRESOLVED, run.apply_failed, timings=run.timings, **common)
        resolved, tests_status, reason, tampered = _decide_run(task, tg, run, patch)
        if (
            tampered
            and run.canaries is not None
            and not _decide_run(task, tg, run, patch, run.canaries.ids())[3]
        ):
            # Flagged only for must-fail canaries reported passing (the run claimed no success). One can pass for
            # an honest patch that leaves the bug: the unfixed library may return the constant it expects. Those
            # that pass without the patch too are no sign of forging.
            excused = _passing_without_patch(task, tg, run, sandbox_factory, limits, done.logs / "baseline")
            if excused:
                resolved, tests_status, reason, tampered = _decide_run(task, tg, run, patch, excused)
    except Exception as e:
        kind, what = _failure(e, done.logs)
        outside, control = isinstance(e, SandboxServerLost), None
        if needs_control(sandbox_run.phase) and not outside:
            control = _control_failure(task, tg, sandbox_factory, limits, done.logs / "control")
        if excludable(sandbox_run.phase, kind.value, control, outside):
            return done(ERROR, f"infrastructure: {what}", excluded=kind.value, **common)
        why = f"after the patch was applied: {what} (a control run with an empty patch did not fail so)"
        if kind is Excluded.HARNESS_BUG:
            common["harness_fault"] = why
        return done(UNRESOLVED, why, tampered=why, timings=sandbox_run.result.timings, **common)
    if tampered:
        common["tampered"] = reason
    elif run.record_problem:
        common["tampered"] = f"the harness record is invalid: {run.record_problem}"
    if not resolved and run.held:
        reason = "the eval script was held past its test timeout (its `timeout` or shell stopped or traced)"
    elif not resolved and run.timed_out:
        reason = f"tests ran past the {limits.test_s:.0f} s test timeout"
    return done(
        RESOLVED if resolved else UNRESOLVED,
        reason,
        tests_status=tests_status,
        applied_with=run.applied_with,
        timings=run.timings,
        log_path=str(run.log_path),
        **common,
    )


def _failure(e: Exception, logs: Path) -> tuple[Excluded, str]:
    """The Excluded kind of a failure of the grading itself, and one line saying what it was."""
    if isinstance(e, GradingInfraError):
        return e.kind, str(e)
    if isinstance(e, SandboxError):
        return Excluded.SANDBOX, f"sandbox: {e}"
    _write_text(logs / "harness_error.txt", traceback.format_exc())  # a harness bug
    return Excluded.HARNESS_BUG, f"grading crashed: {type(e).__name__}: {e}"


def _control_failure(
    task: Task, tg: TaskGrading, sandbox_factory: SandboxFactory, limits: _Limits, logs: Path
) -> str | None:
    """The control run: the same grading with an empty patch in a fresh sandbox; the Excluded kind it failed
    with, or None when it did not fail."""
    logs.mkdir(parents=True, exist_ok=True)
    try:
        _decide_run(task, tg, _SandboxRun(task, tg, logs, limits).run(sandbox_factory, ""), "")
    except Exception as e:
        return _failure(e, logs)[0].value
    return None


def _empty_reason(clean: Any) -> str:
    """Why a sanitised patch has nothing to apply."""
    if clean.parse_error:
        return clean.parse_error
    if clean.dropped:
        return "empty after sanitising (every edit touched a protected file)"
    return "empty patch"


def _decide_run(
    task: Task, tg: TaskGrading, run: _Run, patch: str, excused: frozenset[str] = frozenset()
) -> tuple[bool, dict[str, Any] | None, str, bool]:
    """swebench's decision on the run's log and record, overruled by wrong canaries: (resolved, tests_status,
    reason, tampered); tampered when the canaries came out wrong and the run claimed success or was forged
    (a must-fail canary reported passing, unless `excused`: it passes without the patch too)."""
    if run.canaries is None:
        return (*decide(task, tg, run.log_path, run.record, patch), False)
    c = run.canaries  # the renamed FAIL_TO_PASS tests are graded under their names in this run
    graded = replace(
        task, FAIL_TO_PASS=c.task_ids(task.FAIL_TO_PASS), PASS_TO_PASS=c.task_ids(task.PASS_TO_PASS)
    )
    resolved, tests_status, reason = decide(graded, tg, run.log_path, run.record, patch)
    if c.renamed:
        tests_status = _original_ids(tests_status, c)
        reason = c.original_text(reason)
    wrong, forged = canary_tests.check(c, _log_status(task, tg, run.log_path), run.record, excused)
    tampered = bool(wrong) and (resolved or forged)
    if tampered:
        reason = "the harness's canary tests came out wrong: " + "; ".join(wrong)
    return resolved and not wrong, tests_status, reason, tampered


def _passing_without_patch(
    task: Task, tg: TaskGrading, run: _Run, sandbox_factory: SandboxFactory, limits: _Limits, logs: Path
) -> frozenset[str]:
    """The must-fail canaries of `run` that also pass on the unpatched repository: the same canary files run
    with an empty patch in a fresh sandbox (no model content: its outcomes are the library's own). Empty when
    that run fails in any way (the flag then stands)."""
    try:
        logs.mkdir(parents=True, exist_ok=True)
        base = _SandboxRun(task, tg, logs, limits, replant=(run.canaries, run.planted)).run(
            sandbox_factory, ""
        )
        passing = canary_tests.passing_must_fail(
            run.canaries, _log_status(task, tg, base.log_path), base.record
        )
    except Exception:  # noqa: BLE001 - no evidence either way: the patch's run decides alone
        _write_text(logs.parent / "baseline_error.txt", traceback.format_exc())
        return frozenset()
    run.timings["baseline"] = round(sum(base.timings.values()), 4)
    return frozenset(passing)


def _original_ids(tests_status: dict[str, Any] | None, c: Canaries) -> dict[str, Any] | None:
    """swebench's tests_status with the renamed tests under their task names."""
    if tests_status is None:
        return None
    return {
        kind: {outcome: c.original_ids(ids) for outcome, ids in parts.items()}
        for kind, parts in tests_status.items()
    }


def grade_many(
    jobs: list[tuple[Task, str | None, str | Path | None]],
    sandbox_factory: SandboxFactory,
    *,
    workers: int = 1,
    on_result: Callable[[GradeResult], None] | None = None,
    **kwargs: Any,
) -> list[GradeResult]:
    """Grade (task, patch, log_dir) jobs with `workers` concurrent graders; results in job order.

    kwargs go to grade_one; on_result is called (from the calling thread) as each grading finishes. One job's
    failure is that job's result (status error), never the others' loss.
    """
    if workers <= 1:
        results = []
        for task, patch, log_dir in jobs:
            results.append(_grade_job(task, patch, sandbox_factory, log_dir, kwargs))
            if on_result:
                on_result(results[-1])
        return results
    out: list[GradeResult | None] = [None] * len(jobs)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grader") as pool:
        futures = {
            pool.submit(_grade_job, task, patch, sandbox_factory, log_dir, kwargs): i
            for i, (task, patch, log_dir) in enumerate(jobs)
        }
        for fut in as_completed(futures):
            out[futures[fut]] = fut.result()
            if on_result:
                on_result(fut.result())
    return out  # type: ignore[return-value]


def _grade_job(
    task: Task, patch: str | None, sandbox_factory: SandboxFactory, log_dir: str | Path | None, kwargs: dict
) -> GradeResult:
    """grade_one, or an error result where it raised (grade_one scores its own crashes on a patch, so what
    gets here failed outside it: e.g. the host could not write the logs)."""
    try:
        return grade_one(task, patch, sandbox_factory, log_dir=log_dir, **kwargs)
    except Exception as e:  # noqa: BLE001 - one job's failure must not cost the other jobs their results
        what = f"grading crashed: {type(e).__name__}: {e}"
        return GradeResult(
            task.instance_id, ERROR, f"infrastructure: {what}", excluded=Excluded.HARNESS_BUG.value
        )


def _twin_files(
    sources: dict[str, str], f2p: dict[str, list[str]], file: str, rng: Any
) -> tuple[Counter, Counter]:
    """How many must-fail and must-pass twins go in each test file: each must-fail one beside a FAIL_TO_PASS test
    a copy can break (canaries.breakable), drawn over all the files' such tests alike, one after another in a
    shuffled order (so twins sit where the real failing tests do: all in the first such file, they stood out
    by their place in the run); the must-pass one in a file drawn the same way. Where no file has such a test,
    all in `file` (the canary file: twins copied from other tests there)."""
    slots = [f for f, text in sources.items() for _ in range(canary_tests.breakable(f, text, f2p.get(f, [])))]
    if not slots:
        return Counter({file: canary_tests.MUST_FAIL}), Counter({file: canary_tests.MUST_PASS})
    order = rng.sample(slots, len(slots))
    must_fail = Counter(order[i % len(order)] for i in range(canary_tests.MUST_FAIL))
    return must_fail, Counter(rng.choices(slots, k=canary_tests.MUST_PASS))


@dataclass
class _Run:
    apply_failed: str = ""
    """Why the patch did not apply (empty when it did)."""
    applied_with: str | None = None
    log_path: Path | None = None
    record: dict[str, Any] | None = None
    record_problem: str | None = None
    canaries: Canaries | None = None
    planted: dict[str, str] = field(default_factory=dict)
    """Test file -> its text with the canaries, as written over it for this run."""
    timed_out: bool = False
    held: bool = False
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Limits:
    """grade_one's limits: of the test command, of each harness step (seconds), of the output kept (bytes)."""

    test_s: float
    step_s: float
    output_cap_bytes: int
    apply_s: float


@dataclass
class _TestOutput:
    """What the eval script left in the sandbox, read back before it stops (None: file missing)."""

    exit_code: bytes | None = None
    output: bytes = b""
    cut: bool = False
    record: bytes | None = None


class _SandboxRun:
    """One grading in a fresh sandbox: stage the harness files, apply the patch, restore the tests, add the
    canaries, run the tests, and return what the host needs to decide (`run`)."""

    def __init__(
        self,
        task: Task,
        tg: TaskGrading,
        logs: Path,
        limits: _Limits,
        replant: tuple[Canaries, dict[str, str]] | None = None,
    ):
        """replant: the canaries and canaried file texts of an earlier run, planted again instead of new ones."""
        self.task, self.tg, self.logs, self.limits, self.replant = task, tg, logs, limits, replant
        self.workdir = tg.spec.workdir.rstrip("/")
        self.rel = f"{GRADE_DIR}/{secrets.token_hex(8)}"
        self.d = f"{self.workdir}/{self.rel}"
        self.record_name = f"out/{secrets.token_hex(8)}.json"
        self.apply_log: list[str] = []
        self.result = _Run()
        self.sandbox: Sandbox | None = None
        self.phase = Phase.HARNESS
        """exclusion.Phase: MODEL once the patch is being applied."""
        self._clock = time.monotonic()

    def run(self, factory: SandboxFactory, patch: str) -> _Run:
        """Start a sandbox, apply, restore tests, run them, stop it; the outcome (log, record, timings)."""
        self.sandbox = factory(self.tg.spec)
        try:
            self.sandbox.start()
            self._lap("start")
            self._stage_files()
            if patch.strip():
                self.phase = Phase.MODEL  # from here on, what goes wrong may be the patch's doing
                if not self._apply_model_patch(patch):
                    return self.result
            self._restore_tests()
            self._add_canaries()
            # The model's code runs from here on: what it leaves behind is its outcome, not an error.
            self._lap("apply")
            out = self._run_tests()
        finally:
            self._stop()
        self._write_outcome(out)
        return self.result

    def _lap(self, phase: str) -> None:
        now = time.monotonic()
        self.result.timings[phase] = round(now - self._clock, 4)
        self._clock = now

    def _step(self, command: str, what: str, timeout_s: float | None = None):
        timeout_s = self.limits.step_s if timeout_s is None else timeout_s
        res = self.sandbox.exec(f"cd {self.workdir} && {command}", timeout_s=timeout_s)
        if res.timed_out:
            raise GradingInfraError(f"{what} timed out after {timeout_s:.0f} s")
        return res

    def _stage_files(self) -> None:
        tg, rel = self.tg, self.rel
        self.script = eval_script.test_script(
            tg.test_cmd,
            self.workdir,
            self.d,
            self.limits.test_s,
            pytest_summary=tg.log_parser in PYTEST_PARSERS,
            record=tg.require_record,
        )
        _write_text(self.logs / "eval.sh", self.script)
        if self.task.test_patch.strip():
            self.sandbox.write_file(f"{rel}/test.diff", _with_newline(self.task.test_patch).encode())
        if tg.require_record:
            # On PYTHONPATH, and at the repository root for `python -m pytest` runs whose command sets
            # its own PYTHONPATH (the sanitiser keeps patches off this name).
            plugin = _PLUGIN_SOURCE.read_bytes()
            self.sandbox.write_file(f"{rel}/plugin/{eval_script.PLUGIN_MODULE}.py", plugin)
            self.sandbox.write_file(f"{eval_script.PLUGIN_MODULE}.py", plugin)
            self.sandbox.write_file(f"{rel}/token", f"{self.d}/{self.record_name}".encode())
        res = self._step(eval_script.setup_command(self.d, tg.require_record), "setting up the test run")
        if res.exit_code != 0:
            raise GradingInfraError(f"the test run could not be set up: {_text(res.output)[-400:]}")

    def _apply_model_patch(self, patch: str) -> bool:
        """Apply the model's patch; False (and apply.log written) when no method applies it."""
        self.sandbox.write_file(f"{self.rel}/model.diff", patch_bytes(patch))
        deadline = time.monotonic() + self.limits.apply_s

        def step(command: str, what: str):  # every attempt within the patch's one apply budget
            return self._step(command, what, max(0.1, min(self.limits.step_s, deadline - time.monotonic())))

        try:
            applied = _apply_model_patch(step, f"{self.d}/model.diff", _patch_paths(patch), self.apply_log)
            failed = "patch did not apply" if applied is None else ""
        except GradingInfraError:
            applied, failed = None, f"patch did not apply within {self.limits.apply_s:g} s"
        self.result.applied_with, self.result.apply_failed = applied, failed
        if failed:
            _write_text(self.logs / "apply.log", "".join(self.apply_log))
        return not failed

    def _restore_tests(self) -> None:
        has_test_patch = bool(self.task.test_patch.strip())
        command = eval_script.restore_tests_command(
            self.task.base_commit,
            self.tg.existing_test_files,
            f"{self.d}/test.diff" if has_test_patch else None,
        )
        res = self._step(command, "restoring the test files")
        self.apply_log.append(
            f"$ restore test files and apply test_patch\n{_text(res.output)}exit {res.exit_code}\n"
        )
        _write_text(self.logs / "apply.log", "".join(self.apply_log))
        if res.exit_code != 0:
            raise GradingInfraError(
                f"the test patch did not apply (task broken?): {_text(res.output)[-400:]}", Excluded.TASK
            )

    def _add_canaries(self) -> None:
        """Plant the canary twins in the canary file (canaries.py), keeping its modification time. The
        harness's copy and the applied test patch are removed, so the tested code finds no second version
        of the test file to diff against (the lines only the canaried file has are the twins)."""
        if not (CANARIES and self.tg.canary_file):
            return
        if self.replant is not None:
            canaries, texts = self.replant
        else:
            canaries, texts = self._plant()
        self.result.canaries, self.result.planted = canaries, texts
        commands = []  # each file rewritten in place, keeping its modification time; one step for all
        for i, (target, text) in enumerate(texts.items()):
            copy, target = f"{self.d}/canaried-{i}", shlex.quote(target)
            self.sandbox.write_file(f"{self.rel}/canaried-{i}", text.encode("utf-8"))
            commands.append(f"touch -r {target} {copy} && cat {copy} > {target} && touch -r {copy} {target}")
        res = self._step(
            " && ".join([*commands, f"rm -f {self.d}/canaried-* {self.d}/test.diff"]),
            "planting the canary tests",
        )
        if res.exit_code != 0:
            raise GradingInfraError(
                f"cannot plant the canary tests in {', '.join(texts)}: {_text(res.output)[-400:]}"
            )

    def _plant(self) -> tuple[Canaries, dict[str, str]]:
        """New canaries for this grading (canaries.plant): the twins beside the FAIL_TO_PASS tests that can be
        copied and broken, in whichever files hold them (_twin_files), decoys in every file holding
        FAIL_TO_PASS tests; with each file's text."""
        file = self.tg.canary_file
        try:
            source = self.sandbox.read_file(file).decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise GradingInfraError(
                f"cannot read the canary file {file} (task broken?): {e}", Excluded.TASK
            ) from None
        listed = [*self.task.FAIL_TO_PASS, *self.task.PASS_TO_PASS]
        f2p: dict[str, list[str]] = {}  # test file -> its FAIL_TO_PASS ids
        for t in self.task.FAIL_TO_PASS:
            if "::" in t:
                f2p.setdefault(t.split("::", 1)[0], []).append(t)
        sources = {file: source}
        for other in sorted(f2p):  # decoys for the FAIL_TO_PASS tests of every other file
            if other == file:
                continue
            try:
                raw = self.sandbox.read_file(other, max_bytes=TEST_FILE_MAX_BYTES + 1)
                text = raw.decode("utf-8") if len(raw) <= TEST_FILE_MAX_BYTES else None
            except (OSError, UnicodeDecodeError):
                text = None
            if text is not None:  # else not a readable test file of this run (an id that names no file)
                sources[other] = text
        must_fail, must_pass = _twin_files(sources, f2p, file, secrets.SystemRandom())
        canaries, texts = None, {}
        for target, text in sorted(sources.items(), key=lambda item: item[0] != file):
            ids = [t for t in listed if t.startswith(f"{target}::")]
            planted = canary_tests.plant(
                target,
                text,
                ids,
                fail_to_pass=f2p.get(target, []),
                must_fail=must_fail[target],
                must_pass=must_pass[target],
            )
            if canaries is None:
                canaries, texts[target] = planted, planted.text
            elif planted.expected:
                texts[target] = planted.text
                canaries.add(planted)
        return canaries, texts

    def _run_tests(self) -> _TestOutput:
        limits, rel = self.limits, self.rel
        res = self.sandbox.exec(
            f"bash --noprofile --norc -c {shlex.quote(self.script)}",
            timeout_s=limits.test_s + eval_script.KILL_AFTER_S + limits.step_s,
        )
        # Past the test timeout, its kill delay and a step's time, only the model's code holds the script
        # (it stopped or traced `timeout` or the shell; the script itself runs builtins and `timeout`).
        self.result.held = res.timed_out
        self._lap("tests")
        # Everything below was written by the sandbox's user while the patch's code ran: untrusted, capped.
        cap = limits.output_cap_bytes
        output = _read_optional(self.sandbox, f"{rel}/test_output.txt", cap + 1) or b""
        return _TestOutput(
            exit_code=_read_optional(self.sandbox, f"{rel}/exit_code", 64),
            output=output[-cap:],
            cut=len(output) > cap,
            record=_read_optional(self.sandbox, f"{rel}/{self.record_name}", RECORD_MAX_BYTES + 1)
            if self.tg.require_record
            else None,
        )

    def _stop(self) -> None:
        try:
            self.sandbox.stop()
        except Exception as e:  # cleanup trouble does not change what the tests said
            _write_text(self.logs / "stop_error.txt", f"{type(e).__name__}: {e}\n")
        self._lap("stop")

    def _write_outcome(self, out: _TestOutput) -> None:
        run, code = self.result, _parse_int(out.exit_code)
        past_timeout = run.timings["tests"] >= self.limits.test_s * 0.95
        run.timed_out = run.held or (code in eval_script.TIMEOUT_EXIT_CODES and past_timeout)
        if self.tg.require_record:
            run.record, run.record_problem = parse_record(out.record)
        if out.record is not None:
            write_atomic(self.logs / "record.json", out.record)
        run.log_path = self.logs / "test_output.txt"
        cut = self.limits.output_cap_bytes if out.cut else None
        _write_text(run.log_path, compose_log(_text(out.output), code, run.timed_out, cut))


def patch_bytes(patch: str) -> bytes:
    """A patch's bytes: surrogate-escaped bytes (a diff of non-UTF-8 files decoded with surrogateescape, as
    the ACI does) back to themselves, any other lone surrogate in its 3-byte form (surrogatepass). Every
    str has bytes to grade, so text the agent wrote can never make grading an infrastructure error."""
    try:
        return patch.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return b"".join(
            c.encode("utf-8", "surrogateescape" if 0xDC80 <= ord(c) <= 0xDCFF else "surrogatepass")
            for c in patch
        )


def _apply_model_patch(
    step: Callable, patch_path: str, touched: list[str], apply_log: list[str]
) -> str | None:
    """SWE-bench's apply chain, the touched files reset between attempts; the command that worked, or None."""
    for i, cmd in enumerate(eval_script.GIT_APPLY_CMDS):
        if i:
            step(eval_script.reset_command(touched), "resetting after a failed apply")
        res = step(eval_script.apply_command(cmd, patch_path), "applying the patch")
        apply_log.append(f"$ {cmd}\n{_text(res.output)}exit {res.exit_code}\n")
        if res.exit_code == 0:
            return cmd
    # The chain can leave the patch fully applied while each command exited non-zero (SWE-bench's check).
    if step(eval_script.reverse_check_command(patch_path), "checking the patch").exit_code == 0:
        return "already applied"
    return None


def compose_log(test_output: str, exit_code: int | None, timed_out: bool, cut_bytes: int | None) -> str:
    """The log swebench grades: the test output between markers the harness writes, then its exit status
    (cut_bytes: the output was cut to its last cut_bytes bytes).

    Marker-like text in what the tests printed is defused, so only these markers count; the apply
    output is kept out (logged in apply.log) so no file name a patch chooses reaches the parser.
    """
    _, _, c = import_swebench_grading()
    parts = [c.START_TEST_OUTPUT + "\n"]
    if cut_bytes:
        parts.append(f"[harness: the test output was cut to its last {cut_bytes} bytes]\n")
    body = _defuse(test_output)
    parts.append(body if body.endswith("\n") or not body else body + "\n")
    parts.append(c.END_TEST_OUTPUT + "\n")
    if exit_code is None:
        parts.append("[harness: the test command's exit status was not recorded]\n")
    else:
        parts.append(f"{c.TEST_EXIT_CODE}: {exit_code}\n")
    if timed_out:
        parts.append(c.TESTS_TIMEOUT + "\n")
    return "".join(parts)


def decide(
    task: Task, tg: TaskGrading, log_path: str | Path, record: dict[str, Any] | None, model_patch: str
) -> tuple[bool, dict[str, Any] | None, str]:
    """(resolved, swebench tests_status, reason) from the composed log and, for pytest, the harness record."""
    grading, _, _ = import_swebench_grading()
    spec = _test_spec(task, tg)
    prediction = {"instance_id": task.instance_id, "model_name_or_path": "", "model_patch": model_patch or ""}
    report = grading.get_eval_report(spec, prediction, str(log_path), include_tests_status=True)[
        task.instance_id
    ]
    tests_status = report.get("tests_status")
    resolved = bool(report["resolved"])
    if not report["patch_successfully_applied"]:
        reason = "no test results in the log"
        if report.get("infra_failure_reason"):
            reason += f" (swebench's hint: {report['infra_failure_reason']})"
    elif not resolved:
        reason = _failures(tests_status)
    else:
        reason = ""
    if tg.require_record:
        veto = record_veto(task, tg.eval_type, record)
        if veto:
            if resolved:
                reason = veto
            resolved = False
    return resolved, tests_status, reason


def _test_spec(task: Task, tg: TaskGrading):
    # Lazy: swebench is optional, and its harness must first be imported lightly (import_swebench_grading).
    from swebench.types import TestSpec

    return TestSpec(
        instance_id=task.instance_id,
        image="",
        eval_script_list=[],
        repo=task.repo,
        version=task.version,
        FAIL_TO_PASS=list(task.FAIL_TO_PASS),
        PASS_TO_PASS=list(task.PASS_TO_PASS),
        log_parser=tg.log_parser,
        eval_type=tg.eval_type,
    )


def _log_status(task: Task, tg: TaskGrading, log_path: str | Path) -> dict[str, str]:
    """Every test outcome the task's log parser reads from the composed log."""
    grading, _, _ = import_swebench_grading()
    return grading.get_logs_eval(_test_spec(task, tg), str(log_path))[0]


def record_veto(task: Task, eval_type: str, record: dict[str, Any] | None) -> str | None:
    """Why the harness record does not support "resolved" (None when it does).

    The record's outcomes go through swebench's own report with one stricter rule: an expected failure
    (xfail) counts as skipped, so a FAIL_TO_PASS test must really pass (a patch calling pytest.xfail()
    from library code cannot turn failures into passes).
    """
    grading, _, c = import_swebench_grading()
    if not record or not record.get("finished"):
        return (
            "the test process ended before pytest finished (no harness record); printed results not trusted"
        )
    status_map = {k: ("SKIPPED" if v == "XFAIL" else v) for k, v in (record.get("tests") or {}).items()}
    ref = {"FAIL_TO_PASS": list(task.FAIL_TO_PASS), "PASS_TO_PASS": list(task.PASS_TO_PASS)}
    report = grading.get_eval_tests_report(status_map, ref, eval_type=c.EvalType(eval_type))
    if grading.get_resolution_status(report) != c.ResolvedStatus.FULL.value:
        return "the harness record disagrees with the printed results: " + _failures(report)
    return None


def _failures(tests_status: dict[str, Any] | None, limit: int = 5) -> str:
    if not tests_status:
        return "tests did not pass"
    out = []
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        failed = tests_status.get(key, {}).get("failure", [])
        if failed:
            more = f" (+{len(failed) - limit} more)" if len(failed) > limit else ""
            out.append(f"{key} failing: {', '.join(failed[:limit])}{more}")
    return "; ".join(out) or "tests did not pass"


_MARKER = re.compile(r">>>>>")


def _defuse(text: str) -> str:
    return _MARKER.sub(">>>> >", text)


def _patch_paths(patch: str) -> list[str]:
    """Repository paths a (sanitised, git-style) patch touches, prefix stripped."""
    paths = set()
    for pf in PatchSet(_with_newline(patch)):
        for name in (pf.source_file, pf.target_file):
            if name and name != "/dev/null":
                paths.add(name.split("/", 1)[1] if "/" in name else name)
    return sorted(paths)


def _read_optional(sandbox: Sandbox, path: str, max_bytes: int) -> bytes | None:
    """The last max_bytes bytes of a file the test run should have left; None when it is missing or was
    tampered with (the model's code ran before this, so that is its outcome). SandboxError propagates (see
    exclusion.py for when it may be excluded)."""
    try:
        return sandbox.read_file(path, max_bytes=max_bytes)
    except SandboxError:
        raise
    except OSError:
        return None


def _parse_int(raw: bytes | None) -> int | None:
    try:
        return int(raw.decode().strip()) if raw is not None else None
    except (ValueError, UnicodeDecodeError):
        return None


RECORD_MAX_BYTES = 32 << 20
"""Largest harness record read back (about 200,000 test ids); a larger one is invalid."""
TEST_FILE_MAX_BYTES = 8 << 20
"""Largest test file read to plant decoys in; a larger one (a generated fixture, not a test module) gets none."""
RECORD_STATUSES = frozenset({"PASSED", "SKIPPED", "XFAIL", "FAILED", "ERROR"})


def parse_record(raw: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    """(the harness record, None) when `raw` is one pytest_record.py can write, else (None, why not): read
    back from the sandbox, it is untrusted input -- capped, depth-safe, checked against the plugin's schema.
    No record (None, None) and an invalid one both leave the run unresolved; only the invalid one is forged."""
    if raw is None:
        return None, None
    if len(raw) > RECORD_MAX_BYTES:
        return None, f"over {RECORD_MAX_BYTES} bytes"
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        return None, f"not JSON ({type(e).__name__})"
    if not isinstance(record, dict) or not {"finished", "exitstatus", "tests"} <= set(record):
        return None, "not an object with finished, exitstatus and tests"
    tests = record["tests"]
    if record["finished"] is not True or type(record["exitstatus"]) is not int or not isinstance(tests, dict):
        return None, "finished is not true, exitstatus not an integer or tests not an object"
    if not all(isinstance(k, str) and isinstance(v, str) and v in RECORD_STATUSES for k, v in tests.items()):
        return None, "a test outcome is not one of " + ", ".join(sorted(RECORD_STATUSES))
    return record, None


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _with_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def _write_text(path: Path, text: str) -> None:
    write_atomic(path, text.encode("utf-8", errors="replace"))
