"""Run pytest -rA on one test file in a subprocess and read each test's outcome from its short summary."""

from __future__ import annotations

import subprocess


def pytest_outcomes(python: str, path: str, cwd, *options: str) -> tuple[dict[str, str], str]:
    """(node id of `path` -> PASSED / FAILED / ERROR, the last 3,000 characters of the output) of `python -m pytest
    -rA -p no:cacheprovider *options path` run in cwd."""
    run = subprocess.run(
        [python, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *options, path],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    status = {}
    for line in run.stdout.splitlines():
        word, _, node = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and node.startswith(f"{path}::"):
            status[node.split(" - ")[0]] = word
    return status, run.stdout[-3000:]
