"""The factory's pytest runs (suite.py + probe_plugin.py) on a tiny library, without network: outcomes,
the call trace that decides which tests cover which function, selection, and the per-test time limit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from swe_megatron.tasks.factory.suite import find_layout, run_tests

LIB = {
    "src/tiny/__init__.py": "from tiny.core import add, mean\n",
    "src/tiny/core.py": (
        "def _total(xs):\n"
        "    return sum(xs)\n"
        "\n\n"
        "def mean(xs):\n"
        "    return _total(xs) / len(xs)\n"
        "\n\n"
        "def add(a, b):\n"
        "    return a + b\n"
        "\n\n"
        "def spin():\n"
        "    while True:\n"
        "        pass\n"
    ),
    "tests/test_core.py": (
        "from tiny import add, mean\n"
        "from tiny.core import spin\n"
        "\n\n"
        "def test_add():\n"
        "    assert add(1, 2) == 3\n"
        "\n\n"
        "def test_mean():\n"
        "    assert mean([1, 2, 3]) == 2\n"
        "\n\n"
        "def test_wrong():\n"
        "    assert add(1, 1) == 3\n"
        "\n\n"
        "def test_spin():\n"
        "    spin()\n"
    ),
}


@pytest.fixture
def tiny(tmp_path):
    tree = tmp_path / "tiny-1.0"
    for rel, text in LIB.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    # An "environment" whose python is this interpreter (it has pytest); make-tasks builds real venvs.
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    return tree, env


def test_outcomes_trace_and_public_names(tiny):
    tree, env = tiny
    layout = find_layout(tree)
    assert layout.test_files == ["tests/test_core.py"] and layout.import_root == "src"
    run = run_tests(tree, env, layout, layout.test_files, trace=True, test_timeout_s=2.0, timeout_s=120)
    assert run.outcomes == {
        "tests/test_core.py::test_add": "passed",
        "tests/test_core.py::test_mean": "passed",
        "tests/test_core.py::test_wrong": "failed",
        "tests/test_core.py::test_spin": "failed",
    }
    assert run.failures["tests/test_core.py::test_spin"]["type"] == "ProbeTimeout"
    wrong = run.failures["tests/test_core.py::test_wrong"]
    assert wrong["type"] == "AssertionError" and "assert 2 == 3" in wrong["message"]
    assert wrong["source"] == ["assert add(1, 1) == 3"]
    trace = run.trace
    names = {i: (Path(f[0]).name, f[1], f[2], f[3]) for i, f in enumerate(trace["funcs"])}
    by_name = {v[2]: i for i, v in names.items()}
    assert names[by_name["mean"]] == ("core.py", 5, "mean", ["tiny.mean"])
    assert names[by_name["_total"]][3] == []  # private, not exported
    mean_calls = {names[i][2] for i in trace["calls"]["tests/test_core.py::test_mean"]}
    assert mean_calls == {"mean", "_total"}
    assert {names[i][2] for i in trace["entries"]["tests/test_core.py::test_mean"]} == {"mean"}
    assert [by_name["mean"], by_name["_total"]] in trace["edges"]
    # Only module bodies run at import here (functions called then are never mutated).
    assert {names[i][2] for i in trace["import_calls"]} == {"<module>"}


def test_selection_runs_only_the_named_tests(tiny):
    tree, env = tiny
    layout = find_layout(tree)
    run = run_tests(
        tree, env, layout, layout.test_files, select=["tests/test_core.py::test_add"], timeout_s=120
    )
    assert run.outcomes == {"tests/test_core.py::test_add": "passed"}
    assert run.passing() == {"tests/test_core.py::test_add"}


def test_whole_run_limit_kills_the_run(tiny):
    tree, env = tiny
    layout = find_layout(tree)
    run = run_tests(tree, env, layout, layout.test_files, test_timeout_s=0, timeout_s=3)
    assert run.timed_out and run.outcomes == {}
