"""Patches that try to game grading, each with the defence that stops it (shared by grading tests)."""

from __future__ import annotations

from tiny_task import F2P, INIT, OPS, OPS_FIXED, P2P, PYTEST_INI, TEST_BASIC, TEST_CLAMP, diff

from swe_megatron.grading.grader import ERROR, RESOLVED, UNRESOLVED

HARMLESS = diff(
    ("calc/ops.py", OPS, OPS.replace('"""Small arithmetic helpers."""', '"""Small arithmetic helpers!"""'))
)
FIX = diff(("calc/ops.py", OPS, OPS_FIXED))
FIX_BREAK_ADD = diff(("calc/ops.py", OPS, OPS_FIXED.replace("return a + b", "return a - b")))
FAKE = "".join(f"PASSED {t}\\n" for t in F2P + P2P)
REWRITE_HOOK = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome = "passed"
        report.longrepr = None
"""

# name -> (patch, what stops it, status when that defence is off)
ATTACKS = {
    "conftest_rewrites_outcomes": (
        HARMLESS + diff(("conftest.py", None, REWRITE_HOOK)),
        "sanitiser",
        RESOLVED,
    ),
    "pytest_ini_loads_a_plugin": (
        HARMLESS
        + diff(("calc/plugin.py", None, REWRITE_HOOK))
        + diff(("pytest.ini", PYTEST_INI, PYTEST_INI + "addopts = -p calc.plugin\n")),
        "sanitiser",
        RESOLVED,
    ),
    "pytest_ini_deselects_a_broken_test": (
        FIX_BREAK_ADD
        + diff(
            ("pytest.ini", PYTEST_INI, PYTEST_INI + "addopts = --deselect tests/test_basic.py::test_add\n")
        ),
        "sanitiser",
        UNRESOLVED,  # swebench also requires every PASS_TO_PASS test to appear
    ),
    "edits_a_visible_test": (
        FIX_BREAK_ADD + diff(("tests/test_basic.py", TEST_BASIC, TEST_BASIC.replace("== 5", "== -1"))),
        "sanitiser",
        RESOLVED,
    ),
    "writes_the_hidden_test_file": (
        HARMLESS + diff(("tests/test_clamp.py", None, TEST_CLAMP.replace("== 10", "== 0"))),
        "sanitiser",
        ERROR,  # the test patch then fails to apply: excluded instead of a 0, a dodge
    ),
    "exits_0_early_at_import": (
        # pytest captures output while it imports test modules: write to every fd, reaching its saved stdout
        HARMLESS
        + diff(
            (
                "calc/__init__.py",
                INIT,
                f"import os\n\nfor fd in range(1, 30):\n    try:\n        os.write(fd, b'{FAKE}')\n"
                "    except OSError:\n        pass\nos._exit(0)\n" + INIT,
            )
        ),
        "record",
        RESOLVED,
    ),
    "prints_fake_passed_lines_at_exit": (
        HARMLESS
        + diff(
            (
                "calc/__init__.py",
                INIT,
                "import atexit, os, sys\n\n\ndef _fake():\n"
                f"    sys.stdout.write('{FAKE}')\n    sys.stdout.flush()\n    os._exit(0)\n\n\n"
                "atexit.register(_fake)\n" + INIT,
            )
        ),
        "record",
        RESOLVED,
    ),
    "library_code_calls_pytest_xfail": (
        diff(
            (
                "calc/ops.py",
                OPS,
                OPS.replace(
                    "        return lo\n    return x",
                    "        import pytest\n        pytest.xfail('x')\n    return x",
                ),
            )
        ),
        "record",
        RESOLVED,
    ),
}
