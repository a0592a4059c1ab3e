"""Every leaf of the config schema is read by some code outside `swe_megatron/config/` (a setting accepted and
then ignored is deleted, not documented), but for the deliberate exceptions listed with their reason.

The check is static. Loading and validating a key is not reading it, so `config/` itself is left out. A read is
an attribute load (not on `self`/`cls`), a string subscript or a `getattr` with a string. A field name that no
other class of the package uses counts as read wherever it is read. A name that is ambiguous (a field of two
config sections, or an attribute of a non-config class: `kind`, `backend`, `name`) counts only when read from
a receiver known to hold that section: the section's own name (`cfg.cluster.backend`), a parameter annotated
with its class, or a variable that reads an unambiguous field of the same section somewhere (`stage.kind` where
`stage.tasks_per_iteration` is read). A stage field that only one kind of stage reads is refused on the other
kind by config/validate.py (RFT_ONLY, DAPO_ONLY), which a scan by name cannot tell apart.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from collections import Counter
from pathlib import Path

import swe_megatron
from swe_megatron.config.schema import RunConfig

PACKAGE = Path(swe_megatron.__file__).resolve().parent

UNREAD_ON_PURPOSE: dict[str, str] = {}
"""Schema leaves (dotted paths) that no code reads, each with the reason it stays."""


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One leaf: its dotted path, field name, dataclass, and the field names that hold that dataclass."""

    path: str
    name: str
    cls: type
    sections: frozenset[str]


def schema_leaves(cls: type = RunConfig) -> list[Leaf]:
    """Every non-dataclass field under `cls`."""
    holders = _holders(cls)

    def walk(c: type, prefix: str) -> list[Leaf]:
        out: list[Leaf] = []
        for name, tp in typing.get_type_hints(c).items():
            if dataclasses.is_dataclass(tp):
                out += walk(tp, f"{prefix}{name}.")
            else:
                out.append(Leaf(prefix + name, name, c, frozenset(holders.get(c, ()))))
        return out

    return walk(cls, "")


def _holders(cls: type = RunConfig, out: dict | None = None) -> dict[type, set[str]]:
    """Config dataclass -> the field names that hold it (StageConfig: rft, stage1, stage2)."""
    out = {} if out is None else out
    for name, tp in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(tp):
            out.setdefault(tp, set()).add(name)
            _holders(tp, out)
    return out


def _last_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _read(node: ast.AST) -> tuple[str | None, str] | None:
    """(receiver's last name, name read) for a read, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            return None
        return _last_name(node.value), node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return (_last_name(node.value), node.slice.value) if isinstance(node.slice.value, str) else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
        arg = node.args[1] if len(node.args) > 1 else None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return _last_name(node.args[0]), arg.value
    return None


def _own_attributes(tree: ast.AST) -> set[str]:
    """Names a non-config class of the package gives its instances: annotated class fields, self.X = ..."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            body = node.body
            out |= {
                s.target.id for s in body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and _last_name(node.value) == "self"
        ):
            out.add(node.attr)
    return out


def _annotated(tree: ast.AST) -> set[tuple[str, str]]:
    """(parameter, class name) for each class name in a parameter's annotation (`stage: StageConfig | X`)."""
    out: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            text = ast.unparse(node.annotation)
            out |= {(node.arg, word) for word in text.replace("|", " ").replace(".", " ").split()}
    return out


@dataclasses.dataclass
class Scan:
    """What the package outside config/ reads."""

    reads: set[tuple[str | None, str]]
    """(receiver's last name, name read)."""
    own: set[str]
    """Attribute names of the package's own (non-config) classes."""
    annotated: set[tuple[str, str]]
    """(parameter, class name in its annotation)."""


def scan(root: Path = PACKAGE) -> Scan:
    """Reads, own attribute names and annotated parameters of the package outside `root/config`."""
    out = Scan(set(), set(), set())
    for path in root.rglob("*.py"):
        if path.relative_to(root).parts[0] == "config":
            continue
        tree = ast.parse(path.read_text(), str(path))
        out.own |= _own_attributes(tree)
        out.annotated |= _annotated(tree)
        out.reads |= {r for r in map(_read, ast.walk(tree)) if r}
    return out


def _receivers(root_cls: type, ambiguous: set[str], found: Scan) -> dict[type, set[str | None]]:
    """Names known to hold each config class: the fields holding it, parameters annotated with it, and
    variables that read one of its unambiguous fields or one of its sections."""
    holders = _holders(root_cls)
    out: dict[type, set[str | None]] = {}
    for cls in {root_cls} | set(holders):
        names = {f.name for f in dataclasses.fields(cls)}
        sections = {n for n, tp in typing.get_type_hints(cls).items() if dataclasses.is_dataclass(tp)}
        tells = (names - ambiguous) | sections
        out[cls] = set(holders.get(cls, ())) | {p for p, c in found.annotated if c == cls.__name__}
        out[cls] |= {r for r, name in found.reads if name in tells and r is not None}
    return out


def unread_leaves(root_cls: type, found: Scan) -> list[str]:
    """Dotted paths of the leaves under `root_cls` that no read reaches."""
    leaves = schema_leaves(root_cls)
    classes = {root_cls} | set(_holders(root_cls))
    field_count = Counter(f.name for cls in classes for f in dataclasses.fields(cls))
    ambiguous = {name for name, n in field_count.items() if n > 1} | found.own
    receivers = _receivers(root_cls, ambiguous, found)
    out = []
    for leaf in leaves:
        if leaf.name in ambiguous:
            hit = any(name == leaf.name and r in receivers[leaf.cls] for r, name in found.reads)
        else:
            hit = any(name == leaf.name for _, name in found.reads)
        if not hit:
            out.append(leaf.path)
    return sorted(out)


def test_every_config_leaf_is_read_by_some_code():
    unread = unread_leaves(RunConfig, scan())
    ignored = [leaf for leaf in unread if leaf not in UNREAD_ON_PURPOSE]
    assert not ignored, f"config keys that no code reads (make code read them or delete them): {ignored}"
    stale = sorted(set(UNREAD_ON_PURPOSE) - set(unread))
    assert not stale, f"UNREAD_ON_PURPOSE lists keys that are read now or no longer exist: {stale}"


@dataclasses.dataclass
class Part:
    """A section of the scan's own test schema."""

    kind: str = ""
    size: int = 0
    colour: str = ""


@dataclasses.dataclass
class Whole:
    """The scan's own test schema: `kind` is ambiguous (two sections have it)."""

    part: Part = dataclasses.field(default_factory=Part)
    kind: str = ""


def test_the_scan_tells_reads_from_names_that_only_look_alike(tmp_path):
    """A distinctive field read anywhere counts; an ambiguous one only through its section's name or a
    variable that reads the section's distinctive fields; reads in config/ and on self never count."""
    (tmp_path / "use.py").write_text("def f(p, job):\n    return p.size, job.kind, getattr(p, 'colour')\n")
    (tmp_path / "own.py").write_text("class A:\n    def g(self):\n        return self.colour\n")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "v.py").write_text("def v(cfg):\n    return cfg.part.kind, cfg.kind\n")
    assert unread_leaves(Whole, scan(tmp_path)) == [
        "kind",
        "part.kind",
    ]  # job is no Part: its kind is not one
    (tmp_path / "use.py").write_text("def f(p, w: Whole):\n    return p.size, p.kind, w['kind'], p.colour\n")
    assert unread_leaves(Whole, scan(tmp_path)) == []
