"""Every parser of model-controlled text is total (design.md invariant 6, issue 40 item 3): it returns or
refuses cleanly on any input, never raises.

A crash there used to become an excluded sample (or, in `swe-megatron grade`, cost every other prediction its
result): a patch header `new file mode 100999` made the sanitiser's mode check raise ValueError. Hypothesis
feeds each parser the shapes a model can produce: odd modes, renames and copies, binary markers, CRLF, huge or
empty hunks, NUL bytes, lone surrogates, non-UTF-8 bytes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tiny_task import GOLD_PATCH, git
from unidiff import PatchSet

from swe_megatron.grading import canaries as canary_tests
from swe_megatron.grading.grader import (
    _log_status,
    _patch_paths,
    _text,
    _write_text,
    compose_log,
    decide,
    parse_record,
    patch_bytes,
    task_grading,
)
from swe_megatron.grading.sanitize import sanitize_patch
from swe_megatron.sandbox.host_diff import host_diff

NOT_OCTAL = "diff --git a/x.py b/x.py\nnew file mode 100999\n--- /dev/null\n+++ b/x.py\n@@ -0,0 +1 @@\n+a\n"

# Lines a patch's header and hunks are made of, the odd ones included.
PATCH_LINES = [
    "diff --git a/x.py b/x.py",
    "diff --git a/x.py b/y.py",
    'diff --git "a/q\\"x.py" "b/q\\"x.py"',
    "new file mode 100999",
    "new file mode 100644",
    "new file mode 120000",
    "new file mode 160000",
    "deleted file mode 1e3",
    "deleted file mode 100755",
    "old mode 100644",
    "new mode 100755",
    "new mode 9",
    "new mode ",
    "old mode 0x1ff",
    "new mode 99999999999999999999",
    "similarity index 100%",
    "dissimilarity index 1000%",
    "rename from a.py",
    "rename to b.py",
    "copy from ../outside.py",
    "copy to /etc/passwd",
    "index 0000000..1111111 100644",
    "index deadbeef..cafe 100999",
    "Binary files a/x.py and b/x.py differ",
    "GIT binary patch",
    "literal 0",
    "--- a/x.py",
    "+++ b/x.py",
    "--- /dev/null",
    "+++ /dev/null",
    "--- ",
    "+++ b/",
    "@@ -1 +1 @@",
    "@@ -0,0 +1,3 @@",
    "@@ -1,99999999 +1,0 @@",
    "@@ -1,0 +0,0 @@",
    "@@ -a +b @@",
    "@@ -1 +1 @@ def f():",
    "+added",
    "-removed",
    " context",
    "\\ No newline at end of file",
    "",
    "+nul \x00 byte",
    "+caf\udce9",
    "+lone \ud800 surrogate",
    "\r",
]
patch_text = st.one_of(
    st.builds(
        lambda lines, sep: sep.join(lines),
        st.lists(st.one_of(st.sampled_from(PATCH_LINES), st.text(max_size=20)), max_size=40),
        st.sampled_from(["\n", "\r\n"]),
    ),
    st.text(max_size=300),
)
TOTAL = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(
    "header",
    [
        "new file mode 100999",
        "new file mode 99999999999999999999",
        "old mode 100644\nnew mode 100999",
        "old mode 100999\nnew mode 100644",
        "new file mode 1e3",  # not digits: no mode to unidiff, and the line is not copied
        "new file mode 0x1ff",
    ],
)
def test_a_file_mode_that_is_not_octal_is_dropped_not_raised(header):
    patch = f"diff --git a/x.py b/x.py\n{header}\n--- /dev/null\n+++ b/x.py\n@@ -0,0 +1 @@\n+a\n"
    clean = sanitize_patch(GOLD_PATCH + patch)
    assert "calc/ops.py" in clean.kept and clean.patch.startswith(GOLD_PATCH)  # the rest is kept as it was
    if header.split()[-1].isdigit():
        assert clean.dropped[0].path == "x.py" and clean.dropped[0].reason == "invalid file mode"
        assert clean.patch == GOLD_PATCH
    else:
        assert header not in clean.patch and "x.py" in clean.kept


@given(patch_text)
@example(NOT_OCTAL)
@example(GOLD_PATCH + NOT_OCTAL)
@example("diff --git a/x.py b/x.py\nold mode 100644\nnew mode 100999\n")
@TOTAL
def test_the_sanitiser_and_what_grading_parses_of_its_output_never_raise(text):
    clean = sanitize_patch(text, protected={"tests/test_x.py"})
    assert isinstance(clean.patch, str)
    patch_bytes(text)
    if clean.patch:  # what the grader parses again: the paths to reset between apply attempts
        assert PatchSet(clean.patch)
        _patch_paths(clean.patch)
        patch_bytes(clean.patch)


@given(st.one_of(st.binary(max_size=300), st.builds(lambda v: json.dumps(v).encode(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["finished", "exitstatus", "tests", "x", "t::a"]), inner, max_size=4),
    max_leaves=20,
))))  # fmt: skip
@example(b"[" * 100_000)
@example(b'{"finished": true, "exitstatus": 1e999, "tests": {}}')
@TOTAL
def test_the_harness_record_parser_never_raises(raw):
    record, problem = parse_record(raw)
    assert (record is None) or (problem is None and record["finished"] is True)


LOG_LINES = [
    "PASSED tests/test_clamp.py::test_clamp_high",
    "FAILED tests/test_clamp.py::test_clamp_high - assert 1 == 2",
    "ERROR tests/test_basic.py::test_add",
    "XFAIL tests/test_clamp.py::test_clamp_low",
    "PASSED",
    "PASSED \x00",
    ">>>>> Start Test Output",
    ">>>>> End Test Output",
    "+ pytest -rA",
    "= 2 passed in 0.01s =",
    "caf\udce9",
    "PASSED tests/test_clamp.py::test_clamp_high[\ud800]",
]


@pytest.fixture(scope="module")
def graded_task(tmp_path_factory):
    """The tiny task's grading fields (no environment needed: only its log parser is used)."""
    from tiny_task import build_task

    folder = tmp_path_factory.mktemp("tiny_parse")
    return build_task(folder, folder / "no-env")


@given(st.lists(st.one_of(st.sampled_from(LOG_LINES), st.text(max_size=40)), max_size=30), st.data())
@TOTAL
def test_the_test_log_and_the_verdict_on_it_never_raise(graded_task, tmp_path_factory, lines, data):
    task = graded_task
    tg = task_grading(task)
    log = tmp_path_factory.mktemp("log") / "test_output.txt"
    code = data.draw(st.one_of(st.none(), st.integers(-(2**70), 2**70)))
    output = patch_bytes("\n".join(lines)) + data.draw(st.binary(max_size=50))  # as the sandbox left it
    _write_text(log, compose_log(_text(output), code, data.draw(st.booleans()), None))  # as the grader does
    record = {"finished": True, "exitstatus": 0, "tests": {t: "PASSED" for t in data.draw(st.lists(
        st.sampled_from([*task.FAIL_TO_PASS, *task.PASS_TO_PASS, "x::y"]), max_size=4))}}  # fmt: skip
    decide(task, tg, log, record, GOLD_PATCH)
    status = _log_status(task, tg, log)
    source = (Path(task.extra["repo_dir"]) / "tests" / "test_basic.py").read_text()
    ids = [t for t in task.PASS_TO_PASS if t.startswith("tests/test_basic.py::")]
    canary_tests.check(canary_tests.plant("tests/test_basic.py", source, ids), status, record)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pristine") / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (repo / "data.txt").write_bytes(b"a\r\nb\r\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    return repo


names = st.lists(
    st.sampled_from(["pkg/mod.py", "data.txt", "new.py", "a b.py", 'q"x.py', "back\\slash.py", "tab\t.py",
                     "nl\nnew file mode 100999\n.py", "caf\udce9.py", "pkg/sub/deep.py", " lead.py"]),
    min_size=1, max_size=4, unique=True,
)  # fmt: skip
contents = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"", b"\x00", b"a\r\nb\r\n", b"no newline", b"caf\xe9\n", b"x\n" * 5000]),
)


@given(st.lists(st.tuples(names, contents), min_size=1, max_size=3))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
def test_the_host_diff_of_any_workspace_is_git_applicable_and_sanitises(pristine, tmp_path, edits):
    """Whatever files (names and bytes) the agent leaves, the diff the host takes parses, sanitises, and applies
    to the pristine repository with `git apply` (no header can be injected through a file name)."""
    ws = tmp_path / "ws"
    subprocess.run(["rm", "-rf", str(ws)], check=True)
    subprocess.run(["cp", "-a", str(pristine), str(ws)], check=True)
    for group, data in edits:
        for name in group:
            path = ws / name.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    patch = host_diff(pristine, ws, 1 << 20)
    clean = sanitize_patch(patch)
    assert "100999" not in clean.patch and all(d.reason != "invalid file mode" for d in clean.dropped)
    if not patch:
        return
    check = subprocess.run(
        ["git", "apply", "--check", "-"], cwd=pristine, input=patch_bytes(patch), capture_output=True
    )
    assert check.returncode == 0, check.stderr.decode(errors="replace")
