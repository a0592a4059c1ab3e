"""Errors a user can cause that are not config errors (config errors: swe_megatron.config.ConfigError), and
the interrupt every command ends with on Ctrl-C or SIGTERM."""

import logging
from pathlib import Path


class UsageError(Exception):
    """A mistake in what the user asked for (bad file, bad argument); printed as one line, exit 2."""


class RankZeroFailed(RuntimeError):
    """Rank 0 failed in work it does alone (rollouts, commits); the other trainer ranks stop with this, and the CLI
    says so in one line (rank 0 prints the cause: pipeline/spmd.py)."""

    def __init__(self, rank: int, cause: str):
        super().__init__(f"rank 0 failed, so rank {rank} stops: {cause}")
        self.rank = rank
        """The rank that stops."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM: the command stops; the CLI prints one line saying what is kept."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        """The signal that stopped the command."""


def stop_on_signal(signum: int, frame=None) -> None:
    """Signal handler: raise Interrupted in the main thread. Warnings are silenced from here on: the work cut
    short (episodes, sandbox starts in other threads) fails as expected and would bury the one line."""
    logging.disable(logging.WARNING)
    raise Interrupted(signum)


def output_folder(path: str, flag: str = "--out", remedy: str = "give a new folder or remove it") -> Path:
    """A command's output folder, checked before any work: UsageError if it is a file or a folder already
    holding files (a rerun never overwrites an earlier output silently)."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {path} is a file; give a folder (new, or empty)")
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(
            f"{flag} {path} already holds files (an earlier output?); {remedy}"
        )
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise UsageError(f"{flag} {path}: {parent} is a file, not a folder")
    return out
