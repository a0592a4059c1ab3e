"""Which tests a twin can copy and break: a helper defined inside a test does not end the test early."""

from __future__ import annotations

import ast

from swe_megatron.grading import canaries

SOURCE = '''\
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
'''


def test_a_return_inside_a_nested_function_or_class_does_not_make_a_test_unbreakable():
    """boltons-0000 and cachetools-0003: the last assertion follows a nested def's `return`; their twins were
    stand-ins (copies of another test) only because of it, which a rewrite sparing near copies of other
    tests could tell apart (test_runner_tampering's stand-in attack). A `return` or `yield` of the test's own
    body still keeps it unbroken (the assertion may not run)."""
    defs = canaries._test_defs(ast.parse(SOURCE), SOURCE.splitlines(True))
    sites = {name: [s.value for s in d.sites] for (_, name), d in defs.items()}
    assert sites == {"test_nested_helper_returns": [2], "test_own_return": [], "test_own_yield": []}
