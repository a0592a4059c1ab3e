"""pytest plugin the grader loads into the test run (as `_swe_megatron_grade_record`, via PYTEST_PLUGINS).

It keeps the harness's own record of every test's outcome, written to a JSON file when the session
finishes, so the grader can cross-check the printed log: a test process that exits early (os._exit(0)
at import), or prints fake "PASSED ..." lines, leaves a record that is missing or disagrees.

The record lives in the process the patch's code runs in, so that code can rewrite it (this module's
globals, pytest itself, the file): the grader believes it only together with its canary tests
(canaries.py, docs/security.md): twins of the task's tests it cannot tell from the real ones.

pytest imports PYTEST_PLUGINS modules before any conftest or test module, so this file claims its
one-time token first: it reads the record path from the token file and deletes it, so code imported
later cannot learn where the record goes from the environment or the token file. The record has a
random name in a folder its owner cannot list (until the harness reads it), and is written once, with
os.replace, when the session finishes: it is either complete or absent.

This file is copied into the sandbox and runs under the task's Python and pytest: it must stay
self-contained and plain (Python 3.6+, pytest 3.6+; no f-strings, no annotations).
"""

import json
import os

TOKEN_ENV = "SWE_MEGATRON_GRADE_TOKEN"

_record_path = None
_tests = {}
_order = ("PASSED", "SKIPPED", "XFAIL", "FAILED", "ERROR")


def _claim():
    # Nested pytest runs (pytester, xdist workers) must not load this module again: drop it from the
    # environment they inherit, with the token's name.
    plugins = [
        p for p in os.environ.get("PYTEST_PLUGINS", "").split(",") if p.strip() and p.strip() != __name__
    ]
    if plugins:
        os.environ["PYTEST_PLUGINS"] = ",".join(plugins)
    else:
        os.environ.pop("PYTEST_PLUGINS", None)
    token_file = os.environ.pop(TOKEN_ENV, None)
    if not token_file:
        return None
    try:
        with open(token_file) as f:
            path = f.read().strip()
        os.unlink(token_file)
    except OSError:
        return None  # already claimed (an xdist worker, a nested pytest run): not ours to record
    return path or None


def _write(payload):
    tmp = _record_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, _record_path)


_record_path = _claim()


def _status(report):
    wasxfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            return "PASSED"
        if report.skipped:
            return "XFAIL" if wasxfail else "SKIPPED"
        return "FAILED"
    if report.failed:
        return "ERROR"
    if report.skipped:
        return "XFAIL" if wasxfail else "SKIPPED"
    return None


def pytest_runtest_logreport(report):
    """Keep the worst outcome seen for each test id across its setup, call and teardown."""
    if not _record_path:
        return
    status = _status(report)
    if status is None:
        return
    old = _tests.get(report.nodeid)
    if old is None or _order.index(status) > _order.index(old):
        _tests[report.nodeid] = status


def pytest_sessionfinish(session, exitstatus):
    """Write the record: finished, pytest's exit status and the outcome of every test that reported."""
    if not _record_path:
        return
    _write({"finished": True, "exitstatus": int(exitstatus), "tests": _tests})
