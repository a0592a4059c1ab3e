"""Fixtures for grading tests: a real bwrap sandbox factory, the tiny real task (tiny_task.py), factory
task files (see factory_task_files) and the canaries a grading drew (for scripted_sandbox.FakeSandbox)."""

from __future__ import annotations

import os
import tempfile
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
    """The tiny task (absolute paths), its repository and env built once per session."""
    folder: Path = tmp_path_factory.mktemp("tiny_task")
    folder.chmod(0o755)
    env = tiny_task.build_env()
    return tiny_task.build_task(folder, env)


@pytest.fixture
def planted_canaries(monkeypatch):
    """Records each grading's canaries (its twins and decoys in every file, merged) in FakeSandbox.planted, and
    the texts it planted, file -> text, in FakeSandbox.planted_texts (the grader's _plant wrapped)."""
    from scripted_sandbox import FakeSandbox

    from swe_megatron.grading import grader

    FakeSandbox.planted, FakeSandbox.planted_texts = [], []
    plant = grader._SandboxRun._plant

    def recording(self):
        canaries, texts = plant(self)
        FakeSandbox.planted.append(canaries)
        FakeSandbox.planted_texts.append(texts)
        return canaries, texts

    monkeypatch.setattr(grader._SandboxRun, "_plant", recording)
    return FakeSandbox.planted


REPO = Path(__file__).resolve().parents[2]
PER_FILE = 4  # from a full default build (60+ tasks) only a sample, to keep this folder under two minutes
SMALL_BUILD = ["--package", "toolz==1.1.0", "--max-tasks", "3", "--seed", "0"]


@pytest.fixture(scope="session")
def factory_task_files() -> list[tuple[Path, int | None]]:
    """(tasks file, how many of its tasks to use): the JSONL named by SWE_MEGATRON_GRADE_TASKS; else each
    data/tasks/*.jsonl built by `swe-megatron make-tasks`; else a 3-task toolz build made here with
    make-tasks and kept under the system temp folder (~80 s once, needs PyPI; instant afterwards)."""
    from swe_megatron.cli import main

    explicit = os.environ.get("SWE_MEGATRON_GRADE_TASKS")
    if explicit:
        return [(Path(explicit), None)]
    built = sorted((REPO / "data" / "tasks").glob("*.jsonl"))
    if built:
        return [(p, PER_FILE) for p in built]
    out = Path(tempfile.gettempdir()) / "swe_megatron_grading_factory_toolz3"
    if main(["make-tasks", "--out", str(out), *SMALL_BUILD]) != 0:
        pytest.skip(f"make-tasks {' '.join(SMALL_BUILD)} built no tasks (offline?); see {out}/report.json")
    return [(p, None) for p in sorted(out.glob("*.jsonl")) if p.stat().st_size]
