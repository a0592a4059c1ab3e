"""Every leaf of the config schema is read by some code outside `swe_megatron/config/` (a setting accepted and
then ignored is deleted, not documented), but for the deliberate exceptions listed with their reason.

The check is static and by name: a leaf counts as read where the package outside `config/` reads an attribute
of that name from something other than `self`/`cls`, subscripts with it as a string, or `getattr`s it. Loading
and validating a key is not reading it, so `config/` itself is left out. A field whose name is also another
object's attribute can pass unread; a field whose name no code reads fails.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import swe_megatron
from swe_megatron.config.schema import RunConfig

PACKAGE = Path(swe_megatron.__file__).resolve().parent

UNREAD_ON_PURPOSE: dict[str, str] = {}
"""Schema leaves (dotted paths) that no code reads, each with the reason it stays."""


def schema_leaves(cls: type = RunConfig, prefix: str = "") -> dict[str, str]:
    """Dotted path -> field name of every non-dataclass field under `cls`."""
    out: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out |= schema_leaves(tp, f"{prefix}{f.name}.")
        else:
            out[prefix + f.name] = f.name
    return out


def _read_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        return None if own else node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value if isinstance(node.slice.value, str) else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
        arg = node.args[1] if len(node.args) > 1 else None
        return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
    return None


def names_read(root: Path = PACKAGE) -> set[str]:
    """Attribute/key names the package reads, outside the config package."""
    out: set[str] = set()
    for path in root.rglob("*.py"):
        if path.relative_to(root).parts[0] == "config":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = _read_name(node)
            if name:
                out.add(name)
    return out


def test_every_config_leaf_is_read_by_some_code():
    read = names_read()
    unread = sorted(leaf for leaf, name in schema_leaves().items() if name not in read)
    ignored = [leaf for leaf in unread if leaf not in UNREAD_ON_PURPOSE]
    assert not ignored, f"config keys that no code reads (make code read them or delete them): {ignored}"
    stale = sorted(set(UNREAD_ON_PURPOSE) - set(unread))
    assert not stale, f"UNREAD_ON_PURPOSE lists keys that are read now or no longer exist: {stale}"


def test_the_scan_sees_a_read_and_misses_an_unread_name(tmp_path):
    (tmp_path / "use.py").write_text(
        "def f(cfg, d):\n    return cfg.engine.port, d['seed'], getattr(cfg, 'k')\n"
    )
    (tmp_path / "own.py").write_text("class A:\n    def g(self):\n        return self.weight_sync_port\n")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "v.py").write_text("def v(cfg):\n    return cfg.tensorboard\n")
    read = names_read(tmp_path)
    assert {"engine", "port", "seed", "k"} <= read
    assert not read & {"weight_sync_port", "tensorboard"}
