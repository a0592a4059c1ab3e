"""Shared pytest setup: GPU tests are skipped where CUDA is absent."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    """Skip `gpu`-marked tests on machines without CUDA (the README's test command runs the rest)."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return  # importing torch costs seconds; only pay it when a GPU test was collected
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (gpu marker); this machine has none")
    for item in gpu_items:
        item.add_marker(skip)
