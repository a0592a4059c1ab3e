"""Which tests a twin can copy and break: a helper defined inside a test does not end the test early."""

from __future__ import annotations

import ast
import random
from collections import Counter

from swe_megatron.grading import canaries

SOURCE = """\
def test_nested_helper_returns():
    def helper(x):
        return x + 1

    class Box:
        def get(self):
            yield 1

    key = lambda v: v
    assert helper(key(1)) == 2


def test_own_return():
    if True:
        return
    assert 1 + 1 == 2


def test_own_yield():
    yield
    assert 1 + 1 == 2
"""


def test_a_return_inside_a_nested_function_or_class_does_not_make_a_test_unbreakable():
    """boltons-0000 and cachetools-0003: the last assertion follows a nested def's `return`; their twins were
    stand-ins (copies of another test) only because of it, which a rewrite sparing near copies of other
    tests could tell apart (test_runner_tampering's stand-in attack). A `return` or `yield` of the test's own
    body still keeps it unbroken (the assertion may not run)."""
    defs = canaries._test_defs(ast.parse(SOURCE), SOURCE.splitlines(True))
    sites = {name: [s.value for s in d.sites] for (_, name), d in defs.items()}
    assert sites == {"test_nested_helper_returns": [2], "test_own_return": [], "test_own_yield": []}


BLOCK = """\
from lib import f, g


def test_g_still_works():
    assert g(1) == 1


def test_f_new_case():
    assert f(3) == 5


def test_g_other_case():
    assert g(2) == 2
"""


def test_the_real_failing_test_is_anywhere_in_its_block_alike():
    """The real failing test, its decoy and its four twins form one block of failing tests; a rewrite that flips
    only the k-th of each such block wins when the real test is k-th. How many companions go before it is drawn
    uniformly, so each rank comes 1 in 6 (a coin per companion made it binomial: the middle ranks 5 in 16 each,
    the first 1 in 32, which is how the position rewrite resolved toolz-0001 and boltons-0002)."""
    f2p = ["t.py::test_f_new_case"]
    ids = [*f2p, "t.py::test_g_still_works", "t.py::test_g_other_case"]
    ranks = Counter()
    for seed in range(1200):
        c = canaries.plant("t.py", BLOCK, ids, random.Random(seed), fail_to_pass=f2p)
        names = [n.name for n in ast.parse(c.text).body if isinstance(n, ast.FunctionDef)]
        real = c.renamed[f2p[0]].split("::")[-1]
        failing = [n for n in names if n == real or c.expected.get(f"t.py::{n}") == "FAILED"]
        assert len(failing) == canaries.MUST_FAIL + 2
        at = names.index(failing[0])
        assert names[at : at + len(failing)] == failing  # one block, nothing between
        ranks[failing.index(real)] += 1
    assert sorted(ranks) == list(range(canaries.MUST_FAIL + 2))
    assert all(150 <= n <= 250 for n in ranks.values()), ranks  # 200 expected each; binomial: 37 / 187 / 375
