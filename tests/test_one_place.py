"""One piece of code per idea: each low-level idea below is written in one module and used from there.

Scans the package's source as text (cheap, no imports): a second copy of an atomic write, a free-port pick,
an HTTP health probe, a /proc stat parser or a command's reading of its task file fails here with the file that holds it, as does algorithm code
that touches files or a command that takes UsageError from the CLI module.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "swe_megatron"

# Files copied into a sandbox and run there on their own (no swe_megatron to import): they keep their copy.
STANDALONE = {"grading/pytest_record.py", "tasks/factory/probe_plugin.py"}


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PKG)): p.read_text(encoding="utf-8") for p in sorted(PKG.rglob("*.py"))}


def _holders(pattern: str) -> list[str]:
    rx = re.compile(pattern, re.MULTILINE)
    return [name for name, text in _sources().items() if rx.search(text) and name not in STANDALONE]


@pytest.mark.parametrize(
    ("idea", "pattern", "home"),
    [
        # a file written whole under a temporary name, then renamed over the target
        ("atomic file write", r"\btmp\w*\.write_(text|bytes)\(|open\(tmp\b|mkstemp\(", ["atomic_write.py"]),
        ("free-port pick", r"\.bind\(\(", ["net.py"]),
        ("HTTP health probe", r"urlopen\(.*health|\"/health\"", ["net.py"]),
        ("/proc/PID/stat parse", r"/proc/\{[^}]*\}/stat\b", ["procfs.py"]),
        (
            "a command's task file read, refused as one UsageError",
            r"try:\n\s+(tasks = |return )load_tasks\(",
            ["tasks/load.py"],
        ),  # fmt: skip
    ],
)
def test_an_idea_has_one_home(idea, pattern, home):
    assert _holders(pattern) == home, f"{idea} written outside {home}: use the helper there"


def test_commands_take_usage_error_from_errors_module():
    assert _holders(r"from swe_megatron\.cli import") == []


def test_algo_is_pure():
    """algo/ computes on plain data and tensors; files, clocks and processes live at the pipeline's edges."""
    impure = r"^\s*(import (os|shutil|subprocess|time)\b|from (os|pathlib|shutil|subprocess) import)|\bopen\("
    assert [n for n in _holders(impure) if n.startswith("algo/")] == []
