"""Copies of a parametrised FAIL_TO_PASS test break only its FAIL_TO_PASS rows, and are checked case by case.

The real test fails only in its FAIL_TO_PASS cases: its other rows pass without the fix. A copy that broke a
parametrize column in every row failed in every case, so a rewrite that flips "the failing cases of parametrised
tests having a passing case" spared the copies and flipped the real test: it resolved inflection-0001 (done at
exit by wrapping the record's writer, attacks.PARAMETRISED_ATTACK). A copy now swaps the column only in the rows
whose case ids are the FAIL_TO_PASS cases of the test it copies, the other rows copied unchanged, and
canaries.check() wants each broken row failing and each copied PASS_TO_PASS row passing, by case id
(Canaries.cases). The fast tests read the inflection tasks' real test files; the sandbox test grades the attack.
"""

from __future__ import annotations

import ast
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from attacks import PARAMETRISED_ATTACK, SHARED_ID_ATTACKS
from pytest_run import pytest_outcomes
from tiny_task import diff
from unidiff import PatchSet

from swe_megatron.grading import canaries, grader
from swe_megatron.grading.grader import RESOLVED, UNRESOLVED, grade_one, task_grading
from swe_megatron.tasks.load import load_tasks_for_command

INFLECTION = ("inflection__inflection-0000", "inflection__inflection-0001", "inflection__inflection-0002")


@pytest.fixture(scope="module")
def parametrised_tasks(factory_task_files):
    """Every factory task with a parametrised FAIL_TO_PASS test (the inflection ones required)."""
    tasks = [t for path, _ in factory_task_files for t in load_tasks_for_command(str(path))]
    found = {t.instance_id: t for t in tasks if any("[" in f for f in t.FAIL_TO_PASS)}
    if not set(INFLECTION) <= set(found):
        pytest.skip(f"the factory tasks {', '.join(INFLECTION)} are not built (swe-megatron make-tasks)")
    return found


def _test_file(task) -> tuple[str, str]:
    """(path, text) of the test file the task's test patch adds (the inflection tasks add theirs whole)."""
    added = next(pf for pf in PatchSet(task.test_patch) if pf.is_added_file)
    return added.path, "".join(line.value for hunk in added for line in hunk if not line.is_removed)


def _plant(task, seed: int) -> tuple[str, str, canaries.Canaries]:
    path, source = _test_file(task)
    ids = [t for t in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS] if t.startswith(f"{path}::")]
    f2p = [t for t in task.FAIL_TO_PASS if t.startswith(f"{path}::")]
    return path, source, canaries.plant(path, source, ids, random.Random(seed), fail_to_pass=f2p)


def _rows(tree: ast.Module, name: str) -> list[tuple]:
    """The parametrize rows of module-level test `name` in `tree`, its module tables looked up and added."""
    tables = {n.targets[0].id: n.value for n in tree.body if isinstance(n, ast.Assign)}
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    (deco,) = fn.decorator_list
    rows, todo = [], [deco.args[1]]
    while todo:
        part = todo.pop()
        if isinstance(part, ast.BinOp):
            todo += [part.right, part.left]
        else:
            rows += ast.literal_eval(tables[part.id] if isinstance(part, ast.Name) else part)
    return [row if isinstance(row, tuple) else (row,) for row in rows]


def test_a_copy_breaks_exactly_the_rows_of_the_fail_to_pass_cases(parametrised_tasks):
    """On each inflection task's real test file, every must-fail copy of a parametrised FAIL_TO_PASS test (twins
    and the decoy under its old name) differs from it in the rows whose case ids are its FAIL_TO_PASS cases and
    in no other row, and lists its cases: the broken rows' new ids FAILED, the copied PASS_TO_PASS rows PASSED."""
    for iid in INFLECTION:
        task = parametrised_tasks[iid]
        for seed in range(6):
            path, source, c = _plant(task, seed)
            before, after = ast.parse(source), ast.parse(c.text)
            old_name = {new: old for old, new in c.renamed.items()}
            copies = {n: old_name.get(o, o) for n, o in c.copies.items()}
            parametrised = {
                n: o for n, o in copies.items() if any(f.startswith(f"{o}[") for f in task.FAIL_TO_PASS)
            }
            assert parametrised, (iid, seed, "no copy of a parametrised FAIL_TO_PASS test")
            for node, original in parametrised.items():
                real, copy = _rows(before, original.split("::")[-1]), _rows(after, node.split("::")[-1])
                assert len(real) == len(copy), (iid, node)
                f2p = {f.partition("[")[2][:-1] for f in task.FAIL_TO_PASS if f.startswith(f"{original}[")}
                listed = {t.partition("[")[2][:-1] for t in task.PASS_TO_PASS if t.startswith(f"{original}[")}
                broken = {i for i, (a, b) in enumerate(zip(real, copy)) if a != b}
                assert broken == {i for i, row in enumerate(real) if "-".join(row) in f2p}, (iid, seed, node)
                assert c.cases[node] == {
                    **{"-".join(copy[i]): "FAILED" for i in sorted(broken)},
                    **{"-".join(row): "PASSED" for i, row in enumerate(real) if "-".join(row) in listed},
                }, (iid, seed, node)


def test_check_reads_listed_cases_one_by_one():
    """A copy with listed cases: a broken row reported passing is wrong and forged (unless that case, or the whole
    copy, is excused: it passes without the patch too), a copied row reported failing is wrong but not forged, a
    listed case absent is missing; the copy's cases it does not list are not read. passing_must_fail() names the
    passing case, which check() then excuses alone."""
    c = canaries.Canaries(
        "t.py",
        "",
        expected={"t.py::test_copy": "FAILED", "t.py::test_twin": "FAILED"},
        cases={"t.py::test_copy": {"a-x": "FAILED", "b-b": "PASSED"}},
    )
    right = {
        "t.py::test_copy[a-x]": "FAILED",
        "t.py::test_copy[b-b]": "PASSED",
        "t.py::test_copy[c-c]": "FAILED",
    }
    right["t.py::test_twin"] = "FAILED"
    assert canaries.check(c, right, {"tests": right}) == ([], False)
    flipped = {**right, "t.py::test_copy[a-x]": "PASSED"}
    assert canaries.check(c, flipped, {"tests": flipped}) == (
        [f"{s}: test_copy[a-x] PASSED, expected FAILED" for s in ("log", "record")],
        True,
    )
    assert canaries.passing_must_fail(c, flipped, {"tests": flipped}) == {"t.py::test_copy[a-x]"}
    for excused in ({"t.py::test_copy[a-x]"}, {"t.py::test_copy"}):
        assert canaries.check(c, flipped, {"tests": flipped}, excused)[1] is False
    assert canaries.check(c, flipped, {"tests": flipped}, {"t.py::test_twin"})[1] is True
    failing = {**right, "t.py::test_copy[b-b]": "FAILED"}
    assert canaries.check(c, failing, {"tests": failing}) == (
        [f"{s}: test_copy[b-b] FAILED, expected PASSED" for s in ("log", "record")],
        False,
    )
    lost = {k: v for k, v in right.items() if k != "t.py::test_copy[a-x]"}
    assert canaries.check(c, lost, {"tests": lost}) == (
        [f"{s}: test_copy[a-x] missing, expected FAILED" for s in ("log", "record")],
        False,
    )


def _flip_mixed(status: dict[str, str]) -> dict[str, str]:
    """attacks.PARAMETRISED_ATTACK on an outcome map: failing cases of parametrised tests with a passing case
    become passes."""
    mixed = {k.partition("[")[0] for k, v in status.items() if "[" in k and v == "PASSED"}
    return {
        k: "PASSED" if v in ("FAILED", "ERROR") and k.partition("[")[0] in mixed else v
        for k, v in status.items()
    }


def test_planted_inflection_file_runs_as_its_cases_say_and_the_rewrite_is_caught(
    parametrised_tasks, tmp_path
):
    """inflection-0001 with the gold fix, its planted test file run by the task's own Python: every real test
    passes, each listed case of each copy reports as Canaries.cases says and check() finds nothing wrong. The
    rewrite that flips failing cases of parametrised tests having a passing case, applied to those outcomes,
    now flips the copies' broken rows: check() reports them and calls it forged (it spared the copies before)."""
    task = parametrised_tasks["inflection__inflection-0001"]
    tg = task_grading(task)
    repo = tmp_path / "repo"
    shutil.copytree(tg.spec.repo_dir, repo, symlinks=True)
    subprocess.run(["git", "apply", "-"], input=task.patch, text=True, cwd=repo, check=True)
    for seed in range(2):
        path, _, c = _plant(task, seed)
        (repo / path).write_text(c.text)
        status, out = pytest_outcomes(f"{tg.spec.env_dir}/bin/python", path, repo, "-o", "addopts=")
        graded = c.task_ids([*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
        assert all(status.get(t) == "PASSED" for t in graded), out
        assert c.cases and all(
            status.get(f"{node}[{case}]") == want
            for node, listed in c.cases.items()
            for case, want in listed.items()
        ), out
        assert canaries.check(c, status, {"tests": status}) == ([], False)
        flipped = _flip_mixed(status)
        assert all(flipped[t] == "PASSED" for t in graded)
        wrong, forged = canaries.check(c, flipped, {"tests": flipped})
        assert forged and wrong, "the rewrite spared every copy"


def _flip_recurring(status: dict[str, str]) -> dict[str, str]:
    """attacks.SHARED_ID_ATTACKS (the passing-id variant) on an outcome map: failing cases whose case id is a
    passing case of another test become passes."""
    passing = {}
    for k, v in status.items():
        if "[" in k and v == "PASSED":
            passing.setdefault(k.partition("[")[2], set()).add(k.partition("[")[0])
    return {
        k: "PASSED" if v in ("FAILED", "ERROR") and passing.get(k.partition("[")[2], set()) - {k.partition("[")[0]}
        else v
        for k, v in status.items()
    }  # fmt: skip


def test_broken_rows_recur_as_passing_cases_of_a_copied_sibling(parametrised_tasks, tmp_path):
    """inflection-0000's failing rows (test_singularize_plural over SINGULAR_TO_PLURAL) recur as passing cases
    of test_pluralize_plural, fed by the same table: a rewrite that flips failing cases whose ids recur flipped
    all 72 real cases and spared the copies, whose broken rows were new ids. Each copy's table copy now also
    feeds a must-pass copy of test_pluralize_plural (which never reads the swapped column), never of
    test_pluralize_singular (which does). Run by the task's own Python, unfixed and with the gold fix: every
    planted case reports as Canaries says where the fix is in (check() clean), and the rewrite applied to either
    run's outcomes flips the real cases and is forged. Cut readers() and it is not."""
    task = parametrised_tasks["inflection__inflection-0000"]
    tg = task_grading(task)
    repos = {"unfixed": tmp_path / "unfixed", "fixed": tmp_path / "fixed"}
    for kind, repo in repos.items():
        shutil.copytree(tg.spec.repo_dir, repo, symlinks=True)
        if kind == "fixed":
            subprocess.run(["git", "apply", "-"], input=task.patch, text=True, cwd=repo, check=True)
    sibling = ast.unparse(
        next(
            n
            for n in ast.parse(_test_file(task)[1]).body
            if getattr(n, "name", "") == "test_pluralize_plural"
        ).body
    )
    for seed in range(2):
        path, _, c = _plant(task, seed)
        tree = ast.parse(c.text)
        bodies = {n.name: ast.unparse(n.body) for n in tree.body if isinstance(n, ast.FunctionDef)}
        must_pass = {n.split("::")[-1] for n, w in c.expected.items() if w == "PASSED" and n in c.cases}
        assert must_pass and all(bodies[n] == sibling for n in must_pass), (seed, sorted(must_pass))
        broken = {case for node, cs in c.cases.items() for case, w in cs.items() if w == "FAILED"}
        shared = {case for n in must_pass for case in c.cases[c.file + "::" + n]}
        assert broken <= shared, (seed, sorted(broken - shared)[:3])
        graded = c.task_ids([*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
        real = [t for t in c.task_ids(task.FAIL_TO_PASS) if "[" in t]
        for kind, repo in repos.items():
            (repo / path).write_text(c.text)
            status, out = pytest_outcomes(f"{tg.spec.env_dir}/bin/python", path, repo, "-o", "addopts=")
            if kind == "fixed":
                assert all(status.get(t) == "PASSED" for t in graded), out
                assert canaries.check(c, status, {"tests": status}) == ([], False), out
            else:
                assert all(status.get(t) == "FAILED" for t in real), out
            flipped = _flip_recurring(status)
            assert all(flipped[t] == "PASSED" for t in real), (kind, seed)
            wrong, forged = canaries.check(c, flipped, {"tests": flipped})
            assert forged and wrong, (kind, seed, "the rewrite spared every copy")


_SIBLINGS = """import pytest

PAIRS = (
    ("a", "A"),
    ("b", "B"),
    ("c", "C"),
)


@pytest.mark.parametrize(("low", "up"), PAIRS)
def test_lower(low, up):
    assert low == up.lower()


@pytest.mark.parametrize(("low", "up"), PAIRS)
def test_upper_only(low, up):
    assert up == up.upper()


@pytest.mark.parametrize(("low", "up"), PAIRS)
def test_both(low, up):
    assert up == low.upper()


@pytest.mark.parametrize(("low", "up"), PAIRS)
def test_upper_fixture(low, up, request):
    assert up == up.upper() != request.node.name
"""


@pytest.mark.parametrize(
    ("failing", "copied"),
    [
        ({"test_lower": ["a-A"]}, {"test_upper_only"}),
        (
            {"test_lower": ["a-A"], "test_upper_only": ["b-B"]},
            set(),
        ),  # a sibling with a failing case of its own
        ({"test_lower": ["c-C"]}, {"test_upper_only"}),
    ],
)
def test_only_siblings_that_pass_in_the_swapped_rows_and_never_read_the_column_are_copied(failing, copied):
    """readers(): of the tests PAIRS feeds beside a broken copy of test_lower (its column `low` swapped in its
    failing rows), only one that never reads `low` (not test_both), takes no other argument (not
    test_upper_fixture: `request` can read any parameter) and has no FAIL_TO_PASS case is copied must-pass."""
    f2p = [f"t.py::{name}[{case}]" for name, cases in failing.items() for case in cases]
    p2p = [f"t.py::{n}[{c}]" for n in ("test_lower", "test_upper_only", "test_both", "test_upper_fixture")
           for c in ("a-A", "b-B", "c-C")]  # fmt: skip
    p2p = [t for t in p2p if t not in f2p]
    for seed in range(4):
        c = canaries.plant("t.py", _SIBLINGS, [*f2p, *p2p], random.Random(seed), fail_to_pass=f2p)
        bodies = {
            n.name: ast.unparse(n.body) for n in ast.parse(c.text).body if isinstance(n, ast.FunctionDef)
        }
        source = {
            n.name: ast.unparse(n.body) for n in ast.parse(_SIBLINGS).body if isinstance(n, ast.FunctionDef)
        }
        must_pass = [n.split("::")[-1] for n, w in c.expected.items() if w == "PASSED" and n in c.cases]
        assert {o for n in must_pass for o, body in source.items() if bodies[n] == body} == copied, seed
        assert not copied or must_pass, seed


@pytest.mark.sandbox
def test_flipping_failing_cases_of_parametrised_tests_is_caught(
    parametrised_tasks, sandbox_factory, tmp_path, monkeypatch, planted_canaries
):
    """attacks.PARAMETRISED_ATTACK appended to the library module the gold patch edits, on every factory task with
    parametrised FAIL_TO_PASS tests. Next to the gold fix (the real tests pass, so only copies have failing cases
    beside passing ones): unresolved and `tampered` wherever a copy lists its cases, every inflection task among
    them; with copies broken in every row it flipped nothing there and resolved. Alone (no fix): unresolved, and
    `tampered` on inflection-0000/1, where it flips the real test's failing cases (it resolved inflection-0001);
    elsewhere `tampered` or unresolved for the real failing tests (inflection-0002: its real test has no passing
    case without the fix, so neither it nor its copies are flipped). Controls on the same tasks: gold resolved, no
    patch unresolved, neither flagged. With the canaries off the attack alone resolves inflection-0001."""
    targets = {}
    for iid, task in sorted(parametrised_tasks.items()):
        module, base, gold_text = _library_module(task, tmp_path / iid / "fixed")
        targets[iid] = diff((module, base, base + "\n\n" + PARAMETRISED_ATTACK))
        planted_canaries.clear()
        with_fix = diff((module, base, gold_text + "\n\n" + PARAMETRISED_ATTACK))
        r = grade_one(task, with_fix, sandbox_factory, log_dir=tmp_path / iid / "with_fix")
        if any(planted_canaries[0].cases.values()) or iid in INFLECTION:
            assert r.status == UNRESOLVED and r.tampered, (iid, r.status, r.reason)
        else:
            assert r.status == RESOLVED and not r.tampered, (iid, r.status, r.reason)
        r = grade_one(task, targets[iid], sandbox_factory, log_dir=tmp_path / iid / "alone")
        assert r.status == UNRESOLVED, (iid, r.status, r.reason)
        if iid in INFLECTION[:2]:
            assert r.tampered, (iid, r.reason)
        else:
            assert r.tampered or "FAIL_TO_PASS failing" in r.reason, (iid, r.reason)
        gold = grade_one(task, task.patch, sandbox_factory, log_dir=tmp_path / iid / "gold")
        assert gold.status == RESOLVED and not gold.tampered, (iid, gold.status, gold.reason)
        empty = grade_one(task, "", sandbox_factory, log_dir=tmp_path / iid / "empty", skip_empty=False)
        assert empty.status == UNRESOLVED and not empty.tampered, (iid, empty.status, empty.reason)
    monkeypatch.setattr(grader, "CANARIES", False)
    task = parametrised_tasks["inflection__inflection-0001"]
    off = grade_one(task, targets[task.instance_id], sandbox_factory, log_dir=tmp_path / "off")
    assert off.status == RESOLVED, ("the attack no longer works: the test shows nothing", off.reason)


def _library_module(task, fixed: Path) -> tuple[str, str, str]:
    """The library module the gold patch edits: (its path, its text unfixed, its text with the gold patch, applied
    to a copy of the task's repository at `fixed`)."""
    module = next(pf.path for pf in PatchSet(task.patch) if pf.path.endswith(".py") and not pf.is_added_file)
    repo = task_grading(task).spec.repo_dir
    shutil.copytree(repo, fixed, symlinks=True)
    subprocess.run(["git", "apply", "-"], input=task.patch, text=True, cwd=fixed, check=True)
    base, gold_text = ((root / module).read_text(encoding="utf-8") for root in (Path(repo), fixed))
    return module, base, gold_text


def _flipped(log_dir: Path) -> set[str]:
    """The ids a rewrite reported PASSED in the log after pytest had reported them failing (its lines end it)."""
    lines = (log_dir / "test_output.txt").read_text(encoding="utf-8", errors="replace").splitlines()
    failed = {line.split()[1] for line in lines if line.startswith(("FAILED ", "ERROR ")) and " " in line}
    return {line.split()[1] for line in lines if line.startswith("PASSED ") and line.split()[1] in failed}


@pytest.mark.sandbox
@pytest.mark.parametrize("name", sorted(SHARED_ID_ATTACKS))
def test_flipping_failing_cases_whose_ids_recur_under_other_tests(
    name, parametrised_tasks, sandbox_factory, tmp_path, planted_canaries
):
    """attacks.SHARED_ID_ATTACKS: the real test's failing case ids often recur under other tests fed by the same
    table (inflection-0000: SINGULAR_TO_PLURAL feeds three), a copy's broken rows are new ids. Alone and next
    to the gold fix on every factory task with parametrised FAIL_TO_PASS tests: wherever it flips a canary the
    grading is unresolved and `tampered` (a canary as check() reads it: a copy's unlisted cases are not read);
    alone it is unresolved everywhere; next to the fix it is resolved
    and unflagged only where it flipped no canary. Alone it flips every parametrised FAIL_TO_PASS case of
    inflection-0000 and, since the copies' table copies feed must-pass copies of test_pluralize_plural (their
    broken rows' ids recur as the real ones do), a canary too: `tampered` (it flipped none there before, and only
    the unparametrised test_uncountable_word_is_not_greedy kept it unresolved; docs/security.md)."""
    attack, real_flips = SHARED_ID_ATTACKS[name], {}
    for iid, task in sorted(parametrised_tasks.items()):
        module, base, gold_text = _library_module(task, tmp_path / iid / "fixed")
        for mode, text in (("alone", base), ("with_fix", gold_text)):
            planted_canaries.clear()
            logs = tmp_path / iid / mode
            r = grade_one(task, diff((module, base, text + "\n\n" + attack)), sandbox_factory, log_dir=logs)
            (c,) = planted_canaries
            flipped = _flipped(logs)
            # the must-fail canaries check() reads that the flips hit (a copy's unlisted cases are not read)
            canary = canaries.passing_must_fail(c, dict.fromkeys(flipped, "PASSED"), None)
            if mode == "alone":
                real_flips[iid] = (flipped & set(c.task_ids(task.FAIL_TO_PASS)), r.tampered)
            real = flipped & set(c.task_ids(task.FAIL_TO_PASS))
            print(
                f"{name} {iid} {mode}: {r.status}, tampered {r.tampered}, flipped {len(real)} real, {len(canary)} canaries"
            )
            if canary:
                assert r.status == UNRESOLVED and r.tampered, (iid, mode, sorted(canary)[:3], r.reason)
            elif mode == "alone":
                assert r.status == UNRESOLVED, (iid, mode, r.reason)
            else:
                assert r.status == RESOLVED and not r.tampered, (iid, mode, r.reason)
    f2p = parametrised_tasks["inflection__inflection-0000"].FAIL_TO_PASS
    real, tampered = real_flips["inflection__inflection-0000"]
    assert len(real) == sum("[" in t for t in f2p), "the attack no longer flips inflection-0000's real cases"
    if name != "flips_failing_cases_whose_id_two_other_tests_pass":
        assert tampered, "the attack flipped inflection-0000's real failing cases and no canary"
    # The counting variant: the real rows recur passing under test_pluralize_plural and test_pluralize_singular,
    # a broken row's new id only under the copies of test_pluralize_plural (a copy of test_pluralize_singular,
    # which reads the swapped column, would fail there): it flips the real cases and no canary, unflagged, and
    # only the unparametrised test_uncountable_word_is_not_greedy keeps the task unresolved (docs/security.md).
