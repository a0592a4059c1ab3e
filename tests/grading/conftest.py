"""Fixtures for grading tests: a real bwrap sandbox factory and the tiny real task (tiny_task.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_task


@pytest.fixture(scope="session")
def sandbox_factory(tmp_path_factory):
    """Makes bwrap sandboxes with the default limits; skips (saying why) where bwrap cannot run."""
    try:
        from swe_megatron.config.schema import SandboxConfig
        from swe_megatron.sandbox import SandboxError, SandboxSpec, make_sandbox
    except ImportError as e:
        pytest.skip(f"sandbox backend not available yet: {e}")
    cfg = SandboxConfig()
    probe = tmp_path_factory.mktemp("probe")
    try:
        sb = make_sandbox(SandboxSpec(repo_dir=str(probe)), cfg)
        sb.start()
        sb.stop()
    except (SandboxError, ImportError, OSError) as e:
        pytest.skip(f"bwrap sandbox cannot start here ({e}); run tools/sandbox_setup.sh as root")
    return lambda spec: make_sandbox(spec, cfg)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(task, base_dir): the tiny task's repository and env, built once per session."""
    folder: Path = tmp_path_factory.mktemp("tiny_task")
    folder.chmod(0o755)
    env = tiny_task.build_env()
    return tiny_task.build_task(folder, env), folder
