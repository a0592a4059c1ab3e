"""Ctrl-C exits right after its line (issue 42 item 10): work the interrupt abandoned, such as an episode thread
blocked in an engine request, does not hold the process's exit (Python's exit joins every thread)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BLOCKED = textwrap.dedent(
    """
    import sys, time
    from concurrent.futures import ThreadPoolExecutor
    from swe_megatron import cli

    def register(sub):
        sub.add_parser("blocked").set_defaults(func=blocked)

    def blocked(args):
        pool = ThreadPoolExecutor(2, thread_name_prefix="episode")
        try:
            pool.submit(time.sleep, 30)  # an episode waiting 30 s for a generation that will not come soon
            print("ready", flush=True)
            time.sleep(60)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # as run_rollouts: the episode is abandoned

    cli.COMMANDS.append("__main__")
    sys.argv = ["swe-megatron", "blocked"]
    cli.run()
    """
)


def test_an_interrupt_exits_without_waiting_for_abandoned_threads(tmp_path):
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    line = proc.stderr.readline()
    t_line = time.monotonic()
    proc.wait(timeout=60)
    waited = time.monotonic() - t_line
    assert line == "swe-megatron blocked: interrupted\n" and proc.returncode == 130, (line, proc.returncode)
    assert waited < 10, f"exited {waited:.0f} s after its line (the abandoned thread's sleep ends at 30 s)"
    assert proc.stderr.read() == ""
