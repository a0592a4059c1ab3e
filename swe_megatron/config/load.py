"""Load a run config: YAML presets composed with `_base_`, dotted overrides, typed and validated.

A preset is a YAML file whose optional `_base_` list names other presets (paths relative to
`configs/`, or to the file itself); they are merged in order, then the file, then the overrides
(`key=value`, or `cluster=cpu-3x`: a fragment of configs/algo/, cluster/, model/ or stage/ merged in place).
Paths in the config (PATH_KEYS: run_dir, tasks.*_file, ...) are read relative to the repository root, whatever
the current directory, and stored absolute in the resolved config.
Every error a user can cause ends in one `ConfigError` naming the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import typing
import warnings
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from swe_megatron.config.capacity import derive, idle_warnings
from swe_megatron.config.schema import RunConfig
from swe_megatron.config.validate import validate

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"
"""The presets shipped with the repository."""
REPO_ROOT = CONFIGS_DIR.parent
"""Relative paths in a config are read from here (not from the current directory)."""
PATH_KEYS = (
    "run_dir",
    "tasks.train_file",
    "tasks.test_file",
    "cluster.log_dir",
    "cluster.rendezvous",
    "engine.cache_dir",
    "monitor.wandb.dir",
)
"""Config fields holding a path: made absolute at load (`~` expanded, relative ones under REPO_ROOT), so a run
means the same folders from any working directory. model.hf_path and model.tokenizer stay as written (a
folder or a hub id); sandbox paths must be written absolute (sandbox servers on other nodes read them)."""


def absolute_path(value: str) -> str:
    """A config path as the run uses it: empty stays empty, `~` expands, relative is under REPO_ROOT."""
    if not value:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else REPO_ROOT / path)


def resolve_paths(cfg: Any) -> None:
    """Make PATH_KEYS of a config (DictConfig or plain dict) absolute in place (see absolute_path)."""
    for key in PATH_KEYS:
        *parents, leaf = key.split(".")
        node = cfg
        for part in parents:
            node = node.get(part) if node is not None else None
        if node is not None and isinstance(node.get(leaf), str):
            node[leaf] = absolute_path(node[leaf])


class ConfigError(ValueError):
    """A config the user wrote is wrong; the message names the key and the fix."""


class CapacityWarning(UserWarning):
    """A config that runs but leaves most of its cluster idle (config/capacity.py idle_warnings)."""


def find_preset(name: str) -> Path:
    """Resolve CONFIG as given on the command line: a YAML path, or a preset name under configs/."""
    candidates = [Path(name)]
    if not name.endswith((".yaml", ".yml")):
        candidates.append(Path(name + ".yaml"))
    for base in (Path.cwd() / "configs", CONFIGS_DIR):
        candidates += [base / name, base / (name + ".yaml")]
    for path in candidates:
        if path.is_file():
            return path.resolve()
    presets = sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))
    raise ConfigError(
        f"config {name!r} not found: give a YAML path or one of the run presets: {', '.join(presets)} "
        f"(algo/, cluster/, model/ and stage/ under {CONFIGS_DIR} hold fragments to compose with _base_)"
    )


def _read_yaml(path: Path, chain: tuple[Path, ...]) -> DictConfig:
    if path in chain:
        raise ConfigError(f"{path}: _base_ cycle: {' -> '.join(str(p) for p in (*chain, path))}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a preset must be a YAML mapping, got {type(data).__name__}")
    bases = data.pop("_base_", [])
    if isinstance(bases, str):
        bases = [bases]
    merged = OmegaConf.create()
    for base in bases:
        local = path.parent / base
        base_path = local if local.is_file() else CONFIGS_DIR / base
        if not base_path.is_file():
            raise ConfigError(
                f"{path}: _base_ entry {base!r} not found (looked at {local} and {CONFIGS_DIR / base})"
            )
        merged = OmegaConf.merge(merged, _read_yaml(base_path, (*chain, path)))
    return OmegaConf.merge(merged, OmegaConf.create(data))


FRAGMENT_GROUPS = ("algo", "cluster", "model", "stage")
"""Folders of configs/ whose fragments an override `GROUP=NAME` merges in place (e.g. cluster=cpu-3x)."""


def _merge_fragment(cfg: DictConfig, group: str, name: str) -> DictConfig:
    """cfg with configs/GROUP/NAME.yaml merged over it (like a Hydra config group); ConfigError naming the
    fragments of that group when NAME is not one of them."""
    path = CONFIGS_DIR / group / f"{name}.yaml"
    if not name or "/" in name or not path.is_file():
        known = ", ".join(sorted(p.stem for p in (CONFIGS_DIR / group).glob("*.yaml")))
        raise ConfigError(
            f"override {group}={name}: no fragment configs/{group}/{name}.yaml; one of: {known}"
        )
    try:
        return OmegaConf.merge(cfg, _read_yaml(path, ()))
    except OmegaConfBaseException as e:
        raise _explain(e, str(path)) from None


def _field_info(full_key: str) -> tuple[str, list[str]]:
    """The expected type of a dotted key, and the names allowed at its level (for messages)."""
    cls: Any = RunConfig
    expected = "?"
    parts = [p for p in full_key.replace("[", ".").replace("]", "").split(".") if p]
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            break
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return "unknown", sorted(hints)
        tp = hints[part]
        if i == len(parts) - 1:
            expected = _type_name(tp)
        cls = tp
    return expected, []


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(m.value for m in tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args:
        return " or ".join(_type_name(a) for a in args) + " or null"
    if typing.get_origin(tp) is list:
        return f"a list of {_type_name(args[0])}"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _explain(e: OmegaConfBaseException, where: str) -> ConfigError:
    key = getattr(e, "full_key", None) or ""
    expected, allowed = _field_info(key)
    if expected == "unknown":
        msg = f"unknown config key {key!r}; allowed at this level: {', '.join(allowed)}"
    else:
        value = getattr(e, "value", None)
        got = f" (got {value!r})" if value is not None else ""
        msg = f"config key {key!r} has an invalid value{got}; expected {expected}"
    return ConfigError(f"{where}: {msg}")


def _blame(problem: str, overrides: list[str] | tuple[str, ...], path: Path) -> str:
    """A validation problem with where its value came from: the overrides naming its key, else the preset."""
    named = [
        item
        for item in overrides
        if re.search(rf"(?<![\w.]){re.escape(item.partition('=')[0].strip())}(?![\w])", problem)
    ]
    return f"{problem} (from override {', '.join(named)})" if named else f"{problem} (from {path})"


def load_config(config: str, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose a preset with `key=value` overrides into a typed, validated, read-only RunConfig.

    Overrides apply in order; `GROUP=NAME` with GROUP in FRAGMENT_GROUPS merges configs/GROUP/NAME.yaml there."""
    path = find_preset(config)
    schema = OmegaConf.structured(RunConfig)
    try:
        cfg = OmegaConf.merge(schema, _read_yaml(path, ()))
    except OmegaConfBaseException as e:
        raise _explain(e, str(path)) from None
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. stage1.t_max=20)")
        key, _, raw = item.partition("=")
        if key.strip() in FRAGMENT_GROUPS:
            cfg = _merge_fragment(cfg, key.strip(), raw.strip())
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
            OmegaConf.update(cfg, key.strip(), value, merge=True, force_add=False)
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: value is not valid YAML") from None
        except OmegaConfBaseException as e:
            raise _explain(e, f"override {item!r}") from None
        except AttributeError:  # OmegaConf raises this for a path through a non-mapping
            raise ConfigError(f"override {item!r}: {key!r} does not name a config field") from None
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(
            f"{path}: cannot resolve interpolation at {getattr(e, 'full_key', '?')}: {e.msg}"
        ) from None
    resolve_paths(cfg)
    derive(cfg)
    problems = validate(cfg)
    if problems:
        raise ConfigError("; ".join(_blame(p, overrides, path) for p in problems))
    for message in idle_warnings(cfg):
        warnings.warn(f"{path.name}: {message}", CapacityWarning, stacklevel=2)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def to_yaml(cfg: DictConfig) -> str:
    """The fully resolved config as YAML (what show-config prints and the run directory stores)."""
    return OmegaConf.to_yaml(cfg, resolve=True)
