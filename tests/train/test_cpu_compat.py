"""The CPU compatibility layer: what it redirects, its version pin, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from swe_megatron.train import cpu_compat

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the layer applies only without CUDA")


@pytest.fixture
def enabled():
    cpu_compat.enable()
    yield
    cpu_compat.disable()


def test_cuda_device_arguments_land_on_cpu(enabled):
    assert cpu_compat.is_enabled() and cpu_compat.enable()  # idempotent
    for device in ("cuda", "cuda:0", torch.device("cuda"), torch.cuda.current_device()):
        assert torch.zeros(2, device=device).device.type == "cpu"
    t = torch.ones(3)
    assert t.cuda().device.type == "cpu" and t.to("cuda").device.type == "cpu"
    assert t.type() == "torch.cuda.FloatTensor"  # what Megatron's optimizers assert on
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda.synchronize()


def test_disable_restores_torch():
    cpu_compat.enable()
    cpu_compat.disable()
    assert not cpu_compat.is_enabled()
    assert torch.ones(1).type() == "torch.FloatTensor"
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")


def test_megatron_rng_tracker_forks_cpu_states(enabled):
    from megatron.core import tensor_parallel

    tracker = tensor_parallel.get_cuda_rng_tracker()
    tracker.reset()
    tracker.add("a", 1234)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with tracker.fork("a"):
        x = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)  # the default stream is untouched
    torch.manual_seed(1234)
    assert torch.equal(x, torch.rand(4))  # the forked stream is the seeded one
    with tracker.fork("a"):
        y = torch.rand(4)
    assert not torch.equal(x, y)  # and it advances


def test_version_pin(monkeypatch):
    from megatron.core import package_info

    monkeypatch.setattr(package_info, "__version__", "0.20.0")
    with pytest.raises(RuntimeError, match="patches megatron-core 0.19.2, found 0.20.0"):
        cpu_compat._check_version()


def test_context_and_sequence_parallel_refused():
    with pytest.raises(cpu_compat.UnsupportedOnCpu, match="context_parallel=2 .*needs CUDA"):
        cpu_compat.refuse_unsupported(2, False)
    with pytest.raises(cpu_compat.UnsupportedOnCpu, match="sequence_parallel=true"):
        cpu_compat.refuse_unsupported(1, True)
    with pytest.raises(cpu_compat.UnsupportedOnCpu, match="recompute=full"):
        cpu_compat.refuse_unsupported(1, False, "full")
    cpu_compat.refuse_unsupported(1, False)
    cpu_compat.refuse_unsupported(1, False, "none")


def test_triton_stand_in_when_absent(monkeypatch):
    import importlib.util
    import sys

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.delitem(sys.modules, "triton.language", raising=False)
    cpu_compat._stub_triton()
    triton = sys.modules["triton"]

    def kernel():
        return 1

    assert triton.jit(kernel) is kernel and triton.cdiv(7, 2) == 4
    import triton.language as tl  # noqa: F401  (the import the MoE module does)
