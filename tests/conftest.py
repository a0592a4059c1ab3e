"""Shared pytest setup: GPU tests are skipped where CUDA is absent; on several pytest-xdist workers (as
tools/test.sh runs the suite, `--dist loadfile`: a test file is one unit of work) the slow files start
first, and the Slurm test files are one unit of work together (one worker runs them, one at a time)."""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import sys
import tempfile
from pathlib import Path

import pytest

SLURM_LOCK = Path(tempfile.gettempdir()) / f"swe-megatron-slurm-tests-{os.getuid()}.lock"
"""Held by the Slurm test running now, when several workers run the suite: they share the test cluster's nodes
(a small test's job left pending behind another worker's 3-node job timed out)."""

WEIGHT = {"slurm": 3, "e2e": 2, "dist": 1}
"""Which files start first on several workers: the slow kinds (jobs on the Slurm cluster, whole pipelines,
several ranks), so that a long file does not start last and leave the other workers idle at the end."""


def pytest_configure(config):
    _absl_leaves_pytest_capture_open()


def _absl_leaves_pytest_capture_open() -> None:
    """absl.logging (megatron.core imports it) makes its handler at import with the sys.stderr of that moment:
    under pytest, the capture's file. logging.config.dictConfig (importing submitit or vLLM) closes every
    handler, and absl's closes its stream unless it is sys.stderr at that moment; under capsys it is not, so it
    closed pytest's capture file and every later test of that worker erred ("I/O operation on closed file").
    Made here, its handler writes to the real stderr, which it never closes."""
    try:
        from absl import logging as absl_logging
    except ImportError:
        return
    absl_logging.get_absl_handler().python_handler.setStream(sys.__stderr__)


def pytest_collection_modifyitems(config, items):
    _skip_gpu_without_cuda(items)
    if hasattr(config, "workerinput"):  # an xdist worker: its collection order is the order of the units
        items[:] = slow_files_first(items)


SLURM_UNIT = "tests that submit Slurm jobs"
"""The one unit of work of every Slurm test file under `--dist loadfile` (SlurmFilesTogether)."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with the Slurm test files as one unit of work, so one worker runs them in turn while the
    others go on with the rest: as separate files, a worker that drew one waited for the lock below, idle, while
    another worker's 3-node job ran (~16 minutes of one worker's time in CI)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    root = config.rootpath

    class SlurmFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return SLURM_UNIT if _submits_slurm_jobs(root / path) else path

    return SlurmFilesTogether(config, log)


@functools.cache
def _submits_slurm_jobs(path: Path) -> bool:
    """Whether a test file has `slurm`-marked tests (the controller sees node ids only, not markers)."""
    try:
        return "pytest.mark.slurm" in path.read_text(errors="replace")
    except OSError:
        return False


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


def slow_files_first(items: list) -> list:
    """items with each file's tests together, the files in order of weight (the heaviest marker any of their
    tests has), then of collection."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def weight(tests: list) -> int:
        return max((w for kind, w in WEIGHT.items() for item in tests if kind in item.keywords), default=0)

    order = sorted(files.values(), key=weight, reverse=True)  # stable: collection order within a weight
    return [item for tests in order for item in tests]


@pytest.fixture(autouse=True)
def one_slurm_test_at_a_time(request):
    """On an xdist worker, a `slurm` test waits for the other workers' Slurm tests (SLURM_LOCK): with the
    Slurm files one unit of work no other worker runs one, but other schedulers (`--dist load`) may."""
    if "slurm" not in request.node.keywords or not hasattr(request.config, "workerinput"):
        yield
        return
    with SLURM_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(autouse=True)
def logging_back():
    """A command stopped by a signal (cli.main, errors.stop_on_signal) silences warnings for the rest of its
    process; in the test process that leaked into later tests (the cgroup tests' caplog saw nothing)."""
    yield
    logging.disable(logging.NOTSET)
