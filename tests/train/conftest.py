"""Trainer tests: a single-rank gloo world with the CPU compatibility layer, scoped to these tests."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="module")
def megatron_world():
    """torch.distributed (world 1, gloo) and Megatron-Core on CPU for the module's tests; undone after."""
    from swe_megatron.train import cpu_compat, parallel

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    parallel.init_distributed(0, 1, master_port=parallel.free_port())
    yield
    parallel.destroy()
    cpu_compat.disable()
