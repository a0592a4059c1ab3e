"""A process's /proc/PID/stat line, parsed once for the sandbox's process tracking and the run's stale-process reaping."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


class ProcStat(NamedTuple):
    """The fields of /proc/PID/stat this project reads (proc(5))."""

    state: str
    """One letter: R running, S sleeping, Z zombie, X dead, ..."""
    ppid: int
    """Parent pid."""
    session: int
    """Session id."""
    start_time: int
    """Start time in clock ticks since boot: with the pid, it names one process (pids are reused)."""


def proc_stat(pid: int) -> ProcStat | None:
    """The stat fields of a live process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) is in parentheses and may itself hold spaces and ")": split after the last ")".
    fields = text[text.rindex(")") + 2 :].split()
    return ProcStat(fields[0], int(fields[1]), int(fields[3]), int(fields[19]))
