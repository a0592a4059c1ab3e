"""Import swebench's grading and log parsers without swebench/harness/__init__.py.

That __init__ imports docker, datasets and modal and reads a .env file (~2 s, 1,500 modules). The
grading code itself needs none of them: registering a bare package object for `swebench.harness`
lets its submodules import on their own (~40 ms).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType


def import_swebench_grading() -> tuple[ModuleType, ModuleType, ModuleType]:
    """Return swebench's (harness.grading, harness.log_parsers, harness.constants) modules, imported lightly."""
    if "swebench.harness" not in sys.modules:
        try:
            import swebench
        except ImportError:
            raise ImportError(
                "grading needs swebench 5.0.2 (log parsers and grading only): "
                "pip install --no-deps swebench==5.0.2 (tools/install_cpu.sh installs it)"
            ) from None

        spec = importlib.machinery.ModuleSpec("swebench.harness", None, is_package=True)
        spec.submodule_search_locations = [os.path.join(os.path.dirname(swebench.__file__), "harness")]
        package = importlib.util.module_from_spec(spec)
        sys.modules["swebench.harness"] = package
        swebench.harness = package
    return (
        importlib.import_module("swebench.harness.grading"),
        importlib.import_module("swebench.harness.log_parsers"),
        importlib.import_module("swebench.harness.constants"),
    )
