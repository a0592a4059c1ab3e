"""Running a library's own pytest suite on the host, with the probe plugin, in a clean environment.

These runs are trusted PyPI code executed while building tasks (like pip building an sdist), never part of
an agent rollout. Each run gets a memory limit, a per-test limit and a whole-run limit, and its own
process group so a runaway mutant is killed with all its children.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PLUGIN_MODULE = "_swe_megatron_probe"
PLUGIN_SOURCE = Path(__file__).with_name("probe_plugin.py")
PYTEST_FLAGS = ("-p", "no:cacheprovider", "-o", "addopts=", "--rootdir=.")
"""Flags of every run: no cache folder in the repo; the project's addopts (coverage, doctest-modules ...)
left out so only pytest itself and the named test files decide what runs; node ids relative to the
repository root wherever it lies (else a pytest config in a parent folder can move the root)."""
PASSING = frozenset({"passed", "xfailed"})
"""Outcomes SWE-bench grading counts as passing (swebench: PASSED, XFAIL)."""
EXCLUDED_DIRS = frozenset(
    {
        "docs",
        "doc",
        "examples",
        "example",
        "benchmarks",
        "benchmark",
        "build",
        "dist",
        ".git",
        ".tox",
        "venv",
        ".venv",
    }
)
TEST_DIRS = frozenset({"test", "tests", "testing"})


@dataclass
class Layout:
    """Where a library's code and tests are inside its unpacked sdist."""

    import_root: str
    """"" for a flat layout, "src" for a src layout (put on PYTHONPATH)."""
    test_files: list[str]
    """Test files (test_*.py, *_test.py), relative paths, sorted."""
    source_files: list[str]
    """Library modules that may be mutated, relative paths, sorted."""

    def test_cmd(self, files: list[str]) -> str:
        """The command the grader runs in /testbed (env bin first on PATH) for these test files."""
        # Prepend, not replace: the grader puts its own pytest plugin on PYTHONPATH.
        prefix = f'PYTHONPATH="{self.import_root}${{PYTHONPATH:+:$PYTHONPATH}}" ' if self.import_root else ""
        args = " ".join(shlex.quote(f) for f in files)
        return f"{prefix}python -m pytest -rA {' '.join(PYTEST_FLAGS)} {args}"


def find_layout(tree: Path) -> Layout:
    """Classify the files of an unpacked sdist."""
    src = tree / "src"
    src_layout = src.is_dir() and (any(src.glob("*/__init__.py")) or any(src.glob("*.py")))
    import_root = "src" if src_layout else ""
    tests, sources = [], []
    for path in sorted(tree.rglob("*.py")):
        rel = path.relative_to(tree)
        parts = rel.parts
        if any(p in EXCLUDED_DIRS or p.endswith(".egg-info") for p in parts[:-1]):
            continue
        name = parts[-1]
        is_test = name.startswith("test_") or name.endswith("_test.py")
        if is_test:
            tests.append(rel.as_posix())
            continue
        if name in ("conftest.py", "setup.py", "noxfile.py") or any(p in TEST_DIRS for p in parts[:-1]):
            continue
        if import_root and parts[0] != import_root:
            continue
        if not import_root and len(parts) > 1 and not (tree / parts[0] / "__init__.py").is_file():
            continue  # a top-level folder that is not a package (scripts, tools)
        sources.append(rel.as_posix())
    return Layout(import_root=import_root, test_files=tests, source_files=sources)


@dataclass
class RunResult:
    """What one pytest run reported through the probe plugin."""

    outcomes: dict[str, str] = field(default_factory=dict)
    failures: dict[str, dict] = field(default_factory=dict)
    collect_errors: list[str] = field(default_factory=list)
    trace: dict | None = None
    """funcs/calls/entries/edges/import_calls when the run was traced."""
    duration_s: float = 0.0
    timed_out: bool = False
    returncode: int = 0
    log_tail: str = ""

    def passing(self) -> set[str]:
        """Node ids that passed (or xfailed, as SWE-bench counts it)."""
        return {k for k, v in self.outcomes.items() if v in PASSING}


def run_tests(
    tree: Path,
    env_dir: Path,
    layout: Layout,
    files: list[str],
    *,
    select: list[str] | None = None,
    trace: bool = False,
    test_timeout_s: float = 10.0,
    timeout_s: float = 300.0,
    memory_mb: int = 4096,
    hash_seed: str = "random",
) -> RunResult:
    """Run pytest on `files` of the library tree with the library's env, recording outcomes (and with
    trace=True the library functions each test calls). hash_seed "0" makes printed sets/dicts reproducible."""
    with tempfile.TemporaryDirectory(prefix="swe-probe-") as tmp_:
        tmp = Path(tmp_)
        (tmp / f"{PLUGIN_MODULE}.py").write_bytes(PLUGIN_SOURCE.read_bytes())
        (tmp / "home").mkdir()
        out = tmp / "record.json"
        # The task's own test command, as the grader runs it; the probe comes in through the environment.
        addopts = ["--probe-out", str(out), "--probe-test-timeout", str(test_timeout_s)]
        if trace:
            (tmp / "sources.txt").write_text("".join(f"{tree / s}\n" for s in layout.source_files))
            addopts += ["--probe-sources", str(tmp / "sources.txt")]
        if select is not None:
            (tmp / "select.txt").write_text("".join(f"{s}\n" for s in select))
            addopts += ["--probe-select", str(tmp / "select.txt")]
        cmd = ["bash", "--noprofile", "--norc", "-c", layout.test_cmd(files)]
        prlimit = shutil.which("prlimit")
        if prlimit:  # not preexec_fn: the factory starts runs from several threads
            cmd = [prlimit, f"--as={memory_mb * 1024 * 1024}", "--", *cmd]
        result = _run_logged(
            cmd, tree, _probe_env(env_dir, tmp, addopts, hash_seed), tmp / "log.txt", timeout_s
        )
        if out.is_file() and not result.timed_out:
            record = json.loads(out.read_text(encoding="utf-8"))
            result.outcomes = record["outcomes"]
            result.failures = record["failures"]
            result.collect_errors = record["collect_errors"]
            if trace:
                result.trace = {k: record[k] for k in ("funcs", "calls", "entries", "edges", "import_calls")}
        return result


def _probe_env(env_dir: Path, tmp: Path, addopts: list[str], hash_seed: str) -> dict[str, str]:
    """The whole environment of a test run: the library's venv first on PATH, the probe plugin loaded."""
    return {
        "PATH": f"{env_dir / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp / "home"),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": str(tmp),
        "PYTHONPATH": str(tmp),
        "PYTEST_PLUGINS": PLUGIN_MODULE,
        "PYTEST_ADDOPTS": shlex.join(addopts),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": hash_seed,
    }


def _run_logged(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, timeout_s: float) -> RunResult:
    """Run `cmd` in its own process group with output to `log`, killing the group past `timeout_s`."""
    start = time.monotonic()
    timed_out = False
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
    result = RunResult(duration_s=time.monotonic() - start, timed_out=timed_out, returncode=proc.returncode)
    result.log_tail = log.read_bytes()[-3000:].decode("utf-8", "replace")
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    # The group of a child not yet reaped: its id cannot have been reused.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
