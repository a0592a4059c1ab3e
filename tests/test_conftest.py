"""The suite's own setup (tests/conftest.py) keeps pytest's capture working whatever the libraries do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

THREE_TESTS = """
import logging.config


def test_a_library_handler_made_while_captured():
    import absl.logging  # noqa: F401  as megatron.core imports it: its handler keeps the sys.stderr of now


def test_a_library_configures_logging(capsys):
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})  # as submitit's import does


def test_the_next_test():
    print("captured")
"""


def test_absl_handler_does_not_close_pytest_capture_when_a_library_configures_logging(tmp_path):
    """CI of stop 35: megatron.core imported in one test, submitit in a later one under capsys; absl's handler,
    closed by submitit's dictConfig, closed pytest's capture file, and the ~140 tests left on that worker erred."""
    (tmp_path / "test_three.py").write_text(THREE_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", str(tmp_path)],
        cwd=tmp_path, env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert "3 passed" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]
