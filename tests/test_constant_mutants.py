"""tools/constant_mutants.py: the mutants tools/mutate.py adds for a module's top-level constants and tables."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from constant_mutants import constant_mutants  # noqa: E402

SOURCE = '''"""A module."""
import re

NAMES = frozenset({".git", "__pycache__"})
"""A table."""
LIMIT: int = 3
RATIO = 0.5
ON = True
HINT = "install x"
REASONS = {"a": "first", "b": "second"}
Alias = dict[str, int]
PATTERN = re.compile(r"^x$")
__all__ = ["f"]


def f(n):
    return n + 1
'''


def _changed(m) -> tuple[str, str]:
    return m.old, m.new


def test_each_entry_number_flag_and_string_of_a_top_level_constant_gets_one_mutant():
    got = {m.name.split("__const_")[0]: [] for m in constant_mutants(SOURCE)}
    for m in constant_mutants(SOURCE):
        got[m.name.split("__const_")[0]].append(_changed(m))
    assert got == {
        "NAMES": [('".git", ', ""), (', "__pycache__"', "")],  # entries removed, never renamed
        "LIMIT": [("3", "4")],
        "RATIO": [("0.5", "1.5")],
        "ON": [("True", "False")],
        "HINT": [('"install x"', "'XXinstall xXX'")],
        "REASONS": [
            ('"a": "first", ', ""),
            ('"first"', "'XXfirstXX'"),
            (', "b": "second"', ""),
            ('"second"', "'XXsecondXX'"),
        ],  # fmt: skip
        "PATTERN": [('r"^x$"', "'XX^x$XX'")],
    }  # a type alias, dunder names and function bodies (mutmut's) are left alone


def test_every_mutant_compiles_and_differs_only_where_it_says():
    for m in constant_mutants(SOURCE):
        compile(m.source, m.name, "exec")
        line = SOURCE.splitlines()[m.line - 1]
        assert m.old.split("\n")[0] in line, (m.name, line)
        assert len(m.source) == len(SOURCE) - len(m.old) + len(m.new)


def test_a_removal_that_would_not_parse_is_skipped_and_unicode_columns_are_handled():
    source = 'ONLY = ("x",)\nWIDE = ("é", "ü")\nONE = ["y"]\n'
    mutants = constant_mutants(source)
    assert [(m.old, m.new) for m in mutants] == [
        ('"é", ', ""),
        (', "ü"', ""),
        ('"y"', ""),
    ]  # "(,)" is skipped
    assert mutants[0].source == 'ONLY = ("x",)\nWIDE = ("ü")\nONE = ["y"]\n'


def test_the_bodies_of_functions_mutmut_skips_are_mutated_and_the_others_left_to_it():
    source = '''import functools


@functools.lru_cache(maxsize=1)
def arches():
    """Docstring."""
    return {"x86_64": ("x86", "x32")}.get("x86_64", ())


class C:
    @property
    def size(self):
        return 2

    @staticmethod
    def plain():
        return 3


def g():
    return 4
'''
    got = [(m.name.split("__const_")[0], m.old, m.new) for m in constant_mutants(source)]
    assert got == [
        ("arches", '"x86_64": ("x86", "x32")', ""),
        ("arches", '"x86", ', ""),
        ("arches", ', "x32"', ""),
        ("arches", '"x86_64"', "'XXx86_64XX'"),
        ("size", "2", "3"),
    ]  # the docstring, the lru_cache argument and staticmethod / plain functions (mutmut's) are left alone
