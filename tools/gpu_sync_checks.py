#!/usr/bin/env python3
"""What one GPU can show of the sync path's memory and failure handling (issue 41 item 6). tools/gpu_check.sh
runs it after the GPU tests; it prints one `gpu_sync:` line per figure and the rows for docs/benchmarks.md.

    python tools/gpu_sync_checks.py [--only CHECK ...] [--timeout S]    # on a CUDA machine, ~1-2 min

Each check runs in a child process of its own (the allocator reads its settings once, at CUDA's first use; a
hang ends at --timeout and is reported as one, never spending the whole device budget):
  allocator_default  a train-like run (activations for micro-batches of varying length, freed after each) under
                     torch's default allocator settings: peak reserved vs peak allocated, segments, cudaMallocs
  allocator_trainer  the same under the trainer ranks' settings (launch/steps.py ALLOCATOR_CONF as
                     PYTORCH_ALLOC_CONF), with the settings string torch parsed
  empty_cache        after that run, `release_cached_memory()` (train/weight_sync.py, what the trainer calls
                     before a sync): reserved and device-free memory before and after, then what a 1-member NCCL
                     sync group and one bucket take
  nccl_abort         `SyncGroup` on NCCL, started with SYNC_ENV: a 2-member group whose second member never
                     comes (join gives up at the deadline, abort ends the forming communicator, its helper thread
                     ends), a formed group aborted after a broadcast, and the process going on (a CUDA op, a fresh
                     group that broadcasts)
Without CUDA every check reports "needs a GPU" (exit 0). Two processes on one GPU cannot share an NCCL group
(NCCL refuses a duplicate GPU), so the never-coming member stands in for a peer that died before its first
collective; a receiver killed mid-bucket needs two GPUs (tests/engine/test_weight_sync_gpu.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from swe_megatron.engine.sync_env import SYNC_ENV  # noqa: E402
from swe_megatron.launch.steps import ALLOCATOR_CONF  # noqa: E402

GIB = 2**30
ALLOC_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""The CUDA allocator reads PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF (torch 2.14.0 CUDAAllocatorConfig.h)."""
RESULT = "RESULT "
"""Prefix of a child's one line of results (JSON)."""
STEP = "STEP "
"""Prefix of a child's progress lines: a check that hangs is reported with the last step it began."""
NEEDS_GPU = "needs a GPU (torch.cuda.is_available() is False)"
EXPANDABLE = re.compile(r"expandable_segments\s*:\s*true", re.I)
"""ALLOCATOR_CONF's setting, as torch's settings string may spell it."""


def micro_batch_tokens(steps: int, lo: int, hi: int, seed: int = 0) -> list[int]:
    """Token counts of `steps` packed micro-batches, uniform in [lo, hi] in multiples of 128 (deterministic):
    the varying shapes that fragment a caching allocator."""
    rng = random.Random(seed)
    return [128 * rng.randint(-(-lo // 128), hi // 128) for _ in range(steps)]


def train_like(device, tokens: list[int], hidden: int = 8192, layers: int = 8, weight_gib: float = 1.0):
    """Allocate like a training step per entry of `tokens`: one activation of [tokens, hidden] bf16 per layer,
    then a gradient of each in reverse order (each activation freed after its gradient), all freed at the step's
    end; `weight_gib` stays allocated throughout. Returns the weights (the caller frees them). Memory is never
    touched (torch.empty), so this costs allocator calls only."""
    import torch

    weights = torch.empty(int(weight_gib * GIB), dtype=torch.uint8, device=device)
    for n in tokens:
        acts = [torch.empty(n, hidden, dtype=torch.bfloat16, device=device) for _ in range(layers)]
        grads = []
        while acts:
            grads.append(torch.empty_like(acts[-1]))
            acts.pop()
        del grads
    return weights


def child_env(check: str, environ) -> dict[str, str]:
    """The environment a check's child starts with: torch's default allocator settings for allocator_default,
    else the trainer ranks' (ALLOCATOR_CONF) and the sync's (SYNC_ENV)."""
    env = {k: v for k, v in environ.items() if k not in ALLOC_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH", "")) if p)
    if check == "allocator_default":
        return env
    return {**env, "PYTORCH_ALLOC_CONF": ALLOCATOR_CONF, **SYNC_ENV}


def _memory(torch, device) -> dict:
    free, total = torch.cuda.mem_get_info(device)
    return {
        "allocated_gib": torch.cuda.memory_allocated(device) / GIB,
        "reserved_gib": torch.cuda.memory_reserved(device) / GIB,
        "device_free_gib": free / GIB,
        "device_total_gib": total / GIB,
    }


def check_allocator(device) -> dict:
    """The train-like run under this process's allocator settings: peaks, segments and cudaMallocs."""
    import torch

    torch.cuda.reset_peak_memory_stats(device)
    start = time.monotonic()
    weights = train_like(device, micro_batch_tokens(40, 2048, 32768))
    torch.cuda.synchronize(device)
    took = time.monotonic() - start
    stats = torch.cuda.memory_stats(device)
    get_settings = getattr(torch._C, "_accelerator_getAllocatorSettings", None)  # torch >= 2.9
    out = {
        "settings": get_settings() if get_settings else f"(torch {torch.__version__} cannot say)",
        "backend": torch.cuda.get_allocator_backend(),
        "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
        "segments_peak": stats.get("segment.all.peak"),
        "device_mallocs": stats.get("num_device_alloc"),
        "alloc_retries": stats.get("num_alloc_retries"),
        "run_s": took,
    }
    out["reserved_over_allocated"] = out["peak_reserved_gib"] / out["peak_allocated_gib"]
    del weights
    return out


def check_empty_cache(device, bucket_bytes: int = 512 * 2**20) -> dict:
    """The trainer's release_cached_memory() after a train-like run, then a 1-member sync group and a bucket."""
    import torch
    import torch.distributed as dist

    from swe_megatron.engine.weight_receiver import SyncGroup
    from swe_megatron.train.weight_sync import release_cached_memory

    weights = train_like(device, micro_batch_tokens(40, 2048, 32768))
    torch.cuda.synchronize(device)
    before = _memory(torch, device)
    start = time.monotonic()
    release_cached_memory()
    release_ms = (time.monotonic() - start) * 1e3
    after = _memory(torch, device)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    group = SyncGroup(store, "mem", 0, 1, device, 60.0)
    group.await_members()
    group.join()
    torch.cuda.synchronize(device)
    with_group = _memory(torch, device)
    bucket = torch.zeros(bucket_bytes, dtype=torch.uint8, device=device)
    group.broadcast(bucket)
    torch.cuda.synchronize(device)
    with_bucket = _memory(torch, device)
    group.close()
    del weights, bucket
    return {
        "before": before,
        "after": after,
        "release_ms": release_ms,
        "released_gib": before["reserved_gib"] - after["reserved_gib"],
        "device_free_gained_gib": after["device_free_gib"] - before["device_free_gib"],
        "group_gib": after["device_free_gib"] - with_group["device_free_gib"],
        "bucket_gib": with_group["device_free_gib"] - with_bucket["device_free_gib"],
    }


def step(label: str) -> None:
    """In a child: say that `label` begins (flushed at once, so a hang's report can name it)."""
    print(f"{STEP}{label}", flush=True)


def _join_helpers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith("-join")]


def check_abort(device, deadline_s: float = 5.0, helper_wait_s: float = 30.0) -> dict:
    """SyncGroup's failure path on `device` (NCCL on CUDA; gloo on CPU, as the unit test runs it): a member that
    never comes, a formed group aborted after a broadcast, and the process going on with a fresh group."""
    import torch
    import torch.distributed as dist

    from swe_megatron.engine.weight_receiver import SyncAborted, SyncGroup

    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    out: dict = {"deadline_s": deadline_s}
    # 1. A 2-member group whose rank 1 never comes (dead after the go, before its first collective).
    step("1. join of a 2-member group whose rank 1 never comes")
    absent = SyncGroup(store, "absent", 0, 2, device, deadline_s)
    earlier = set(_join_helpers())
    start = time.monotonic()
    try:
        absent.join()
        out["absent_join"] = "formed without its second member (wrong)"
    except SyncAborted as e:
        out["absent_join"] = str(e)
    out["absent_join_s"] = time.monotonic() - start
    step("1. abort of the given-up group")
    start = time.monotonic()
    absent.abort("gpu_sync_checks: rank 1 never came")
    out["absent_abort_ms"] = (time.monotonic() - start) * 1e3
    out["absent_abort_returned"] = absent.abort_returned  # False: waited ABORT_WAIT_S and went on without it
    out["absent_group_made"] = absent.group is not None
    helpers = [t for t in _join_helpers() if t not in earlier]
    step(f"1. waiting up to {helper_wait_s:g} s for the join's helper thread to end")
    for t in helpers:
        t.join(helper_wait_s)
    out["absent_helper_alive"] = any(t.is_alive() for t in helpers)
    out["absent_helper_ended_s"] = None if out["absent_helper_alive"] else time.monotonic() - start
    # 2. A formed group of one, aborted after a broadcast.
    step("2. a group of one forms and broadcasts")
    formed = SyncGroup(store, "formed", 0, 1, device, 60.0)
    formed.await_members()
    formed.join()
    formed.broadcast(torch.ones(16 * 2**20, dtype=torch.uint8, device=device))
    step("2. abort of the formed group")
    start = time.monotonic()
    formed.abort("gpu_sync_checks: aborted after a broadcast")
    out["formed_abort_ms"] = (time.monotonic() - start) * 1e3
    # 3. The process goes on: a computation, and a fresh group that broadcasts and closes.
    step("3. a computation after the aborts")
    ones = torch.ones(1 << 20, device=device)
    out["after_compute_ok"] = float(ones.sum()) == float(1 << 20)  # exact in fp32
    step("3. a fresh group forms, broadcasts and closes")
    start = time.monotonic()
    fresh = SyncGroup(store, "fresh", 0, 1, device, 60.0)
    fresh.await_members()
    fresh.join()
    data = torch.arange(8, dtype=torch.float32, device=device)
    fresh.broadcast(data)
    fresh.close()
    out["fresh_sync_s"] = time.monotonic() - start
    out["fresh_sync_ok"] = data.tolist() == [float(i) for i in range(8)]
    return out


def _nccl_abort(device) -> dict:
    import torch

    out = check_abort(device)
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return out


CHECKS: dict[str, Callable] = {
    "allocator_default": check_allocator,
    "allocator_trainer": check_allocator,
    "empty_cache": check_empty_cache,
    "nccl_abort": _nccl_abort,
}
"""Each check's function of the CUDA device, run in a child started with child_env(name)."""


def run_child(name: str) -> dict:
    """In the child: run one check on cuda:0; {"skipped": ...} without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {"skipped": NEEDS_GPU}
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    return {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(device), **CHECKS[name](device)}


def run_check(argv: list[str], env: dict[str, str], timeout_s: float) -> dict:
    """Start a child (argv), wait up to timeout_s, and return its RESULT line's JSON, or {"error": why}; a hang's
    error names the last STEP the child began."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, text=True)
        try:
            proc.wait(timeout=timeout_s)
            hung = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            hung = True
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = stdout.splitlines()
    if hung:
        steps = [line[len(STEP) :] for line in lines if line.startswith(STEP)]
        return {"error": f"hung: no result after {timeout_s:g} s" + (f" (in: {steps[-1]})" if steps else "")}
    results = [line for line in lines if line.startswith(RESULT)]
    if proc.returncode != 0 or not results:
        tail = " | ".join((stderr or stdout).strip().splitlines()[-3:])
        return {"error": f"exit {proc.returncode}: {tail}"}
    return json.loads(results[-1][len(RESULT) :])


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


def figure_lines(name: str, result: dict) -> list[str]:
    """`gpu_sync: CHECK.KEY = VALUE`, one line per figure of one check (printed as soon as the check ends)."""
    return [f"gpu_sync: {name}.{key} = {_fmt(v)}" for key, v in result.items()]


def table(results: dict[str, dict]) -> list[str]:
    """A markdown table of one row per check, for docs/benchmarks.md."""
    lines = ["| check | result |", "|---|---|"]
    for name, res in results.items():
        if "skipped" in res or "error" in res:
            lines.append(f"| {name} | {res.get('skipped') or res['error']} |")
            continue
        keep = {k: v for k, v in res.items() if k not in ("torch", "gpu")}
        lines.append(f"| {name} | " + "; ".join(f"{k} {_fmt(v)}" for k, v in keep.items()) + " |")
    return lines


def problems(results: dict[str, dict]) -> list[str]:
    """What in the results contradicts the design (docs/weight_sync.md): a check that failed or hung, a given-up
    join that did not end at its deadline or left its helper thread running, a process that could not go on
    after an abort, an empty_cache that released nothing, the trainer's settings not in effect."""
    out = [f"{name}: {res['error']}" for name, res in results.items() if "error" in res]
    ab = results.get("nccl_abort", {})
    if "absent_join" in ab:
        if "took longer than" not in ab["absent_join"]:
            out.append(f"nccl_abort: a join without its second member ended with: {ab['absent_join']}")
        if ab["absent_helper_alive"]:
            out.append(
                "nccl_abort: the helper thread of the given-up join was still running 30 s after the abort"
            )
        if not (ab["after_compute_ok"] and ab["fresh_sync_ok"]):
            out.append("nccl_abort: after the aborts, a computation or a fresh sync group failed")
    ec = results.get("empty_cache", {})
    if "before" in ec and ec["after"]["reserved_gib"] > ec["before"]["reserved_gib"]:
        out.append("empty_cache: reserved memory grew across release_cached_memory()")
    at = results.get("allocator_trainer", {})
    settings = at.get("settings", "")
    if "settings" in at and not settings.startswith("(") and not EXPANDABLE.search(settings):
        out.append(f"allocator_trainer: {ALLOCATOR_CONF} is not in torch's settings ({settings!r})")
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the checks (each in its own child), print the figures; 0 unless a check failed, hung or showed a
    problem (each printed as a `gpu_sync: PROBLEM` line)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=list(CHECKS), help="run these checks only")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds each check may take (default 60)")
    p.add_argument("--child", choices=list(CHECKS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(RESULT + json.dumps(run_child(args.child)), flush=True)
        return 0
    results = {}
    for name in args.only or CHECKS:
        start = time.monotonic()
        argv_child = [sys.executable, str(Path(__file__).resolve()), "--child", name]
        results[name] = run_check(argv_child, child_env(name, os.environ), args.timeout)
        lines = [
            *figure_lines(name, results[name]),
            f"gpu_sync: {name} took {time.monotonic() - start:.1f} s",
        ]
        print("\n".join(lines), flush=True)
    print("\n".join(["", *table(results)]), flush=True)
    found = problems(results)
    for line in found:
        print(f"gpu_sync: PROBLEM {line}", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
