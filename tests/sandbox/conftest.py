"""Fixtures of the sandbox tests: tight limits, a tiny repository, a venv made from Debian's Python.

The tests need root (the sandbox drops from root to the swe-sandbox user), bubblewrap, setpriv/prlimit
and the user: `sudo tools/sandbox_setup.sh`. They are skipped, with that reason, where these are missing.
Run: .venv/bin/python -m pytest tests/sandbox -q
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from sandbox_servers import missing

from swe_megatron.config.schema import SandboxBackend, SandboxConfig
from swe_megatron.sandbox import SandboxSpec, make_sandbox

SYSTEM_PYTHON = "/usr/bin/python3"


def _missing() -> str | None:
    if not os.path.exists(SYSTEM_PYTHON):
        return f"{SYSTEM_PYTHON} (Debian's Python, used for task venvs) is missing"
    return missing()


MISSING = _missing()


def pytest_collection_modifyitems(config, items):
    """Every test in this folder is a `sandbox` test, skipped when the machine is not set up."""
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.sandbox)
            if MISSING:
                item.add_marker(pytest.mark.skip(reason=MISSING))


@pytest.fixture
def cfg() -> SandboxConfig:
    """Tight limits so that the abuse tests end quickly."""
    return replace(
        SandboxConfig(),
        backend=SandboxBackend.bwrap,
        memory_mb=512,
        max_processes=64,
        cpu_seconds=20,
        max_file_mb=16,
        command_timeout_s=10.0,
        output_cap_bytes=4096,
        tmpfs_mb=32,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small git repository (the task's buggy state)."""
    path = tmp_path / "repo"
    (path / "pkg").mkdir(parents=True)
    (path / "pkg" / "__init__.py").write_text("def add(a, b):\n    return a - b\n")
    (path / "README.md").write_text("toy\n")
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


@pytest.fixture(scope="session")
def venv():
    """A venv of Debian's Python in a world-readable folder (as task environments are)."""
    parent = Path(tempfile.mkdtemp(prefix="swe-sandbox-test-venv-", dir="/var/tmp"))
    parent.chmod(0o755)
    env = parent / "env"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(env)], check=True)
    yield env
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def make(cfg, repo):
    """make(**spec_fields, cfg=...) -> a started sandbox, stopped after the test."""
    made = []

    def _make(cfg_=None, **fields):
        fields.setdefault("repo_dir", str(repo))
        sb = make_sandbox(SandboxSpec(**fields), cfg_ or cfg)
        made.append(sb)
        sb.start()
        return sb

    yield _make
    for sb in made:
        sb.stop()


@pytest.fixture
def sandbox(make, venv):
    """A started bwrap sandbox with the venv."""
    return make(env_dir=str(venv))
