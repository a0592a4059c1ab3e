"""`swe-megatron show-config CONFIG [key=value ...]`: print the fully resolved config."""

from __future__ import annotations

import argparse

from swe_megatron.config.load import load_config, to_yaml


def _show_config(args: argparse.Namespace) -> int:
    print(to_yaml(load_config(args.config, args.overrides)), end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the show-config subcommand."""
    p = sub.add_parser("show-config", help="print the fully resolved config (presets + overrides, validated)")
    p.add_argument(
        "config", metavar="CONFIG", help="a preset under configs/ (e.g. embedded, paper-72b) or a YAML path"
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. stage1.t_max=20")
    p.set_defaults(func=_show_config)
