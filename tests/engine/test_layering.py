"""The engine side never reaches into the trainer: engine/ imports nothing from swe_megatron.train (vLLM workers
load engine/ modules, and an engine host needs no Megatron); the HF config mapping lives in model/."""

from __future__ import annotations

import ast
from pathlib import Path

import swe_megatron

PACKAGE = Path(swe_megatron.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_engine_imports_nothing_from_train():
    wrong = {
        f"{p.relative_to(PACKAGE)}: {m}"
        for p in sorted((PACKAGE / "engine").glob("*.py"))
        for m in _imports(p)
        if m == "swe_megatron.train" or m.startswith("swe_megatron.train.")
    }
    assert not wrong, f"engine/ imports the trainer package: {sorted(wrong)}"


def test_model_package_imports_nothing_from_train_or_engine():
    wrong = {
        f"{p.relative_to(PACKAGE)}: {m}"
        for p in sorted((PACKAGE / "model").glob("*.py"))
        for m in _imports(p)
        if m.startswith(("swe_megatron.train", "swe_megatron.engine"))
    }
    assert not wrong, f"model/ imports from train/ or engine/: {sorted(wrong)}"
