"""`swe-megatron show-config CONFIG [key=value ...]`: print the fully resolved config."""

from __future__ import annotations

import argparse

from swe_megatron.config.load import CONFIGS_DIR, load_config, to_yaml
from swe_megatron.errors import UsageError

USAGE = "swe-megatron show-config [-h] CONFIG [key=value ...]"


def _show_config(args: argparse.Namespace) -> int:
    if args.config is None:  # argparse would say "required: CONFIG, key=value" (the overrides are optional)
        presets = ", ".join(sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml")))
        raise UsageError(
            f"show-config needs CONFIG, a run preset ({presets}) or a YAML path; overrides are optional: "
            "e.g. swe-megatron show-config embedded"
        )
    print(to_yaml(load_config(args.config, args.overrides)), end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the show-config subcommand."""
    p = sub.add_parser(
        "show-config", usage=USAGE, help="print the fully resolved config (presets + overrides, validated)"
    )
    p.add_argument(
        "config",
        nargs="?",
        metavar="CONFIG",
        help="a preset under configs/ (e.g. embedded, paper-72b) or a YAML path",
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. stage1.t_max=20")
    p.set_defaults(func=_show_config)
