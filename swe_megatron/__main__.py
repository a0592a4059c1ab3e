"""`python -m swe_megatron ...`: the same as the `swe-megatron` console script."""

import sys

try:
    from swe_megatron import cli
except ModuleNotFoundError as e:
    if (e.name or "").startswith("swe_megatron"):
        raise  # a defect of this package, not a missing install
    # Typically a Python outside the project's venv (a fresh shell without `source .venv/bin/activate`).
    sys.exit(
        f"python -m swe_megatron: {sys.executable} lacks {e.name}, which swe_megatron needs: run "
        ".venv/bin/python -m swe_megatron (or .venv/bin/swe-megatron) from the repository root, after "
        "tools/install_cpu.sh"
    )

cli.run()
