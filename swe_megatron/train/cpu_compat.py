"""Let Megatron-Core run on a machine without CUDA, over gloo: the one place that knows how.

Megatron-Core assumes CUDA throughout: tensors are created with `device="cuda"` or
`device=torch.cuda.current_device()` (attention masks, RoPE frequencies, logit gathers, pipeline
buffers, DDP grad buffers, grad-norm clipping, the optimizer's scale tensors, checkpoint
strategies), its RNG tracker swaps CUDA generator states, and its pipeline schedules and DDP touch
CUDA streams and events. On CPU this module redirects all of that to the CPU:

- a `TorchFunctionMode` rewrites every CUDA device argument of torch calls (factory functions,
  `Tensor.to`, `Tensor.cuda`) to the CPU, so the many call sites need no patch each, and answers
  `Tensor.type()` with the CUDA type name the optimizers assert on;
- `torch.cuda.current_device` answers 0 (which the mode maps to the CPU) and the stream, event and
  synchronisation calls become no-ops;
- the model-parallel RNG tracker keeps CPU generator states;
- `triton`, imported unconditionally by an MoE kernel module that a dense model never runs, gets an
  inert stand-in when it is not installed.

It is applied once per process, by `enable()` (trainer ranks call it through `parallel.py`), and
only when CUDA is absent; on a GPU machine `enable()` does nothing. `disable()` undoes it (tests).
Context and sequence parallelism cannot run on CPU (both assert on Transformer Engine attention/norm
kernels), nor can activation recomputation (it reruns layers in the backward, outside the device mode),
so `refuse_unsupported()` rejects them with one clear message.

The patches are written against the Megatron-Core version in `PATCHED_VERSION` and refuse to apply to
any other one: a newer Megatron-Core must be re-checked (tests/train/test_cpu_compat.py) first.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types

import torch
from torch.overrides import TorchFunctionMode

from swe_megatron.errors import UsageError

PATCHED_VERSION = "0.19.2"
"""The megatron-core release these patches were written and tested against."""

_state: dict[str, object] = {"enabled": False, "mode": None}


class UnsupportedOnCpu(UsageError, ValueError):
    """A trainer setting that needs CUDA kernels was asked for on a machine without CUDA (a UsageError: the CLI's
    one line, not a traceback)."""


def _is_cuda_device(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    # A bare int is a CUDA ordinal for torch factory functions and Tensor.to.
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaToCpu(TorchFunctionMode):
    """Rewrites CUDA device arguments to the CPU for every torch call made while it is active."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and _is_cuda_device(device):
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # Megatron's optimizers assert `t.type() == "torch.cuda.FloatTensor"` on fp32 params/grads.
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class _NoStream:
    """Stands in for `torch.cuda.Stream` / `Event`: every method is a no-op."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _cpu_rng_tracker_class(base):
    """The Megatron RNG tracker with CPU generator states (CUDA has none to swap here)."""

    class CpuRNGStatesTracker(base):
        """Megatron's `CudaRNGStatesTracker` whose named states are CPU generator states."""

        def add(self, name, seed):
            """Register a named state seeded with `seed`, leaving the current state as it was."""
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            orig = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(orig)

    return CpuRNGStatesTracker


def _check_version() -> None:
    from megatron.core import package_info

    version = package_info.__version__.split("+")[0]
    if version != PATCHED_VERSION:
        raise RuntimeError(
            f"swe_megatron.train.cpu_compat patches megatron-core {PATCHED_VERSION}, found {version}: "
            "install megatron-core=={PATCHED_VERSION} for CPU runs, or re-check the patches "
            "(tests/train/test_cpu_compat.py) and update PATCHED_VERSION."
        )


def _stub_triton() -> None:
    if importlib.util.find_spec("triton") is not None:
        return
    triton = types.ModuleType("triton")
    language = types.ModuleType("triton.language")
    triton.jit = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
    triton.autotune = lambda *a, **kw: lambda f: f
    triton.Config = lambda *a, **kw: None
    triton.cdiv = lambda a, b: -(-a // b)
    language.constexpr = object
    triton.language = language
    sys.modules["triton"] = triton
    sys.modules["triton.language"] = language


_CUDA_NAMES = (
    "current_device",
    "synchronize",
    "empty_cache",
    "Stream",
    "Event",
    "current_stream",
    "default_stream",
    "stream",
    "set_device",
    "manual_seed",
    "get_rng_state",
    "set_rng_state",
)


def _patch_torch_cuda() -> None:
    cuda = torch.cuda
    _state["saved"] = {name: getattr(cuda, name) for name in _CUDA_NAMES}
    cuda.current_device = lambda: 0
    cuda.synchronize = lambda *a, **kw: None
    cuda.empty_cache = lambda: None
    cuda.Stream = _NoStream
    cuda.Event = _NoStream
    cuda.current_stream = lambda *a, **kw: _NoStream()
    cuda.default_stream = lambda *a, **kw: _NoStream()
    cuda.stream = lambda *a, **kw: contextlib.nullcontext()
    cuda.set_device = lambda *a, **kw: None
    cuda.manual_seed = torch.manual_seed
    cuda.get_rng_state = lambda *a, **kw: torch.get_rng_state()
    cuda.set_rng_state = lambda state, *a, **kw: torch.set_rng_state(state)


def _patch_megatron() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **kw: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **kw: torch.set_rng_state(state)
    if not getattr(mrandom.CudaRNGStatesTracker, "_swe_cpu", False):
        mrandom.CudaRNGStatesTracker = _cpu_rng_tracker_class(mrandom.CudaRNGStatesTracker)
        mrandom.CudaRNGStatesTracker._swe_cpu = True
    mrandom.initialize_rng_tracker(force_reset=True)


def enable() -> bool:
    """Apply the CPU redirections if CUDA is absent; returns whether they are active. Idempotent."""
    if torch.cuda.is_available():
        return False
    if _state["enabled"]:
        return True
    _stub_triton()
    _check_version()
    _patch_torch_cuda()
    _patch_megatron()
    mode = _CudaToCpu()
    mode.__enter__()
    _state.update(enabled=True, mode=mode)
    return True


def disable() -> None:
    """Undo `enable()` (torch.cuda functions and the device mode; Megatron keeps its CPU RNG tracker)."""
    if not _state["enabled"]:
        return
    _state["mode"].__exit__(None, None, None)
    for name, fn in _state.pop("saved").items():
        setattr(torch.cuda, name, fn)
    _state.update(enabled=False, mode=None)


def is_enabled() -> bool:
    """Whether `enable()` has redirected CUDA to the CPU in this process."""
    return bool(_state["enabled"])


def refuse_unsupported(context_parallel: int, sequence_parallel: bool, recompute: str = "none") -> None:
    """Raise `UnsupportedOnCpu` for context/sequence parallelism or recomputation on a machine without CUDA.

    Recomputation reruns layers inside Megatron's checkpoint backward, where this module's device mode
    is not active (autograd does not carry torch-function modes into it), so their CUDA calls fail.
    """
    if torch.cuda.is_available():
        return
    wanted = []
    if context_parallel > 1:
        wanted.append(f"parallel.context_parallel={context_parallel}")
    if sequence_parallel:
        wanted.append("parallel.sequence_parallel=true")
    if str(getattr(recompute, "value", recompute)) != "none":
        wanted.append(f"parallel.recompute={getattr(recompute, 'value', recompute)}")
    if wanted:
        raise UnsupportedOnCpu(
            f"{' and '.join(wanted)} needs CUDA (Megatron-Core implements them with Transformer Engine "
            "attention and norm kernels; recomputation reruns CUDA code in the backward), and this machine "
            "has none: set parallel.context_parallel=1, parallel.sequence_parallel=false and "
            "parallel.recompute=none for CPU runs."
        )
