"""The offline task factory: real bugs in real libraries, from pinned PyPI sdists and their own test suites.

For each library: fetch and check its sdist, build its environment, run its suite twice (once tracing
which library functions each test calls), then try seeded AST mutations inside tested functions. A mutant
becomes a task when at least one of the tests covering its function flips to failing, and the flip is the
same over `stability_runs` runs of the task's test command; FAIL_TO_PASS are the tests that flip,
PASS_TO_PASS the other tests of the same files that stay green. The test files holding FAIL_TO_PASS tests
are hidden from the task's repository and come back through test_patch at grading time.

Layout of the output folder:
    train.jsonl, test.jsonl   SWE-bench rows; the split is by library (test libraries unseen in train)
    repos/INSTANCE_ID/        one git repo per task (only commit: the buggy state)
    envs/NAME-VERSION/        one venv per library (Debian python3.11 + pytest + its requirements)
    sdists/NAME-VERSION/      the downloaded source archives
    report.json               per library: what was used or why not, counts, rejections, timings;
                              also the cache key: a rerun with the same inputs returns at once

Test runs happen in a temporary folder outside OUT, with `workers` runs at a time. The same inputs and
seed give the same tasks (same instance ids, commits, patches and statements) as long as the libraries'
tests are deterministic and no time limit is reached (the report says when one was).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import random
import shutil
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from swe_megatron.atomic_write import write_atomic
from swe_megatron.sandbox.bwrap import system_copies
from swe_megatron.tasks.factory.env import SYSTEM_PYTHON, build_env, library_requirements
from swe_megatron.tasks.factory.errors import LibraryUnusable
from swe_megatron.tasks.factory.mutate import (
    Mutation,
    apply_mutation,
    compiles,
    find_mutations,
    order_mutations,
)
from swe_megatron.tasks.factory.pypi import (
    DEFAULT_PACKAGES,
    DEFAULT_TEST_LIBRARIES,
    PYTEST_REQUIREMENT,
    PackageSpec,
    fetch_sdist,
    normalize,
    unpack,
)
from swe_megatron.tasks.factory.repo import COMMIT_DATE, copy_tree, write_task_repo
from swe_megatron.tasks.factory.statement import problem_statement
from swe_megatron.tasks.factory.suite import PASSING, Layout, RunResult, find_layout, run_tests
from swe_megatron.tasks.load import write_tasks
from swe_megatron.tasks.plan import make_eval_script
from swe_megatron.tasks.schema import Task

FACTORY_VERSION = "3"
"""Bump when the factory's output for the same inputs changes (part of the cache key)."""
NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".pyx", ".pxd", ".rs", ".f", ".f90", ".go")
BAD_FAILURES = {
    "ImportError": "import/attribute error",
    "ModuleNotFoundError": "import/attribute error",
    "AttributeError": "import/attribute error",
    "ProbeTimeout": "test ran past its time limit",
    "MemoryError": "memory limit",
    "RecursionError": "recursion limit",
}


@dataclass
class FactoryConfig:
    """How `make-tasks` builds a task set."""

    out: str
    """Output folder (layout in this module's docstring)."""
    packages: tuple[PackageSpec, ...] = DEFAULT_PACKAGES
    """Libraries to make tasks from."""
    test_libraries: tuple[str, ...] | None = None
    """Libraries whose tasks form the test split; None: the default list's choice, or a seeded quarter."""
    max_tasks: int = 72
    """Tasks to make in all, spread evenly over the libraries (a library's shortfall goes to the next)."""
    seed: int = 0
    """Picks and orders the mutations and the statements' wording; same seed, same tasks."""
    workers: int = 2
    """Test runs in parallel (this machine has 2 cores shared with others)."""
    stability_runs: int = 3
    """Runs of a mutant that must all show the flip (the first runs the covering tests, the others the
    task's test command and must agree test by test); at least 2."""
    test_timeout_s: float = 10.0
    """Per-test limit while mining (a mutant's endless loop fails its test instead of stalling)."""
    suite_timeout_s: float = 600.0
    """Limit of one whole-suite baseline run."""
    max_candidates_per_library: int = 400
    """Mutants tried per library at most."""
    library_budget_s: float = 600.0
    """Wall-clock budget for mining one library (a safety net; reaching it is reported)."""
    memory_mb: int = 4096
    """Address-space limit of each test run."""
    python: str = SYSTEM_PYTHON
    """Interpreter the environments are made from (must be visible inside sandboxes)."""

    def cache_key(self) -> str:
        """Hash of everything that decides the output."""
        data = {
            "version": FACTORY_VERSION,
            "packages": [asdict(p) for p in self.packages],
            "test_libraries": list(self.test_libraries) if self.test_libraries is not None else None,
            "max_tasks": self.max_tasks,
            "seed": self.seed,
            "stability_runs": self.stability_runs,
            "test_timeout_s": self.test_timeout_s,
            "max_candidates_per_library": self.max_candidates_per_library,
            "python": self.python,
            "pytest": PYTEST_REQUIREMENT,
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:20]


@dataclass
class Library:
    """One library on its way through the factory."""

    spec: PackageSpec
    report: dict = field(default_factory=dict)
    pristine: Path | None = None
    layout: Layout | None = None
    env_dir: Path | None = None
    trace: dict | None = None
    """The baseline's call trace, with "tree": the folder its paths are under."""


@dataclass
class Baseline:
    """The unmutated suite: which tests pass in both runs, and what each calls."""

    stable: set[str]
    trace: dict
    tree: Path
    """The traced copy (trace paths are under it)."""
    duration_s: float


@dataclass
class Accepted:
    """A mutant that became a task."""

    mutation: Mutation
    buggy_source: str
    hidden_files: list[str]
    f2p: list[str]
    p2p: list[str]
    failures: dict[str, dict]


class NoTasks(Exception):
    """No library gave a task; nothing was written but the download cache (OUT/sdists)."""


def make_tasks(cfg: FactoryConfig, log: Callable[[str], None] = print) -> dict:
    """Build (or return the cached) task set; returns the report (also written to OUT/report.json)."""
    out = Path(cfg.out).resolve()
    key = cfg.cache_key()
    cached = _cached_report(out, key)
    if cached is not None:
        log(f"make-tasks: {out} is up to date (cache key {key}); nothing to do")
        cached["cached"] = True
        return cached
    if cfg.max_tasks < 1 or cfg.workers < 1 or cfg.stability_runs < 2:
        raise ValueError("max_tasks and workers must be >= 1, stability_runs >= 2")
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    # Test runs happen outside OUT: a pytest config in a folder above OUT (a project's pyproject.toml)
    # must not become the libraries' config.
    work = Path(tempfile.mkdtemp(prefix="swe-megatron-make-tasks-"))
    libs = [Library(spec=s, report={"package": s.requirement, "status": "pending"}) for s in cfg.packages]
    try:
        with ThreadPoolExecutor(cfg.workers) as pool:
            list(pool.map(lambda lib: _prepare(lib, out, work, cfg, log), libs))
        results: dict[str, list[Accepted]] = {}
        remaining = cfg.max_tasks
        for n, lib in enumerate(libs):
            if lib.report["status"] != "ready":
                continue
            ready_left = sum(1 for x in libs[n:] if x.report["status"] == "ready")
            quota = -(-remaining // ready_left)
            results[lib.spec.key] = _mine_library(lib, quota, work, cfg, log)
            remaining = max(0, remaining - len(results[lib.spec.key]))
        if not any(results.values()):  # nothing to write: no empty train/test files
            why = "; ".join(
                f"{lib.spec.requirement}: {lib.report.get('reason', 'no task kept')}" for lib in libs
            )
            raise NoTasks(f"no task made from {len(libs)} librar{'y' if len(libs) == 1 else 'ies'} ({why})")
        report = _write_output(out, libs, results, cfg, key, time.monotonic() - start, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


# -- preparing a library ----------------------------------------------------------------------------


def _prepare(lib: Library, out: Path, work: Path, cfg: FactoryConfig, log: Callable[[str], None]) -> None:
    t0 = time.monotonic()
    spec = lib.spec
    try:
        archive, digest = fetch_sdist(spec, out / "sdists")
        lib.report["sdist"] = archive.name
        lib.report["sha256"] = digest
        lib.pristine = unpack(archive, work / spec.key / "pristine")
        native = sorted(
            p.relative_to(lib.pristine).as_posix()
            for p in lib.pristine.rglob("*")
            if p.suffix in NATIVE_SUFFIXES
        )
        setup_py = lib.pristine / "setup.py"
        if native or (setup_py.is_file() and "Extension(" in setup_py.read_text(errors="replace")):
            raise LibraryUnusable(
                "pure-python", f"not pure Python ({', '.join(native[:3]) or 'setup.py builds an Extension'})"
            )
        lib.layout = find_layout(lib.pristine)
        refuse_sandbox_copies(lib.layout)
        if not lib.layout.test_files:
            raise LibraryUnusable("tests", "no test files (test_*.py / *_test.py) in the sdist")
        if not lib.layout.source_files:
            raise LibraryUnusable("tests", "no library modules found next to the tests")
        requirements = library_requirements(lib.pristine, spec.name, spec.test_deps)
        lib.report["requirements"] = requirements
        lib.env_dir = out / "envs" / spec.key
        build_env(lib.env_dir, requirements, python=cfg.python)
        lib.report["status"] = "ready"
        log(f"make-tasks: {spec.requirement}: sdist and environment ready ({time.monotonic() - t0:.0f}s)")
    except LibraryUnusable as e:
        lib.report.update(status="unusable", stage=e.stage, reason=e.reason)
        log(f"make-tasks: {spec.requirement}: not used ({e.stage}; the reason comes at the end)")
    lib.report["prepare_s"] = round(time.monotonic() - t0, 1)


def refuse_sandbox_copies(layout: Layout) -> None:
    """LibraryUnusable when a top-level module of the library is importable from the sandbox's read-only system
    tree: a patch could run that unmutated copy instead of fixing the bug (defence in depth: the bwrap sandbox
    binds only a minimal tree, bwrap.system_tree)."""
    modules = {
        Path(rel).parts[1 if layout.import_root else 0].removesuffix(".py") for rel in layout.source_files
    }
    copies = system_copies(modules)
    if copies:
        name, path = min(copies.items())
        raise LibraryUnusable("sandbox", f"a copy of {name!r} is readable inside the sandbox ({path})")


def _baseline(lib: Library, work: Path, cfg: FactoryConfig) -> Baseline:
    assert lib.pristine and lib.layout and lib.env_dir
    trees = [work / lib.spec.key / name for name in ("traced", "plain")]
    for tree in trees:
        copy_tree(lib.pristine, tree)
    files = lib.layout.test_files
    kw = dict(
        test_timeout_s=max(60.0, cfg.test_timeout_s * 6),
        timeout_s=cfg.suite_timeout_s,
        memory_mb=cfg.memory_mb,
    )
    with ThreadPoolExecutor(min(2, cfg.workers)) as pool:
        traced_f = pool.submit(run_tests, trees[0], lib.env_dir, lib.layout, files, trace=True, **kw)
        plain_f = pool.submit(run_tests, trees[1], lib.env_dir, lib.layout, files, **kw)
        traced, plain = traced_f.result(), plain_f.result()
    for run in (traced, plain):
        if run.timed_out:
            raise LibraryUnusable("baseline", f"the test suite ran past {cfg.suite_timeout_s:.0f}s")
        if not run.outcomes and not run.collect_errors:
            last = run.log_tail.strip().splitlines()[-1:] or ["no output"]
            raise LibraryUnusable(
                "baseline", f"pytest did not run the suite (exit {run.returncode}): {last[0]}"
            )
    stable = traced.passing() & plain.passing()
    lib.report["baseline"] = {
        "tests": len(plain.outcomes),
        "passing": len(plain.passing()),
        "stable_passing": len(stable),
        "collect_errors": len(plain.collect_errors),
        "flaky": sorted(traced.passing() ^ plain.passing())[:20],
        "seconds": round(plain.duration_s, 1),
    }
    if not stable:
        first = (plain.collect_errors or [f"{len(plain.outcomes)} tests ran, none passed"])[0]
        raise LibraryUnusable("baseline", f"the suite fails before any mutation: {first[:300]}")
    assert traced.trace is not None
    return Baseline(stable=stable, trace=traced.trace, tree=trees[0], duration_s=plain.duration_s)


# -- mining one library --------------------------------------------------------------------------------


def _mine_library(
    lib: Library, quota: int, work: Path, cfg: FactoryConfig, log: Callable[[str], None]
) -> list[Accepted]:
    t0 = time.monotonic()
    try:
        base = _baseline(lib, work, cfg)
    except LibraryUnusable as e:
        lib.report.update(status="unusable", stage=e.stage, reason=e.reason)
        log(f"make-tasks: {lib.spec.requirement}: cannot be used ({e})")
        return []
    lib.trace = {**base.trace, "tree": str(base.tree)}
    covering, candidates = _candidates(lib, base, cfg)
    lib.report["covered_functions"] = len(covering)
    lib.report["candidate_mutations"] = len(candidates)
    tally = _Miner(lib, base, covering, cfg, work).mine(candidates, quota, deadline=t0 + cfg.library_budget_s)
    lib.report.update(
        status="used" if tally.accepted else "unusable",
        mutants_tried=tally.tried,
        tasks=len(tally.accepted),
        quota=quota,
        rejections=dict(sorted(tally.rejections.items())),
        mine_s=round(time.monotonic() - t0, 1),
    )
    if tally.budget_hit:
        lib.report["budget_hit"] = (
            f"stopped after {cfg.library_budget_s:.0f}s (result depends on machine speed)"
        )
    if not tally.accepted:
        lib.report.update(stage="mutation", reason=f"no mutant became a task ({tally.tried} tried)")
    log(
        f"make-tasks: {lib.spec.requirement}: {len(tally.accepted)}/{quota} tasks from {tally.tried} mutants "
        f"({time.monotonic() - t0:.0f}s; rejected: {dict(tally.rejections)})"
    )
    return tally.accepted


@dataclass
class _Tally:
    """What mining one library came to."""

    accepted: list[Accepted] = field(default_factory=list)
    rejections: Counter[str] = field(default_factory=Counter)
    tried: int = 0
    budget_hit: bool = False


@dataclass
class _MutantRuns:
    """A mutant's screening run of the covering tests, the files holding the ones that flipped, and its first
    stability run of those files."""

    screen: RunResult
    hidden: list[str]
    mutant: RunResult


class _Miner:
    """Evaluates one library's mutants, `cfg.workers` at a time, each on a worker copy of the pristine tree."""

    def __init__(self, lib: Library, base: Baseline, covering: dict, cfg: FactoryConfig, work: Path):
        assert lib.pristine and lib.layout and lib.env_dir
        self.lib, self.base, self.covering, self.cfg = lib, base, covering, cfg
        self.trees: queue.Queue[Path] = queue.Queue()
        for w in range(cfg.workers):
            tree = work / lib.spec.key / f"worker{w}"
            copy_tree(lib.pristine, tree)
            self.trees.put(tree)
        self.gold_cache: dict[tuple[str, ...], RunResult] = {}
        self.gold_lock = threading.Lock()
        self.timeout = max(60.0, base.duration_s * 5)

    def mine(self, candidates: list[Mutation], quota: int, deadline: float) -> _Tally:
        """Evaluate candidates in order (a few ahead) until `quota` tasks, one per function, or the deadline."""
        tally = _Tally()
        done: set[tuple[str, int]] = set()
        pending: deque = deque()
        stream = iter(candidates)
        with ThreadPoolExecutor(self.cfg.workers) as pool:

            def submit_next() -> None:
                for m in stream:
                    if (m.file, m.function_line) not in done:
                        pending.append((m, pool.submit(self.evaluate, m)))
                        return

            for _ in range(self.cfg.workers * 2):
                submit_next()
            while pending and len(tally.accepted) < quota:
                if time.monotonic() > deadline:
                    tally.budget_hit = True
                    break
                m, fut = pending.popleft()
                result = fut.result()
                submit_next()
                if (m.file, m.function_line) in done:
                    continue  # evaluated ahead, but its function already has a task
                tally.tried += 1
                if isinstance(result, Accepted):
                    tally.accepted.append(result)
                    done.add((m.file, m.function_line))
                else:
                    tally.rejections[result] += 1
            for _, fut in pending:
                fut.cancel()
        return tally

    def evaluate(self, m: Mutation) -> Accepted | str:
        """Accepted, or the reason the mutant is no task; runs on a free worker tree.

        Run 1 (hash seed 0, so messages are reproducible): the tests covering the mutated function; the ones
        that fail name the hidden test files. Runs 2..stability_runs: the task's test command (those files,
        all their tests). The flip must show in every run and runs 2.. must agree test by test; the gold run
        of the same files (cached per file set) decides which tests pass without the bug."""
        original = (self.lib.pristine / m.file).read_text(encoding="utf-8")
        buggy = apply_mutation(original, m)
        if not compiles(buggy):
            return "mutant does not compile"
        tree = self.trees.get()
        try:
            (tree / m.file).write_text(buggy, encoding="utf-8")
            try:
                found = self._mutant_runs(tree, self.covering[(m.file, m.function_line)])
            finally:
                (tree / m.file).write_text(original, encoding="utf-8")
            if isinstance(found, str):
                return found
            return self._accept(m, buggy, found, self._gold(tree, found.hidden))
        finally:
            self.trees.put(tree)

    def _run(self, tree: Path, files: list[str], **kw) -> RunResult:
        lib, cfg = self.lib, self.cfg
        limits = dict(test_timeout_s=cfg.test_timeout_s, timeout_s=self.timeout, memory_mb=cfg.memory_mb)
        return run_tests(tree, lib.env_dir, lib.layout, files, **limits, **kw)

    def _mutant_runs(self, tree: Path, tests: list[str]) -> _MutantRuns | str:
        """The screening run and the stability runs of the mutant in `tree`, or why it is no task."""
        files = sorted({t.split("::")[0] for t in tests})
        screen = self._run(tree, files, select=tests, hash_seed="0")
        if screen.timed_out:
            return "test run timed out"
        flipped = sorted(t for t in tests if screen.outcomes.get(t) not in PASSING)
        if not flipped:
            return "no test flips"
        bad = _bad_failure(flipped, screen)
        if bad:
            return bad
        hidden = sorted({t.split("::")[0] for t in flipped})
        runs = [self._run(tree, hidden) for _ in range(self.cfg.stability_runs - 1)]
        if any(r.timed_out for r in runs):
            return "test run timed out"
        if any(r.outcomes != runs[0].outcomes for r in runs[1:]) or any(
            r.outcomes.get(t) in PASSING for r in runs for t in flipped
        ):
            return "unstable over repeated runs"
        return _MutantRuns(screen, hidden, runs[0])

    def _gold(self, tree: Path, hidden: list[str]) -> RunResult:
        """The unmutated run of the hidden files (`tree` is pristine again), cached per file set."""
        with self.gold_lock:
            gold = self.gold_cache.get(tuple(hidden))
        if gold is None:
            gold = self._run(tree, hidden)
            with self.gold_lock:
                self.gold_cache[tuple(hidden)] = gold
        return gold

    def _accept(self, m: Mutation, buggy: str, found: _MutantRuns, gold: RunResult) -> Accepted | str:
        """The task the mutant makes (FAIL_TO_PASS: stable tests that pass on gold and fail on it), or why none."""
        screen, mutant, hidden = found.screen, found.mutant, found.hidden
        ok = self.base.stable & gold.passing()
        f2p = sorted(t for t in ok if t in mutant.outcomes and mutant.outcomes[t] not in PASSING)
        p2p = sorted(t for t in ok if mutant.outcomes.get(t) in PASSING and _readable(t))
        if not f2p:
            return "flips only tests that fail without the bug"
        bad = _bad_failure(f2p, mutant)
        if bad:
            return bad
        f2p = [t for t in f2p if _readable(t)]  # the others still fail, but no parser could check them
        return Accepted(
            mutation=m,
            buggy_source=buggy,
            hidden_files=sorted({t.split("::")[0] for t in f2p} | set(hidden)),
            f2p=f2p,
            p2p=p2p,
            failures={t: screen.failures.get(t) or mutant.failures.get(t, {}) for t in f2p},
        )


def _candidates(lib: Library, base: Baseline, cfg: FactoryConfig) -> tuple[dict, list[Mutation]]:
    """Functions called by stably passing tests (not at import time) -> those tests; and the seeded,
    ordered list of mutations inside them."""
    funcs = base.trace["funcs"]
    at_import = set(base.trace["import_calls"])
    covering: dict[tuple[str, int], list[str]] = {}
    for test, ids in sorted(base.trace["calls"].items()):
        if test not in base.stable:
            continue
        for i in ids:
            if i in at_import:
                continue
            path, first_line = funcs[i][0], funcs[i][1]
            rel = os.path.relpath(path, base.tree)
            covering.setdefault((rel, first_line), []).append(test)
    by_file: dict[str, set[int]] = {}
    for rel, first_line in covering:
        by_file.setdefault(rel, set()).add(first_line)
    mutations: list[Mutation] = []
    assert lib.pristine
    for rel in sorted(by_file):
        try:
            source = (lib.pristine / rel).read_text(encoding="utf-8")
            mutations += find_mutations(source, rel, by_file[rel], verify=False)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
    seed = int(hashlib.sha256(f"{cfg.seed}:{lib.spec.key}".encode()).hexdigest()[:12], 16)
    ordered = order_mutations(mutations, seed)[: cfg.max_candidates_per_library]
    return covering, ordered


def _readable(test_id: str) -> bool:
    """SWE-bench's log parsers split summary lines at whitespace: ids holding any cannot be graded."""
    return not any(c.isspace() for c in test_id)


def _bad_failure(failing: list[str], run: RunResult) -> str | None:
    """Why these failures make no task: none gradable, or failures of the wrong kind."""
    if not any(_readable(t) for t in failing):
        return "every failing test id holds whitespace (log parsers cannot read it)"
    for t in failing:
        bad = BAD_FAILURES.get(run.failures.get(t, {}).get("type", ""))
        if bad:
            return bad
    return None


# -- writing the task set -----------------------------------------------------------------------------


def _write_output(
    out: Path,
    libs: list[Library],
    results: dict[str, list[Accepted]],
    cfg: FactoryConfig,
    key: str,
    elapsed_mine: float,
    log: Callable[[str], None],
) -> dict:
    t0 = time.monotonic()
    staging = out / ".staging-repos"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    used = [lib for lib in libs if results.get(lib.spec.key)]
    test_names = _test_libraries(used, cfg)
    splits: dict[str, list[Task]] = {"train": [], "test": []}
    for lib in used:
        split = "test" if normalize(lib.spec.name) in test_names else "train"
        lib.report["split"] = split
        for k, acc in enumerate(results[lib.spec.key]):
            splits[split].append(_task(lib, k, acc, staging, cfg))
    final = out / "repos"
    old = out / ".repos-old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    for split, tasks in splits.items():
        write_tasks(tasks, out / f"{split}.jsonl")
    report = {
        "cache_key": key,
        "factory_version": FACTORY_VERSION,
        "seed": cfg.seed,
        "max_tasks": cfg.max_tasks,
        "tasks": {split: len(tasks) for split, tasks in splits.items()},
        "test_libraries": sorted(test_names),
        "seconds": round(elapsed_mine + time.monotonic() - t0, 1),
        "libraries": [lib.report for lib in libs],
        "files": [
            "train.jsonl",
            "test.jsonl",
            *sorted({f"envs/{lib.spec.key}" for lib in used}),
            *[f"repos/{t.instance_id}" for tasks in splits.values() for t in tasks],
        ],
    }
    write_atomic(out / "report.json", json.dumps(report, indent=2) + "\n")
    log(
        f"make-tasks: wrote {report['tasks']['train']} train + {report['tasks']['test']} test tasks to {out} "
        f"in {report['seconds']:.0f}s"
    )
    return report


def _test_libraries(used: list[Library], cfg: FactoryConfig) -> set[str]:
    names = [normalize(lib.spec.name) for lib in used]
    if cfg.test_libraries is not None:
        return {normalize(n) for n in cfg.test_libraries} & set(names)
    if cfg.packages == DEFAULT_PACKAGES:
        chosen = {normalize(n) for n in DEFAULT_TEST_LIBRARIES} & set(names)
        if chosen and len(chosen) < len(names):
            return chosen
    if len(names) < 2:
        return set()
    rng = random.Random(cfg.seed)
    pool = sorted(names)
    rng.shuffle(pool)
    return set(pool[: max(1, round(len(names) / 4))])


def _task(lib: Library, k: int, acc: Accepted, staging: Path, cfg: FactoryConfig) -> Task:
    assert lib.pristine and lib.layout
    name = normalize(lib.spec.name)
    iid = f"{name}__{name}-{k:04d}"
    m = acc.mutation
    repo = write_task_repo(
        lib.pristine,
        staging / iid,
        {m.file: acc.buggy_source},
        acc.hidden_files,
        message=f"{lib.spec.name} {lib.spec.version}",
    )
    forbidden = _forbidden_words(acc)
    test = _describing_test(acc)
    failure = acc.failures.get(test, {})
    api = _api_name(lib, m, test)
    seed = int(hashlib.sha256(f"{cfg.seed}:{iid}".encode()).hexdigest()[:12], 16)
    statement = problem_statement(
        library=f"{lib.spec.name} {lib.spec.version}",
        api=api,
        exc_type=failure.get("type", ""),
        message=failure.get("message", ""),
        source=failure.get("source", []),
        output=failure.get("output", []),
        forbidden=forbidden,
        seed=seed,
    )
    return Task(
        instance_id=iid,
        repo=f"{name}/{name}",
        base_commit=repo.base_commit,
        patch=repo.patch,
        test_patch=repo.test_patch,
        problem_statement=statement,
        FAIL_TO_PASS=acc.f2p,
        PASS_TO_PASS=acc.p2p,
        created_at=COMMIT_DATE,
        version=lib.spec.version,
        environment_setup_commit=repo.base_commit,
        extra={
            "repo_dir": f"repos/{iid}",
            "env_dir": f"envs/{lib.spec.key}",
            # SWE-bench 5.x's grading columns (written top-level): the plan reads them as it reads SWE-bench's
            "eval_script": make_eval_script(
                repo.base_commit, lib.layout.test_cmd(acc.hidden_files), acc.hidden_files, repo.test_patch
            ),
            "log_parser": "parse_log_pytest",
            "eval_type": "pass_and_fail",
            "library": lib.spec.requirement,
            "mutation": {
                "operator": m.operator,
                "file": m.file,
                "function": m.function,
                "line": m.line,
                "original": m.original,
                "replacement": m.replacement,
            },
            "f2p_errors": {t: acc.failures[t].get("type", "") for t in acc.f2p},
            "api": api,
            "source": "swe-megatron make-tasks",
        },
    )


def _forbidden_words(acc: Accepted) -> list[str]:
    words = set()
    for f in acc.hidden_files:
        base = f.rsplit("/", 1)[-1]
        words |= {f, base, base.removesuffix(".py")}
    for t in (*acc.f2p, *acc.p2p):
        for part in t.split("::")[1:]:
            words.add(part.split("[")[0])
    return sorted(w for w in words if w)


def _describing_test(acc: Accepted) -> str:
    """The failing test whose failure reads best: one with a quotable check, then the shortest message."""

    def rank(t: str) -> tuple:
        f = acc.failures.get(t, {})
        return (not f.get("source"), len(f.get("message", "")) or 10**6, t)

    return min(acc.f2p, key=rank)


def _api_name(lib: Library, m: Mutation, test: str) -> str:
    """The public name the failing test reached the mutated function through (or the function itself)."""
    trace = lib.trace
    assert lib.layout
    if not trace:
        return _dotted(lib.layout, m.file, m.function)
    funcs, edges, tree = trace["funcs"], trace["edges"], trace["tree"]
    targets = {
        i for i, f in enumerate(funcs) if os.path.relpath(f[0], tree) == m.file and f[1] == m.function_line
    }
    graph: dict[int, set[int]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)

    def reaches(start: int) -> bool:
        seen, stack = {start}, [start]
        while stack:
            n = stack.pop()
            if n in targets:
                return True
            for nxt in graph.get(n, ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return False

    reached = {_func_name(lib.layout, funcs[i], tree) for i in trace["entries"].get(test, []) if reaches(i)}
    own = _dotted(lib.layout, m.file, m.function)
    # Public before private, what the test called before the function itself, then the shortest.
    return min(reached | {own}, key=lambda n: (_private_parts(n), n not in reached, len(n), n))


def _private_parts(name: str) -> int:
    return sum(1 for part in name.split(".") if part.startswith("_"))


def _func_name(layout: Layout, func: list, tree: str) -> str:
    path, _, qualname, aliases = func
    rel = os.path.relpath(path, tree)
    top = _module(layout, rel).split(".")[0]
    if aliases:
        return _drop_dunder(sorted(aliases, key=lambda a: (a.split(".")[0] != top, len(a), a))[0])
    return _dotted(layout, rel, qualname)


def _module(layout: Layout, rel: str) -> str:
    if layout.import_root and rel.startswith(layout.import_root + "/"):
        rel = rel[len(layout.import_root) + 1 :]
    mod = rel.removesuffix(".py").replace("/", ".")
    return mod.removesuffix(".__init__")


def _dotted(layout: Layout, rel: str, qualname: str) -> str:
    return _drop_dunder(f"{_module(layout, rel)}.{qualname.split('.<locals>')[0]}")


def _drop_dunder(name: str) -> str:
    """toolz.curry.__call__ -> toolz.curry: users call the object, not the method."""
    head, _, last = name.rpartition(".")
    return head if head and last.startswith("__") and last.endswith("__") else name


# -- cache and files ------------------------------------------------------------------------------------


def _cached_report(out: Path, key: str) -> dict | None:
    path = out / "report.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if report.get("cache_key") != key:
        return None
    if not all((out / f).exists() for f in report.get("files", [])):
        return None
    return report
