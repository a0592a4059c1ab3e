#!/usr/bin/env python3
"""The mutation check: do the fast tests fail when the code a change touches is wrong?

mutmut (pinned in requirements/cpu.txt) makes one-line bugs in the given files (operators, comparisons,
constants, arguments, assignments, strings), applies each alone and runs the tests that cover the mutated
function; a mutant no test fails on "survived". This script runs it on a scratch copy of the work tree (the
tree itself is never changed, and mutmut's `mutants/` folder stays out of it), with this repository's
layout and markers, and prints per file: mutants, killed (a test failed or hung), survived, no tests, the kill
rate, and each survivor's diff. Judge each survivor: a missing test, or an equivalent mutant (no behaviour
changes: say why). A habit before stopping, not CI (minutes per file on 2 cores).

    tools/mutate.py swe_megatron/engine/gate.py                    # tests: those that import the module
    tools/mutate.py swe_megatron/engine/gate.py --tests tests/engine/test_gate.py
    tools/mutate.py                                                # the .py files changed since main

Tests run with -m "not slurm and not e2e and not gpu" (override with --markers); a mutant whose tests run past
mutmut's timeout counts as killed (the tests noticed: they hung).

Beyond mutmut (which only mutates function bodies, and picks each mutant's tests by what ran in the test process):
- the modules' top-level constants and tables are mutated too (tools/constant_mutants.py: each table entry
  removed, numbers + 1, strings changed), each written into the copy's file and the tests run on it;
- code run in child processes: the copy's mutmut tree is first on every process's PYTHONPATH and the active
  mutant is in the environment, so a `python -m swe_megatron...` child runs the mutant too; and every mutant
  mutmut found no test for, or that survived its selected tests, is run again against all the given tests
  (its tests may reach the function only in a child, which mutmut's in-process coverage cannot see).
  Not reached: a child started with an environment of its own (no PYTHONPATH, no MUTANT_UNDER_TEST), which
  imports the work tree through the editable install, code copied out of the package into a sandbox, and the
  functions of a module run as `python -m` in its `__main__` copy (mutmut activates a mutant by module name; so
  the rollout process is started as `python -c` calling main() of the imported module: rollout_process.CHILD).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from constant_mutants import ConstantMutant, constant_mutants  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MARKERS = "not slurm and not e2e and not gpu"
KILLED = {"killed", "timeout", "segfault"}
"""mutmut statuses that mean the tests noticed the mutant."""


def _git(*args: str) -> list[str]:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line]


def changed_files(base: str) -> list[str]:
    """Package .py files changed since the merge base with `base`, committed or not."""
    merge_base = _git("merge-base", "HEAD", base)[0]
    files = set(_git("diff", "--name-only", merge_base, "--", "swe_megatron"))
    files |= set(_git("ls-files", "--others", "--exclude-standard", "--", "swe_megatron"))
    return sorted(f for f in files if f.endswith(".py") and (ROOT / f).exists())


def module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def covering_tests(path: str) -> list[str]:
    """Test files that import the module (by its dotted name, or `from package import name`)."""
    mod = module_name(path)
    package, _, name = mod.rpartition(".")
    pattern = re.compile(
        rf"\b{re.escape(mod)}\b|from {re.escape(package)} import [^\n]*\b{re.escape(name)}\b"
    )
    return sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if pattern.search(p.read_text())
    )


def scratch_copy(dest: Path) -> list[str]:
    """The work tree's files (tracked and untracked, not ignored) under dest; data/ linked, not copied, also in
    dest/mutants (where mutmut runs the tests). Returns the tree's top-level entries, for mutmut's also_copy."""
    top = set()
    for rel in _git("ls-files", "--cached", "--others", "--exclude-standard"):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
            top.add(rel.split("/", 1)[0])
    if (ROOT / "data").exists():
        (dest / "mutants").mkdir()
        for link in (dest / "data", dest / "mutants" / "data"):
            link.symlink_to((ROOT / "data").resolve())
    return sorted(top - {"data"})


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def configure(dest: Path, files: list[str], tests: list[str], markers: str, top: list[str]) -> None:
    """mutmut's settings for this run, appended to the copy's pyproject.toml; top: the tree's top-level entries."""
    with (dest / "pyproject.toml").open("a") as f:
        f.write(
            "\n[tool.mutmut]\n"
            f"source_paths = {_toml_list(files)}\n"
            # The rest of the tree as it is: the tests import the package and read slurm/, configs/, containers/...
            f"also_copy = {_toml_list(top)}\n"
            f"pytest_add_cli_args_test_selection = {_toml_list(tests)}\n"
            f"pytest_add_cli_args = {_toml_list(['-p', 'no:cacheprovider', '-m', markers])}\n"
        )


def results(dest: Path, env: dict[str, str]) -> dict[str, str]:
    """{mutant name: status} of every mutant mutmut made."""
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=dest, env=env, capture_output=True,
        text=True, check=True,
    ).stdout  # fmt: skip
    found = (re.match(r"\s*(\S+): (.+)$", line) for line in out.splitlines())
    return {m[1]: m[2].strip() for m in found if m}


def diff(dest: Path, env: dict[str, str], name: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "show", name], cwd=dest, env=env, capture_output=True, text=True
    ).stdout
    return "\n".join(line for line in out.splitlines() if line[:1] in "-+" and line[:3] not in ("---", "+++"))


def run_tests(cwd: Path, env: dict[str, str], tests: list[str], markers: str, timeout_s: float) -> str:
    """The tests once in a process of their own (and its children): "killed" (a test failed), "timeout" (they
    ran past timeout_s: a hang), "survived" (all passed), or "error N" (pytest could not run them)."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", markers, *tests]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "timeout"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what the tests left running
    return {0: "survived", 1: "killed"}.get(rc, "killed" if rc < 0 else f"error {rc}")


def whole_test_reruns(work: Path, env: dict[str, str], names: list[str], tests, markers, timeout_s) -> dict:
    """{mutmut mutant: status} of each mutant run again, active in every process, against all the tests."""
    out = {}
    for name in names:
        out[name] = run_tests(work / "mutants", dict(env, MUTANT_UNDER_TEST=name), tests, markers, timeout_s)
        print(f"  {name}: {out[name]} (all tests)", flush=True)
    return out


def constant_runs(work: Path, env: dict[str, str], path: str, tests, markers, timeout_s) -> dict:
    """{ConstantMutant: status}: each written into the plain copy's file, the tests run there (env: the copy first
    on PYTHONPATH, so the processes they start import it too), the file put back."""
    target = work / path
    original = target.read_text()
    out = {}
    try:
        for m in constant_mutants(original):
            target.write_text(m.source)
            out[m] = run_tests(work, env, tests, markers, timeout_s)
            print(f"  {path}: {m.name}: {out[m]}", flush=True)
    finally:
        target.write_text(original)
    return out


def _constant_diff(m: ConstantMutant) -> str:
    return f"line {m.line}: {m.old.strip()!r} -> {m.new!r}" if m.new else f"line {m.line}: removed {m.old!r}"


def report(files: list[str], statuses: dict[str, str], show, constants: dict | None = None) -> int:
    """Per file: mutants (mutmut's and the constants'), killed, survived, no tests, kill rate, the survivors'
    diffs; the number of survivors."""
    total_survived = 0
    for path in files:
        mod = module_name(path) + "."
        mine = {n: s for n, s in statuses.items() if n.startswith(mod)}
        const = {mod + m.name: (m, status) for m, status in (constants or {}).get(path, {}).items()}
        mine |= {name: status for name, (_, status) in const.items()}
        counts = Counter("killed" if s in KILLED else s for s in mine.values())
        killed, n = counts["killed"], len(mine)
        survivors = sorted(k for k, s in mine.items() if s not in KILLED)
        total_survived += len(survivors)
        rate = f"{100 * killed / n:.0f}%" if n else "-"
        detail = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()) if k != "killed")
        print(f"\n{path}: {n} mutants, {killed} killed ({rate}){', ' + detail if detail else ''}")
        for name in survivors:
            text = _constant_diff(const[name][0]) if name in const else show(name)
            print(f"  {mine[name]}: {name}\n    " + text.replace("\n", "\n    "))
    return total_survived


def run_mutmut(work: Path, env: dict[str, str], jobs: int) -> bool:
    """mutmut's run in the copy; False (its log's tail printed) when it failed."""
    log = work / "mutmut.log"
    # Its own session: mutmut forks a child per mutant, and a stopped check must stop them all.
    with log.open("w") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)], cwd=work, env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        run.wait()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    text = log.read_text(errors="replace")
    if run.returncode and "could not find any test case for any mutant" in text:
        print("mutate: mutmut made no mutant the tests reach in their process (or none at all)", flush=True)
    elif run.returncode:
        print(text[-4000:], file=sys.stderr)
        print(f"mutate: mutmut failed (exit {run.returncode}); its files are in {work}", file=sys.stderr)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "files", nargs="*", help="package .py files to mutate (default: those changed since --base)"
    )
    ap.add_argument(
        "--tests", nargs="+", help="test files or ids to run (default: the test files importing them)"
    )
    ap.add_argument("--base", default="main", help="the branch a change is measured from (default: main)")
    ap.add_argument("--markers", default=MARKERS, help=f'pytest -m expression (default: "{MARKERS}")')
    ap.add_argument("--jobs", type=int, default=1, help="mutants tested at once (default 1)")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument("--no-constants", action="store_true", help="leave the top-level constants alone")
    ap.add_argument(
        "--only-constants", action="store_true", help="the constants' mutants only (no mutmut run)"
    )
    ap.add_argument("--no-rerun", action="store_true",
                    help="skip the rerun of mutmut's survivors and untested mutants against all the tests")  # fmt: skip
    args = ap.parse_args(argv)

    files = args.files or changed_files(args.base)
    bad = [
        f for f in files if not (f.startswith("swe_megatron/") and f.endswith(".py") and (ROOT / f).is_file())
    ]
    if not files or bad:
        ap.error(f"no package file to mutate ({', '.join(bad) or 'none changed since ' + args.base}); "
                 "allowed: paths like swe_megatron/engine/gate.py")  # fmt: skip
    tests = args.tests or sorted({t for f in files for t in covering_tests(f)})
    if not tests:
        ap.error(f"no test file imports {', '.join(files)}: name the tests with --tests")
    print(f'mutate: {" ".join(files)}\ntests:  {" ".join(tests)}  (-m "{args.markers}")', flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped check still cleans up (finally below)
    work = args.keep or Path(tempfile.mkdtemp(prefix="swe-mutate-"))
    work.mkdir(parents=True, exist_ok=True)
    if (work / "pyproject.toml").exists():
        ap.error(f"--keep {work} is not empty: give a new folder")
    try:
        configure(work, files, tests, args.markers, scratch_copy(work))
        # The copy's code, not the work tree's: the tree is dropped from PYTHONPATH, and mutmut's tree goes first
        # on it, so that processes the tests start (whatever their folder) import the mutants too.
        path = [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT
        ]
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(work / "mutants"), *path]), OMP_NUM_THREADS="1"
        )
        start = time.monotonic()
        plain = dict(env, PYTHONPATH=os.pathsep.join([str(work), *path]))
        if (baseline := run_tests(work, plain, tests, args.markers, 3600)) != "survived":
            ap.error(f"the tests do not pass on the unmutated copy ({baseline}): fix them first")
        timeout_s = max(60.0, 4 * (time.monotonic() - start))
        if not args.only_constants and not run_mutmut(work, env, args.jobs):
            args.keep = work
            return 2
        statuses = {} if args.only_constants else results(work, env)
        if not args.no_rerun:
            mods = tuple(module_name(f) + "." for f in files)
            again = [n for n, st in statuses.items() if n.startswith(mods) and st not in KILLED]
            print(
                f"mutate: {len(again)} mutants survived mutmut's test selection or had none: all tests",
                flush=True,
            )
            statuses |= whole_test_reruns(work, env, again, tests, args.markers, timeout_s)
        constants = {}
        if not args.no_constants:
            print("mutate: top-level constants", flush=True)
            constants = {f: constant_runs(work, plain, f, tests, args.markers, timeout_s) for f in files}
        survived = report(files, statuses, lambda name: diff(work, env, name), constants)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
