"""A fake of the Sandbox protocol for fast grading tests (the outer boundary; the grader under test is real):
it runs nothing, answers each harness step as scripted and hands back the test output, exit status and
harness record an honest run of the scripted outcomes would leave, canaries included."""

from __future__ import annotations

import json
import re

from tiny_task import F2P, P2P, TEST_CLAMP

from swe_megatron.grading.canaries import Canaries
from swe_megatron.sandbox.base import ExecResult, SandboxError

PASS = {t: "PASSED" for t in F2P + P2P}
FAIL = {**PASS, F2P[0]: "FAILED"}


class FakeSandbox:
    """Every command succeeds unless the regex `fail` matches it (then SandboxError, a timeout with
    `timeout=True`, or the ExecResult `answer`); `fail="start"`/`"write"` fail those calls. read_file serves
    the test run's files from `outcomes` (test id -> PASSED/FAILED, canaries added by the grader's own names)
    or `files` (by base name; an exception there is raised). What it was asked is kept: `execs` (command,
    timeout_s), `reads` (path -> max_bytes), `written` (path -> bytes)."""

    made: list[FakeSandbox] = []
    planted: list[Canaries] = []
    """The canaries each grading drew (recorded by conftest's `planted_canaries` fixture)."""
    planted_texts: list[dict[str, str]] = []
    """And each grading's planted files: file -> its text."""

    def __init__(self, outcomes, fail=None, timeout=False, files=None, fail_control=False, answer=None):
        self.outcomes, self.fail, self.timeout, self.files = dict(outcomes), fail, timeout, dict(files or {})
        self.fail_control, self.answer, self.written, self.patched = fail_control, answer, {}, False
        self.canary_ids: set[str] = set()
        self.execs: list[tuple[str, float | None]] = []
        self.reads: dict[str, int | None] = {}
        FakeSandbox.made.append(self)

    def start(self):
        if self.fail == "start":
            raise SandboxError("no sandbox today")

    def exec(self, command, timeout_s=None):
        self.execs.append((command, timeout_s))
        self.patched |= "model.diff" in command
        failing = self.fail and re.search(self.fail, command) and (self.patched or self.fail_control)
        if failing and self.timeout:
            return ExecResult(b"", -1, timed_out=True)
        if failing and self.answer is not None:
            return self.answer
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
        self.reads[path] = max_bytes
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
        if isinstance(data, Exception):
            raise data
        return data if max_bytes is None else data[-max_bytes:]

    def stop(self):
        pass
