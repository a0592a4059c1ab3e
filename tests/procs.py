"""Processes as /proc shows them, for tests that check nothing outlives a killed process."""

from __future__ import annotations

from pathlib import Path

from swe_megatron.procfs import proc_stat


def descendants(pid: int) -> set[int]:
    """Every live descendant of pid."""
    out, todo = set(), [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += sorted(kids - out)
            out |= kids
    return out


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie does not)."""
    stat = proc_stat(pid)
    return stat is not None and stat.state != "Z"


def cmdline(pid: int) -> str:
    """The command line of pid (empty when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
