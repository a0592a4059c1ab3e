"""The harness's pytest plugin records every outcome and hides where it writes from the code under test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from swe_megatron.grading import eval_script

SAMPLE = """\
import os

import pytest


def test_pass():
    pass


def test_fail():
    assert False


@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown")


def test_teardown_error(broken_teardown):
    pass


def test_skip():
    pytest.skip("no")


@pytest.mark.xfail
def test_xfail():
    assert False


@pytest.mark.xfail
def test_xpass():
    pass


def test_token_is_gone_before_tests_run():
    assert "SWE_MEGATRON_GRADE_TOKEN" not in os.environ
    assert not os.path.exists(os.environ["TOKEN_PATH_FOR_TEST"])
"""


def run_with_plugin(tmp_path: Path, tests: str, args=()) -> dict | None:
    (tmp_path / "plugin").mkdir()
    source = Path(eval_script.__file__).with_name("pytest_record.py").read_text()
    (tmp_path / "plugin" / f"{eval_script.PLUGIN_MODULE}.py").write_text(source)
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_sample.py").write_text(tests)
    token, record = tmp_path / "token", tmp_path / "record.json"
    token.write_text(str(record))
    env = {
        **os.environ,
        "PYTEST_PLUGINS": eval_script.PLUGIN_MODULE,
        "PYTHONPATH": str(tmp_path / "plugin"),
        eval_script.TOKEN_ENV: str(token),
        "TOKEN_PATH_FOR_TEST": str(token),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # the project venv has many plugins; none is needed
    }
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        os.devnull,
        *args,
        "test_sample.py",
    ]
    subprocess.run(cmd, cwd=tmp_path / "suite", env=env, capture_output=True, timeout=120)
    return json.loads(record.read_text()) if record.exists() else None


def test_record_has_every_outcome_and_the_token_is_claimed_first(tmp_path):
    record = run_with_plugin(tmp_path, SAMPLE)
    assert record["finished"] and record["exitstatus"] == 1
    assert record["tests"] == {
        "test_sample.py::test_pass": "PASSED",
        "test_sample.py::test_fail": "FAILED",
        "test_sample.py::test_teardown_error": "ERROR",
        "test_sample.py::test_skip": "SKIPPED",
        "test_sample.py::test_xfail": "XFAIL",
        "test_sample.py::test_xpass": "PASSED",
        "test_sample.py::test_token_is_gone_before_tests_run": "PASSED",
    }


def test_no_record_when_the_process_exits_early(tmp_path):
    assert run_with_plugin(tmp_path, "import os\nos._exit(0)\n") is None
