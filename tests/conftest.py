"""Shared pytest setup: GPU tests are skipped where CUDA is absent; with several workers (pytest-xdist,
`--dist loadgroup`, as tools/test.sh runs the suite) each test module is one unit of work, every Slurm test
is in one unit (they share the test cluster's nodes), and the slow units start first."""

from __future__ import annotations

import pytest

WEIGHT = {"slurm": 3, "e2e": 2, "dist": 1}
"""Which units start first on several workers: the slow kinds (jobs on the Slurm cluster, whole pipelines,
several ranks), so that a long unit does not start last and leave the other workers idle at the end."""


def pytest_collection_modifyitems(config, items):
    _skip_gpu_without_cuda(items)
    if getattr(config.option, "dist", "no") == "loadgroup":
        items[:] = _grouped(items)


def _skip_gpu_without_cuda(items) -> None:
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


def _grouped(items: list) -> list:
    """items with an xdist_group each (its module; "slurm" for Slurm tests), a unit's tests together, the units
    in order of weight (the heaviest marker any of their tests has), then of collection."""
    groups: dict[str, list] = {}
    for item in items:
        name = "slurm" if "slurm" in item.keywords else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(name))
        groups.setdefault(name, []).append(item)

    def weight(unit: list) -> int:
        return max((w for kind, w in WEIGHT.items() for item in unit if kind in item.keywords), default=0)

    order = sorted(groups.values(), key=weight, reverse=True)  # stable: collection order within a weight
    return [item for unit in order for item in unit]
