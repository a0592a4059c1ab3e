"""tools/proc_cpu.py: the CPU seconds of each process of a command's tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "proc_cpu.py"

# A parent that idles while its child spins ~1 s of CPU: the figures must tell them apart.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass"])
child.wait()
time.sleep(0.3)
"""


def test_each_process_of_the_tree_gets_its_own_cpu_seconds():
    res = subprocess.run([sys.executable, str(TOOL), "--interval", "0.1", "--", sys.executable, "-c", PARENT],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("wall ") and "over 2 process(es)" in lines[0], res.stderr
    busy, idle = (float(line.split()[0]) for line in lines[1:3])
    assert "process_time" in lines[1] and busy >= 0.8, res.stderr  # the child, listed first
    assert idle < 0.5 * busy, res.stderr  # the parent only waited


def test_the_command_exit_status_is_the_tool_s():
    res = subprocess.run([sys.executable, str(TOOL), "--", sys.executable, "-c", "raise SystemExit(3)"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 3


def test_bad_numbers_are_one_usage_error_before_the_command_runs(tmp_path):
    marker = tmp_path / "ran"
    for bad in (["--interval", "0"], ["--top", "0"]):
        res = subprocess.run([sys.executable, str(TOOL), *bad, "--", "touch", str(marker)], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        assert res.returncode == 2 and f"{bad[0]} must be" in res.stderr, res.stderr
    assert not marker.exists()
