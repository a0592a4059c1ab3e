"""The environment a process that joins NCCL weight-sync groups must start with (engine/weight_receiver.py), kept
free of torch so the command line can apply it before anything else runs."""

from __future__ import annotations

import os

NCCL_ERROR_HANDLING = "2"
"""TORCH_NCCL_ASYNC_ERROR_HANDLING of every sync group (CleanUpOnly): a peer's death or a timeout aborts the
group's communicator and fails its work, and the process lives on. torch's default, 3 (SkipCleanUp), ends the
process from the watchdog thread (ProcessGroupNCCL.cpp, Watchdog: SHOULD_TEAR_DOWN -> handleException rethrows):
one killed receiver would take every other vLLM worker of the group, and the trainer, down with it within the
watchdog's ~100 ms, before the trainer's probe of the dead server could write the abort key."""
SYNC_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": NCCL_ERROR_HANDLING}
"""What a process that joins NCCL sync groups must start with. ProcessGroupNCCL's constructor reads the mode from
the environment (`asyncErrorHandling_`, one per group: ProcessGroupNCCL.hpp), so it would have to be in the
environment when the group is built; setting it there and back while other threads run races their getenv
(glibc's setenv may move the environment array under a reader; torch's own constructor notes such a segfault). So
it is set once, before any thread: in the environment of the vLLM servers (engine/vllm_server.py `server_env`) and
at the start of the `swe-megatron` process (cli.run, which every trainer rank runs). Every NCCL group of those
processes then uses CleanUpOnly: an NCCL error fails the collective (the rank raises at its next wait) instead of
the watchdog ending the process; the rank then exits with that error, as before but one call later."""


class SyncEnvError(RuntimeError):
    """This process was started without SYNC_ENV, so a sync group on NCCL could end it on a peer's death."""


def apply_at_start() -> None:
    """Put SYNC_ENV into this process's environment: call it first thing in a process's entry point, before any
    thread starts (the one write to the environment this process makes for the sync)."""
    os.environ.update(SYNC_ENV)


def check_sync_env(environ) -> None:
    """SyncEnvError unless environ holds SYNC_ENV (a NCCL sync group in this process would get another mode)."""
    for name, want in SYNC_ENV.items():
        if environ.get(name) != want:
            raise SyncEnvError(
                f"weight sync: this process runs with {name}={environ.get(name, '(unset: torch uses 3)')}, so a "
                f"peer's death in the sync group would end it; start it with {name}={want} (swe-megatron's "
                "commands and the vLLM servers it starts do)"
            )
