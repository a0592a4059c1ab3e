"""A copy of a parametrised test lists its cases by id (Canaries.cases), so the builder must name each row's case
as pytest does, and give up (None: every row broken, checked per test) wherever pytest would not name it from the
row's values alone. The ids are checked against pytest's own collection of the same file."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from swe_megatron.grading.canaries import _Column, _id_part, _row_ids

SOURCE = '''import pytest


@pytest.mark.parametrize("a", ["x", "\\u00e9t\\u00e9", 1, 2.5, True, None, "with space"])
def test_values(a):
    pass


@pytest.mark.parametrize(("a", "b"), [("p", 1), ["q", None]])
def test_pairs(a, b):
    pass


@pytest.mark.parametrize("a, b", [("a-b", "c"), ("a", "b-c")])
def test_joined_ids_alike(a, b):
    pass


@pytest.mark.parametrize("a", ["dup", "dup"])
def test_duplicates(a):
    pass


@pytest.mark.parametrize("a", ["x"], ids=["named"])
def test_explicit_ids(a):
    pass


@pytest.mark.parametrize("a", ["x"])
@pytest.mark.parametrize("b", ["y"])
def test_two_decorators(a, b):
    pass


@pytest.mark.parametrize("a", [len("x")])
def test_an_expression(a):
    pass


@pytest.mark.parametrize("a", ["""two
lines"""])
def test_a_multiline_string(a):
    pass


@pytest.mark.parametrize("a, b", [pytest.param("p", 1)])
def test_a_param_row(a, b):
    pass
'''

DERIVED = ("test_values", "test_pairs")
"""Where pytest names every case from its values alone (the others: counters, explicit ids, two decorators, an
expression, a multi-line string, a pytest.param row)."""


def _parametrize(fn: ast.FunctionDef) -> tuple[ast.Call, list[str], list[ast.expr]]:
    deco = next(d for d in fn.decorator_list if "parametrize" in ast.unparse(d))
    names = ast.literal_eval(deco.args[0])
    argnames = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    return deco, argnames, list(deco.args[1].elts)


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> dict[str, list[str]]:
    """Test name -> the case ids pytest collects from SOURCE, in order."""
    path = tmp_path_factory.mktemp("ids") / "test_ids.py"
    path.write_text(SOURCE, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=", str(path)],
        cwd=path.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out: dict[str, list[str]] = {}
    for line in run.stdout.splitlines():
        node = line.partition("::")[2]
        if "[" in node:
            name, _, case = node.partition("[")
            out.setdefault(name, []).append(case[:-1])
    assert set(out) >= set(DERIVED), run.stdout + run.stderr
    return out


@pytest.mark.parametrize("name", [n.name for n in ast.parse(SOURCE).body if isinstance(n, ast.FunctionDef)])
def test_row_ids_are_pytests_case_ids_or_none_where_pytest_does_not_make_them_from_values(name, collected):
    fn = next(n for n in ast.parse(SOURCE).body if isinstance(n, ast.FunctionDef) and n.name == name)
    deco, argnames, rows = _parametrize(fn)
    ids = _row_ids(fn, deco, argnames, rows)
    if name in DERIVED:
        assert ids is not None and ["-".join(parts) for parts in ids] == collected[name]
    else:
        assert ids is None, (name, ids, collected.get(name))


def test_a_swapped_value_names_its_case_as_pytest_would(collected):
    """_Column.case_id: the row's id with this column's part replaced by the new value's (None where pytest would
    not name the value by itself)."""
    fn = next(n for n in ast.parse(SOURCE).body if isinstance(n, ast.FunctionDef) and n.name == "test_pairs")
    ids = _row_ids(fn, *_parametrize(fn))
    column = _Column((), (), (), ids, 1)
    assert [column.case_id(r) for r in range(2)] == collected["test_pairs"]
    assert column.case_id(0, 7, swapped=True) == "p-7"
    assert column.case_id(1, None, swapped=True) == "q-None"
    assert column.case_id(0, ("not", "a scalar"), swapped=True) is None
    assert _Column((), (), (), None, 0).case_id(0) is None


def test_id_part_is_pytests_id_of_a_scalar():
    assert [_id_part(v) for v in ("x", "\u00e9", 3, 2.5, False, None)] == [
        "x",
        "\\xe9",
        "3",
        "2.5",
        "False",
        "None",
    ]
    assert _id_part(b"bytes") is None and _id_part(("a",)) is None
