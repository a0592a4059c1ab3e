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
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

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


def report(files: list[str], statuses: dict[str, str], show) -> int:
    """Per file: mutants, killed, survived, no tests, kill rate, the survivors' diffs; the number of survivors."""
    total_survived = 0
    for path in files:
        mod = module_name(path) + "."
        mine = {n: s for n, s in statuses.items() if n.startswith(mod)}
        counts = Counter("killed" if s in KILLED else s for s in mine.values())
        killed, n = counts["killed"], len(mine)
        survivors = sorted(k for k, s in mine.items() if s not in KILLED)
        total_survived += len(survivors)
        rate = f"{100 * killed / n:.0f}%" if n else "-"
        detail = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()) if k != "killed")
        print(f"\n{path}: {n} mutants, {killed} killed ({rate}){', ' + detail if detail else ''}")
        for name in survivors:
            print(f"  {mine[name]}: {name}\n    " + show(name).replace("\n", "\n    "))
    return total_survived


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

    work = args.keep or Path(tempfile.mkdtemp(prefix="swe-mutate-"))
    work.mkdir(parents=True, exist_ok=True)
    if (work / "pyproject.toml").exists():
        ap.error(f"--keep {work} is not empty: give a new folder")
    try:
        configure(work, files, tests, args.markers, scratch_copy(work))
        # The copy's code, not the work tree's: the tree is dropped from PYTHONPATH (mutmut puts mutants/ first).
        path = [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT
        ]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1")
        # Its own session: mutmut forks a child per mutant, and a stopped check must stop them all.
        log = work / "mutmut.log"
        with log.open("w") as out:
            run = subprocess.Popen(
                [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.jobs)], cwd=work, env=env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            run.wait()
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
        if run.returncode:
            print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
            print(f"mutate: mutmut failed (exit {run.returncode}); its files are in {work}", file=sys.stderr)
            args.keep = work
            return 2
        survived = report(files, results(work, env), lambda name: diff(work, env, name))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
