"""The shell commands one grading runs inside the sandbox, as pure functions of the task.

Order (SWE-bench's): apply the model patch (GIT_APPLY_CMDS in turn, the touched files reset between
attempts), restore the task's test files to the base commit and apply the test patch, then run the
test command in a fresh `bash --noprofile --norc` with stdin closed and stderr merged into stdout.

The test process's output goes to a file of its own; the harness (grader.py) writes the
">>>>> Start/End Test Output" markers around it on the host afterwards, so nothing the code under test
prints can move a marker. For pytest the harness also loads pytest_record.py, which records each
test's outcome independently of the printed log.
"""

from __future__ import annotations

import shlex

# SWE-bench 5.0.2's order (swebench.harness.run_evaluation.GIT_APPLY_CMDS; that module imports docker,
# so the list is copied here and a test checks the copy against the installed source).
GIT_APPLY_CMDS = (
    "git apply --verbose",
    "git apply --verbose --3way",
    "git apply --verbose --reject",
    "patch --batch --forward --fuzz=5 -p1 -i",
)
PLUGIN_MODULE = "_swe_megatron_grade_record"
"""Module name of pytest_record.py inside the sandbox (also protected by the sanitiser)."""
TOKEN_ENV = "SWE_MEGATRON_GRADE_TOKEN"
"""Environment variable naming the plugin's one-time token file (pytest_record.TOKEN_ENV)."""
TIMEOUT_EXIT_CODES = (124, 137)
"""Exit statuses of `timeout` when it ended the test command (TERM, then KILL)."""
KILL_AFTER_S = 10
"""Seconds between timeout's TERM and KILL."""


def apply_command(cmd: str, patch_path: str) -> str:
    """One attempt at applying the model patch."""
    return f"{cmd} {shlex.quote(patch_path)}"


def reverse_check_command(patch_path: str) -> str:
    """Succeeds when the patch is already fully applied (SWE-bench's last resort after the chain)."""
    return f"git apply --check --reverse {shlex.quote(patch_path)}"


def reset_command(paths: list[str]) -> str:
    """Undo a failed attempt: the patch's files back to HEAD (or removed when new), leftovers deleted."""
    lines = []
    for p in paths:
        q = shlex.quote(p)
        lines.append(
            f"{{ git checkout -q HEAD -- {q} 2>/dev/null || rm -f -- {q}; }}; rm -f -- {q}.rej {q}.orig"
        )
    return "\n".join(lines) or "true"


def restore_tests_command(
    base_commit: str, existing_test_files: list[str], test_patch_path: str | None
) -> str:
    """SWE-bench's test restore: the test files back to base_commit, then the test patch on top."""
    steps = ["set -e"]
    if existing_test_files:
        files = " ".join(shlex.quote(f) for f in existing_test_files)
        steps.append(f"git checkout -q {shlex.quote(base_commit)} -- {files}")
    if test_patch_path:
        steps.append(f"git apply --verbose {shlex.quote(test_patch_path)}")
    return "\n".join(steps)


def setup_command(grade_dir: str, record: bool) -> str:
    """The eval script's setup, run as a harness step before the model patch is applied (so its failure is
    provably not the model's): the write-only folder the harness record goes to."""
    return f"mkdir -m 0333 {shlex.quote(grade_dir + '/out')}" if record else "true"


def test_script(
    test_cmd: str,
    workdir: str,
    grade_dir: str,
    timeout_s: float,
    *,
    pytest_summary: bool,
    record: bool,
) -> str:
    """The eval script: run the test command once, output to grade_dir/test_output.txt, status to exit_code.

    Run as `bash -c SCRIPT` (never from a file the sandbox user could rewrite while bash reads it); its setup
    is `setup_command`, run before the patch is applied, so nothing in here decides an exclusion: whatever
    it leaves behind is read by the host as untrusted, size-capped input. pytest_summary adds -rA through
    PYTEST_ADDOPTS (the summary lines swebench's pytest parsers read), with one-line tracebacks (--tb=line:
    formatting a long traceback costs ~7 ms a failure, and every grading has its must-fail canaries; the
    summary keeps each failure's message; a test command's own --tb comes later and wins); record loads
    pytest_record.py through PYTEST_PLUGINS/PYTHONPATH. Only shell builtins run between the tests and writing their status, so a patch
    that exhausts the process limit cannot stop it.
    """
    lines = ["set -u", f"D={shlex.quote(grade_dir)}", f"cd {shlex.quote(workdir)} || exit 1"]
    if pytest_summary:
        lines.append('export PYTEST_ADDOPTS="-rA --tb=line${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}"')
    if record:
        lines += [
            f'export PYTEST_PLUGINS="{PLUGIN_MODULE}${{PYTEST_PLUGINS:+,$PYTEST_PLUGINS}}"',
            'export PYTHONPATH="$D/plugin${PYTHONPATH:+:$PYTHONPATH}"',
            f'export {TOKEN_ENV}="$D/token"',
        ]
    seconds = max(1, int(round(timeout_s)))
    lines += [
        f'timeout -k {KILL_AFTER_S} {seconds} bash --noprofile --norc -c {shlex.quote(test_cmd)} </dev/null >"$D/test_output.txt" 2>&1',
        'echo $? >"$D/exit_code"',
        *(['chmod 0700 "$D/out"'] if record else []),
        "exit 0",
    ]
    return "\n".join(lines) + "\n"
