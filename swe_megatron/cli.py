"""The `swe-megatron` command line. A subcommand exists only once it does its job.

Each subcommand lives with its component as a module exposing `register(subparsers)`, which adds a
parser whose `func(args) -> int` runs it; COMMANDS lists those modules in help order.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from swe_megatron.config import ConfigError

# UsageError lives outside this module so `python -m swe_megatron.cli` (which loads this file as
# __main__) catches the same class the command modules raise; re-exported here for them.
from swe_megatron.errors import UsageError

__all__ = ["COMMANDS", "UsageError", "build_parser", "main"]

COMMANDS = [
    "swe_megatron.config.command",  # show-config
    "swe_megatron.sandbox.command",  # sandbox-server
    "swe_megatron.rollout.command",  # rollout, show-trajectory
    "swe_megatron.grading.command",  # grade
    "swe_megatron.tasks.command",  # make-tasks
    "swe_megatron.train.command",  # plan
    "swe_megatron.pipeline.command",  # run, eval
    "swe_megatron.launch.command",  # launch, build-sifs, job-step
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="swe-megatron",
        description="Train open-weight LLMs into SWE agents with RFT + two-stage DAPO (Megatron-Core, vLLM).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run one subcommand; user errors become one line on stderr and exit 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"swe-megatron {args.command}: config error: {e}", file=sys.stderr)
    except UsageError as e:
        print(f"swe-megatron {args.command}: {e}", file=sys.stderr)
    return 2


def run() -> None:
    """Console-script wrapper: exit with main()'s status."""
    sys.exit(main())


if __name__ == "__main__":
    run()
