"""Mutation operators on small snippets: what each produces, where it may not act, and seeded order."""

from __future__ import annotations

import ast

import pytest

from swe_megatron.tasks.factory.mutate import OPERATORS, apply_mutation, find_mutations, order_mutations

SNIPPET = '''\
import functools

LIMIT = 10 + 1  # module level: runs at import, never mutated


@functools.lru_cache(maxsize=128)
def window(seq, n=2, *, strict=False):
    """Docstring with 3 numbers: 1 2."""
    if n < 1 or not seq:
        raise ValueError("n must be >= 1")
    out = []
    for i in range(0, len(seq) - n + 1):
        if i > 100:
            break
        out.append(tuple(seq[i : i + n]))
        total = i * 2
        total += n
    assert n >= 1, "never"
    return max(out, default=None) if strict else out


class Box:
    size = 3 * 4

    def grow(self, by):
        self.size = self.size + by
        return self.size is not None and True
'''


def mutations_by_operator(source: str, **kw) -> dict[str, list[tuple[str, str, int]]]:
    out: dict[str, list] = {}
    for m in find_mutations(source, "m.py", **kw):
        out.setdefault(m.operator, []).append((m.original, m.replacement, m.line))
    return out


def test_each_operator_acts_inside_function_bodies_only():
    found = mutations_by_operator(SNIPPET)
    assert set(found) == set(OPERATORS)
    assert ("<", "<=", 9) in found["comparison"]
    assert ("is not", "is", 27) in found["comparison"]
    assert ("or", "and", 9) in found["boolean_operator"]
    assert ("and", "or", 27) in found["boolean_operator"]
    assert found["drop_not"] == [("not ", "", 9)]
    assert ("i > 100", "not (i > 100)", 13) in found["negate_condition"]
    assert ("-", "+", 12) in found["binary_operator"] and ("+", "-", 26) in found["binary_operator"]
    assert ("*", "/", 16) in found["binary_operator"]
    assert ("0", "1", 12) in found["constant_off_by_one"]
    assert {("2", "1", 16), ("2", "3", 16)} <= set(found["constant_off_by_one"])
    assert found["boolean_constant"] == [("True", "False", 27)]
    assert ("0, len(seq) - n + 1", "len(seq) - n + 1, 0", 12) in found["swap_arguments"]
    assert found["augmented_assignment"] == [("+=", "-=", 17)]
    assert found["min_max"] == [("max", "min", 19)]
    assert found["break_continue"] == [("break", "continue", 14)]
    lines = {line for ms in found.values() for _, _, line in ms}
    # Not: module level (3), decorator (6), defaults (7), docstring (8), raise (10), assert (18), class body (23).
    assert not lines & {3, 6, 7, 8, 10, 18, 23}


def test_mutants_compile_differ_and_touch_one_span():
    for m in find_mutations(SNIPPET, "m.py"):
        mutant = apply_mutation(SNIPPET, m)
        assert mutant != SNIPPET
        ast.parse(mutant)
        before, after = SNIPPET.splitlines(), mutant.splitlines()
        assert len(before) == len(after)
        assert sum(a != b for a, b in zip(before, after)) == 1, m


def test_functions_are_selected_by_first_line_decorators_included():
    # window's code object starts at its decorator (line 6); grow is at line 25.
    only_window = find_mutations(SNIPPET, "m.py", functions={6})
    assert only_window and {m.function for m in only_window} == {"window"}
    assert {m.function_line for m in find_mutations(SNIPPET, "m.py", functions={25})} == {25}
    assert find_mutations(SNIPPET, "m.py", functions={7}) == []
    assert {m.function for m in find_mutations(SNIPPET, "m.py")} == {"window", "Box.grow"}


def test_nested_functions_and_handlers():
    src = (
        "def outer(x):\n"
        "    def inner(y):\n"
        "        return y + 1\n"
        "    try:\n"
        "        return inner(x)\n"
        "    except KeyError:\n"
        "        return x - 1\n"
    )
    found = {(m.function, m.original, m.replacement) for m in find_mutations(src, "n.py")}
    assert ("outer.<locals>.inner", "+", "-") in found
    assert ("outer", "-", "+") in found  # inside the except handler


def test_non_ascii_source_offsets():
    src = 'def f(s):\n    t = "ünïcödé"; return len(s) < 3\n'
    (m,) = [m for m in find_mutations(src, "u.py") if m.operator == "comparison"]
    assert apply_mutation(src, m) == 'def f(s):\n    t = "ünïcödé"; return len(s) <= 3\n'


def test_apply_refuses_a_mutation_for_other_source():
    (m, *_) = find_mutations("def f(a):\n    return a + 1\n", "x.py")
    with pytest.raises(ValueError, match="does not hold"):
        apply_mutation("def f(a):\n    return a * 1\n", m)


def test_string_concatenation_and_formatting_are_left_alone():
    src = 'def f(a):\n    return "x" + a + ("%s" % a)\n'
    assert [m for m in find_mutations(src, "s.py") if m.operator == "binary_operator"] == []


def test_seeded_order_is_deterministic_and_spreads():
    ms = find_mutations(SNIPPET, "m.py")
    a, b = order_mutations(ms, seed=7), order_mutations(list(reversed(ms)), seed=7)
    assert a == b and sorted(a) == sorted(ms)
    assert order_mutations(ms, seed=8) != a
    # The first two candidates come from different functions, and early ones mix operators.
    assert a[0].function != a[1].function
    assert len({m.operator for m in a[:8]}) >= 6
