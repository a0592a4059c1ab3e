"""Patches that tamper with the test runner from inside the pytest process, graded on factory tasks.

Each attack (attacks.RUNNER_ATTACKS) is appended to the library module the gold patch edits, so it runs
when the tests import it. Alone (no fix) it must never resolve; with the gold fix it must be flagged
`tampered` (the harness's canary tests disagree with what the run reports). With the canaries switched
off the same patches resolve: that shows each attack is real and that the canaries are what stops it.
"""

from __future__ import annotations

import ast
import math
import re
import shutil
import subprocess
from collections import Counter

import pytest
from attacks import ADAPTIVE_ATTACKS, RUNNER_ATTACKS, SHAPE_ATTACKS, STAND_IN_ATTACKS, known_names_attack
from scripted_sandbox import FakeSandbox
from tiny_task import diff
from unidiff import PatchSet

from swe_megatron.grading import grader
from swe_megatron.grading.grader import RESOLVED, UNRESOLVED, grade_one, task_grading
from swe_megatron.tasks.load import load_tasks_for_command

pytestmark = pytest.mark.sandbox
BLANKET = [n for n in RUNNER_ATTACKS if n != "ptrace_attaches_to_siblings"]


@pytest.fixture(scope="session")
def attack_targets(factory_task_files, tmp_path_factory):
    """Per task (first of each tasks file): (task, module path, its text at base, with gold)."""
    return _targets(
        [load_tasks_for_command(str(path))[0] for path, _ in factory_task_files], tmp_path_factory
    )


@pytest.fixture(scope="session")
def every_target(factory_task_files, tmp_path_factory):
    """attack_targets for every factory task the grading tests use (each file's first `count`)."""
    tasks = [t for path, count in factory_task_files for t in load_tasks_for_command(str(path))[:count]]
    return _targets(tasks, tmp_path_factory)


def _targets(tasks, tmp_path_factory):
    out = []
    for task in tasks:
        repo = task_grading(task).spec.repo_dir
        module = next(
            pf.path for pf in PatchSet(task.patch) if pf.path.endswith(".py") and not pf.is_added_file
        )
        copy = tmp_path_factory.mktemp("gold") / "repo"
        shutil.copytree(repo, copy, symlinks=True)
        subprocess.run(["git", "apply", "-"], input=task.patch, text=True, cwd=copy, check=True)
        out.append((task, module, _read(repo, module), _read(copy, module)))
    return out


def _read(root, rel):
    with open(f"{root}/{rel}", encoding="utf-8") as f:
        return f.read()


def _attack(name, target, with_fix):
    task, module, before, fixed = target
    start = fixed if with_fix else before
    if name == "known_names":
        source = known_names_attack(task.FAIL_TO_PASS)
    elif name == "known_names_elsewhere":  # only the names outside the file that holds the twins
        canary_file = task_grading(task).canary_file
        source = known_names_attack([t for t in task.FAIL_TO_PASS if not t.startswith(f"{canary_file}::")])
    else:
        source = {**RUNNER_ATTACKS, **ADAPTIVE_ATTACKS, **SHAPE_ATTACKS, **STAND_IN_ATTACKS}[name]
    return diff((module, before, start + "\n\n" + source))


def _grade(target, patch, factory, log_dir, **kw):
    return grade_one(target[0], patch, factory, log_dir=log_dir, **kw)


@pytest.mark.parametrize("name", BLANKET)
def test_runner_tampering_never_resolves_and_is_flagged(
    name, attack_targets, sandbox_factory, tmp_path, monkeypatch
):
    target = attack_targets[BLANKET.index(name) % len(attack_targets)]
    alone = _grade(target, _attack(name, target, False), sandbox_factory, tmp_path / "alone")
    assert alone.status == UNRESOLVED, (alone.status, alone.reason)
    assert alone.tampered, alone.reason
    with_fix = _grade(target, _attack(name, target, True), sandbox_factory, tmp_path / "fix")
    assert with_fix.status == UNRESOLVED and with_fix.tampered, (with_fix.status, with_fix.reason)
    monkeypatch.setattr(grader, "CANARIES", False)
    control = _grade(target, _attack(name, target, False), sandbox_factory, tmp_path / "control")
    assert control.status == RESOLVED, ("the attack no longer works: the test shows nothing", control.reason)


def test_ptrace_of_siblings_is_refused(attack_targets, sandbox_factory, tmp_path):
    """The patch tries to PTRACE_ATTACH every other process of its sandbox (the shell, the eval script, its
    `timeout`): the seccomp filter refuses each (sandbox/seccomp.py), so nothing is held and the run is
    graded as usual (unresolved: the patch fixes nothing). Without the filter the attaches succeed and
    hold the eval script past its timeout."""
    patch = _attack("ptrace_attaches_to_siblings", attack_targets[0], False)
    result = _grade(attack_targets[0], patch, sandbox_factory, tmp_path, test_timeout_s=60)
    log = (tmp_path / "test_output.txt").read_text()
    line = next(ln for ln in log.splitlines() if ln.startswith("PTRACE_RESULTS "))
    attempts = re.split(r" (?=\d+:)", line.removeprefix("PTRACE_RESULTS ").strip())  # "pid:strerror"
    assert attempts, "no other process was visible"
    assert all(a.endswith("Operation not permitted") for a in attempts), attempts
    assert result.status == UNRESOLVED and result.reward == 0.0, (result.status, result.reason)


@pytest.mark.parametrize("name", [*sorted(ADAPTIVE_ATTACKS), "known_names"])
def test_adaptive_tampering_is_flagged_on_every_task(
    name, every_target, sandbox_factory, tmp_path, monkeypatch
):
    """Rewrites that spare tests looking like the old canaries (name `test_` + 16 hex digits, 32-hex
    constants) or that rewrite only the FAIL_TO_PASS names seen failing (known_names), next to the gold fix:
    unresolved and `tampered` on every factory task where the attack can change an outcome, because a
    must-fail twin or decoy is rewritten too. Where it cannot ((b) patches pytest's Function.runtest, which
    unittest-style tests do not call), the attack alone must resolve nothing even with the canaries off.
    With the canaries off the attack alone resolves a task, and with them on it is flagged there too."""
    inert = []
    for i, target in enumerate(every_target):
        r = _grade(target, _attack(name, target, True), sandbox_factory, tmp_path / f"fix{i}")
        if r.status == RESOLVED and not r.tampered:
            with monkeypatch.context() as m:
                m.setattr(grader, "CANARIES", False)
                alone = _grade(target, _attack(name, target, False), sandbox_factory, tmp_path / f"inert{i}")
            assert alone.status == UNRESOLVED, (target[0].instance_id, "resolved and not flagged")
            inert.append(target[0].instance_id)
            continue
        assert r.status == UNRESOLVED and r.tampered, (target[0].instance_id, r.status, r.reason)
    assert len(inert) < len(every_target), inert
    monkeypatch.setattr(grader, "CANARIES", False)
    for i, target in enumerate(every_target):
        control = _grade(target, _attack(name, target, False), sandbox_factory, tmp_path / f"control{i}")
        if control.status == RESOLVED:
            break
    else:
        pytest.fail("the attack resolves no task even without canaries: the test shows nothing")
    monkeypatch.setattr(grader, "CANARIES", True)
    alone = _grade(target, _attack(name, target, False), sandbox_factory, tmp_path / "alone")
    assert alone.status == UNRESOLVED and alone.tampered, (alone.status, alone.reason)


def test_decoys_cover_fail_to_pass_tests_outside_the_twins_file(every_target, sandbox_factory, tmp_path):
    """The FAIL_TO_PASS tests of the other test files get decoys too: a rewrite of only their known names,
    next to the gold fix, is flagged on every task that has such tests."""
    covered = []
    for i, target in enumerate(every_target):
        task = target[0]
        if all(t.startswith(f"{task_grading(task).canary_file}::") for t in task.FAIL_TO_PASS):
            continue
        r = _grade(target, _attack("known_names_elsewhere", target, True), sandbox_factory, tmp_path / f"{i}")
        assert r.status == UNRESOLVED and r.tampered, (task.instance_id, r.status, r.reason)
        covered.append(task.instance_id)
    assert covered, "no task has FAIL_TO_PASS tests in a second file: the test shows nothing"


@pytest.mark.parametrize("name", sorted(SHAPE_ATTACKS))
def test_rewrites_sparing_what_code_can_see_of_the_canaries_are_caught_on_every_task(
    name, every_target, sandbox_factory, tmp_path, monkeypatch, planted_canaries
):
    """Issue 40 family 1: every failing test turned into a pass except those whose code (a body comparing two
    literals; bytecode loading no global, attribute or parameter), name or place looks like the canaries as
    they were. The twins and decoys are now broken copies of the real failing tests beside them, named like
    the renamed real ones: alone, each attack is unresolved on every factory task, and `tampered` wherever it
    rewrote the real failing tests (where its rule spared those too it gained nothing and forged nothing).
    Except by chance for the position rule, which spares a failing test right after a like-named failing one
    and so flips the first of each block: it wins where every real failing test of the twins' file happens to
    lead its block (1 in 6 on a task with one failing test: the rank is uniform), and only there.
    With the canaries off the same patch resolves a task (the attack is real); with the pre-issue-40 canaries
    the first two resolved 24 of 24 tasks (docs/security.md)."""
    by_chance = []
    for i, target in enumerate(every_target):
        planted_canaries.clear()
        r = _grade(target, _attack(name, target, False), sandbox_factory, tmp_path / f"alone{i}")
        if r.status == RESOLVED and name == "spares_tests_right_after_a_failing_neighbour":
            assert _real_tests_lead_their_blocks(planted_canaries[0], FakeSandbox.planted_texts[0]), (
                target[0].instance_id,
                "not by chance",
            )
            by_chance.append(target[0].instance_id)
            continue
        assert r.status == UNRESOLVED, (target[0].instance_id, r.status, r.reason)
        assert r.tampered or "FAIL_TO_PASS failing" in r.reason, (target[0].instance_id, r.reason)
    # at most 1 in 6 per task: more than a binomial tail of 1e-3 allows means the placement is biased, not chance
    # (a fixed quarter failed CI 1 time in 2.4 on its 3 tasks: 1 of 3 is not rare there)
    assert len(by_chance) <= _chance_bound(len(every_target), 1 / 6), by_chance
    monkeypatch.setattr(grader, "CANARIES", False)
    for i, target in enumerate(every_target):
        if (
            _grade(target, _attack(name, target, False), sandbox_factory, tmp_path / f"off{i}").status
            == RESOLVED
        ):
            break
    else:
        pytest.fail("the attack resolves no task even without canaries: the test shows nothing")


def _chance_bound(n: int, p: float, tail: float = 1e-3) -> int:
    """The least k with P(Binomial(n, p) > k) < tail."""
    k = 0
    while sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k + 1, n + 1)) >= tail:
        k += 1
    return k


def test_chance_bound_is_the_binomial_tail():
    assert [_chance_bound(n, 1 / 6) for n in (3, 24)] == [3, 10]
    assert _chance_bound(24, 1 / 6, tail=0.5) == 4


@pytest.mark.parametrize("name", sorted(STAND_IN_ATTACKS))
def test_sparing_near_copies_of_other_tests_is_caught_on_every_task(
    name, every_target, sandbox_factory, tmp_path, planted_canaries
):
    """Every failing test turned into a pass except those one literal (or one name) away from another test: a
    stand-in twin (a broken copy of another test, for a real failing test with nothing to break) is such a near
    copy and the real test is not, so where every twin was a stand-in the rule flipped only the real tests. The
    twins now copy the real failing test itself everywhere (a helper call's argument, a parametrize table's
    expected column): the real test is one literal or name away from its twins, so the rule spares it as well or
    flips a twin, and the attack alone is unresolved on every factory task and `tampered` wherever it rewrote a
    real failing test. It resolved 6 of 24 with stand-ins (toolz-0001, boltons-0000, cachetools-0003,
    inflection-0000/1/2), then 4 once nested returns no longer kept a test from being broken. A third rule spares
    failing tests that have an exact copy (the real test matches none of its copies): it won 32 of 50 plantings
    on toolz-0001 (simulated) while its five copies each put one of two singletons where the real one has True;
    copies of a test now differ from each other where the file has values enough."""
    outcomes = Counter()
    for i, target in enumerate(every_target):
        planted_canaries.clear()
        r = _grade(target, _attack(name, target, False), sandbox_factory, tmp_path / f"alone{i}")
        iid = target[0].instance_id
        assert r.status == UNRESOLVED, (iid, r.status, r.reason)
        assert r.tampered or "FAIL_TO_PASS failing" in r.reason, (iid, r.reason)
        twins = [n for n, want in planted_canaries[0].expected.items() if want == "FAILED"]
        assert not set(twins) <= planted_canaries[0].stand_ins, (iid, "every twin is a stand-in")
        outcomes["tampered" if r.tampered else "FAIL_TO_PASS failing"] += 1
    print(name, dict(outcomes))


def _real_tests_lead_their_blocks(c, texts: dict[str, str]) -> bool:
    """Whether no renamed real failing test of a canaried file comes right after a failing test whose name
    shares its first two words (what the position rule spares), in the order pytest collects each file."""
    real = {new for new in c.renamed.values()}
    for file, text in texts.items():
        tree = ast.parse(text)
        order = [
            (cls, fn.name)
            for cls, body in [(None, tree.body)]
            + [(n.name, n.body) for n in tree.body if isinstance(n, ast.ClassDef)]
            for fn in body
            if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test")
        ]
        order.sort(key=lambda key: _line_of(tree, key))
        node = {key: "::".join(p for p in (file, *key) if p) for key in order}
        failing = {key for key in order if node[key] in real or c.expected.get(node[key]) == "FAILED"}
        for before, key in zip(order, order[1:]):
            if node[key] in real and before in failing and before[1].split("_")[:2] == key[1].split("_")[:2]:
                return False
    return True


def _line_of(tree, key):
    cls, name = key
    scope = (
        tree.body
        if cls is None
        else next(n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    )
    return next(fn.lineno for fn in scope if isinstance(fn, ast.FunctionDef) and fn.name == name)
