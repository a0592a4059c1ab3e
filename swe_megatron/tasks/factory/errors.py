"""Why a library yields no tasks; the factory reports it and goes on with the others."""

from __future__ import annotations


class LibraryUnusable(Exception):
    """A library cannot be used: `stage` names the step that failed (download, unpack, pure-python, tests,
    env, baseline ...), the message says why."""

    def __init__(self, stage: str, reason: str):
        super().__init__(f"{stage}: {reason}")
        self.stage = stage
        self.reason = reason
