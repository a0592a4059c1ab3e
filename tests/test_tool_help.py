"""`tools/slurm_down.sh --help` and `tools/install_cpu.sh --help` print their usage and act on nothing (issue 42,
item 10: the first would have stopped the cluster, the second installed). Each runs as a copy beside stand-ins
for everything it could touch (the state dir's PID files, tools/slurm_node.sh, python3.11), so that even the
script before its fix could not reach this host's real cluster or venv: an action shows as a stand-in's trace."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRACE = 'echo "$0 $*" >> "{trace}"\n'


def _copy_with_standins(tmp_path: Path, script: str, standins: list[str]) -> tuple[Path, Path]:
    """tmp_path/tools/<script> plus executable stand-ins that append their call to tmp_path/trace."""
    tools = tmp_path / "tools"
    tools.mkdir()
    shutil.copy(ROOT / "tools" / script, tools / script)
    trace = tmp_path / "trace"
    for name in standins:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n" + TRACE.format(trace=trace))
        path.chmod(0o755)
    return tools / script, trace


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_slurm_down_help_stops_nothing(tmp_path, flag):
    script, trace = _copy_with_standins(tmp_path, "slurm_down.sh", ["tools/slurm_node.sh"])
    state = tmp_path / "state"
    (state / "pids").mkdir(parents=True)
    pid_file = state / "pids" / "munged.pid"
    pid_file.write_text("999999999\n")  # no such process: a run would just remove the file
    res = subprocess.run(
        ["bash", str(script), flag],
        env={**os.environ, "SWE_MEGATRON_SLURM_DIR": str(state)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert "Usage: tools/slurm_down.sh" in res.stdout and "slurm_down:" not in res.stdout
    assert pid_file.exists() and not trace.exists()  # no PID file swept, no slurm_node.sh net 0


def test_install_cpu_help_installs_nothing(tmp_path):
    script, trace = _copy_with_standins(tmp_path, "install_cpu.sh", ["bin/python3.11"])
    venv = tmp_path / "venv"
    res = subprocess.run(
        ["bash", str(script), "--help"],
        env={**os.environ, "SWE_MEGATRON_VENV": str(venv), "PYTHON": str(tmp_path / "bin/python3.11")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert "Usage: tools/install_cpu.sh" in res.stdout and "install_cpu:" not in res.stdout + res.stderr
    assert not trace.exists() and not venv.exists()  # python never called, no venv made


@pytest.mark.parametrize("script", ["slurm_down.sh", "install_cpu.sh"])
def test_an_unknown_argument_is_refused_before_acting(tmp_path, script):
    copy, trace = _copy_with_standins(tmp_path, script, ["tools/slurm_node.sh", "bin/python3.11"])
    env = {
        **os.environ,
        "SWE_MEGATRON_SLURM_DIR": str(tmp_path / "state"),
        "SWE_MEGATRON_VENV": str(tmp_path / "venv"),
        "PYTHON": str(tmp_path / "bin/python3.11"),
    }
    res = subprocess.run(["bash", str(copy), "--dry-run"], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "unknown argument '--dry-run'" in res.stderr
    assert not trace.exists()
