"""The `swe-megatron` command line. A subcommand exists only once it does its job.

Each subcommand lives with its component as a module exposing `register(subparsers)`, which adds a
parser whose `func(args) -> int` runs it; COMMANDS lists those modules in help order.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import re
import signal
import sys
import threading

from swe_megatron import __version__
from swe_megatron.config import ConfigError
from swe_megatron.engine.base import EngineError
from swe_megatron.engine.sync_env import apply_at_start

# UsageError lives outside this module so `python -m swe_megatron.cli` (which loads this file as
# __main__) catches the same class the command modules raise; re-exported here for them.
from swe_megatron.errors import RankZeroFailed, UsageError, stop_on_signal

__all__ = ["COMMANDS", "UsageError", "build_parser", "main", "parse_args"]

COMMANDS = [
    "swe_megatron.config.command",  # show-config
    "swe_megatron.sandbox.command",  # sandbox-server
    "swe_megatron.rollout.command",  # rollout, show-trajectory
    "swe_megatron.grading.command",  # grade
    "swe_megatron.tasks.command",  # make-tasks
    "swe_megatron.train.command",  # plan
    "swe_megatron.pipeline.command",  # run, eval
    "swe_megatron.pipeline.status",  # status
    "swe_megatron.launch.command",  # launch, build-sifs, job-step
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="swe-megatron",
        description="Train open-weight LLMs into SWE agents with RFT + two-stage DAPO (Megatron-Core, vLLM).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    for command in sub.choices.values():  # `eval --run DIR` is not `--runs`: a prefix is no option of its own
        command.allow_abbrev = False
    return parser


_OVERRIDE = re.compile(r"[A-Za-z_][\w.\[\]-]*=")
"""A dotted `key=value` override (or `GROUP=NAME`), as opposed to an option or a positional argument."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line; `key=value` overrides may stand anywhere after the subcommand, also after
    its options (argparse alone takes them only right after the positional CONFIG)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    sub = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices[args.command]
    overrides = [a for a in extra if _OVERRIDE.match(a)]
    unknown = [a for a in extra if not _OVERRIDE.match(a)]
    if overrides and not hasattr(args, "overrides"):
        unknown = extra  # this command takes no overrides
    if unknown:
        sub.error(f"unrecognized arguments: {' '.join(unknown)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    return args


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run one subcommand. User errors become one line on stderr and exit 2; an engine
    failure that ends a run (a failed weight sync, no server left) one line and exit 1, as does a trainer rank
    stopped by rank 0's failure; Ctrl-C and SIGTERM one line saying what is kept (a command's `args.kept()`, if it
    sets one) and exit 128 + signal; a closed stdout (`| head`) nothing, exit 141 as for SIGPIPE."""
    args = parse_args(argv)
    handlers = _catch_signals()
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"swe-megatron {args.command}: error: config: {e}", file=sys.stderr)
    except UsageError as e:
        print(f"swe-megatron {args.command}: error: {e}", file=sys.stderr)
    except EngineError as e:
        print(f"swe-megatron {args.command}: error: {e}", file=sys.stderr)
        return 1
    except RankZeroFailed as e:
        # Rank 0 printed the cause; the others add one line each, not a traceback apiece.
        print(f"swe-megatron {args.command}: rank {e.rank} stops because rank 0 failed (rank 0 says why)",
              file=sys.stderr)  # fmt: skip
        return 1
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python's exit-time flush from reporting it too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as e:
        logging.disable(logging.WARNING)
        kept = getattr(args, "kept", None)
        print(f"swe-megatron {args.command}: interrupted{'; ' + kept() if kept else ''}", file=sys.stderr)
        return 128 + getattr(e, "signum", signal.SIGINT)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return 2


def _catch_signals() -> dict[int, object]:
    """SIGINT and SIGTERM raise Interrupted (errors.stop_on_signal) while a command runs; the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, stop_on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}


def run() -> None:
    """Console-script wrapper: exit with main()'s status. Output is line-buffered also when it is a file or a
    pipe (Slurm's job log), so each line shows when it is printed. The weight sync's environment (sync_env.py)
    is set first, before any thread exists."""
    apply_at_start()
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    code = main()
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        _exit_without_abandoned_threads(code)
    sys.exit(code)


def _exit_without_abandoned_threads(code: int) -> None:
    """After an interrupt's line, exit now when threads it abandoned still run: Python's exit joins every thread,
    and an episode thread blocked in an engine request (up to engine.request_timeout_s) or in a dead server's
    probes held the exit 16-27 s after the line, with nothing printed (issue 42 item 10). What the command keeps
    is written and its servers stopped by then (the line comes after its cleanup)."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if not any(t.is_alive() and not t.daemon for t in others):
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say anyway
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
