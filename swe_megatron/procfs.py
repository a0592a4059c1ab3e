"""A process's /proc/PID/stat line, parsed once for the sandbox's process tracking and the run's stale-process
reaping; the parent-death signal of the processes a run starts."""

from __future__ import annotations

import ctypes
import os
import signal
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


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: own session/process group, and SIGKILL when the parent dies (even by SIGKILL).

    The kernel's parent-death signal fires when the forking THREAD exits: start servers from a
    long-lived thread (the driver's main thread).
    """
    os.setsid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
