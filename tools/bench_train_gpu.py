"""Trainer throughput on GPUs: tokens/s and MFU of DAPO/SFT train steps for a tiny and a ~1B Qwen2 config.

Figures go in docs/benchmarks.md ("Trainer"). Usage on one GPU node, from the repo root:

    .venv/bin/python tools/bench_train_gpu.py --model 1b --gpus 1
    .venv/bin/python tools/bench_train_gpu.py --model 1b --gpus 8 --tp 2 --cp 2 --sp --recompute full
    .venv/bin/python tools/bench_train_gpu.py --model tiny --gpus 1 --dtype float32

It starts one process per GPU itself (NCCL, localhost rendezvous), builds the `Trainer` exactly as a run
does (Transformer Engine spec when installed, bf16 by default, the layout given), and times `--steps`
SFT optimiser steps (after `--warmup`) over random trajectories of `--length` tokens (half of them action
tokens) packed under `--micro-batch-tokens`. Reported on rank 0 (JSON): step seconds, tokens/s for the
whole job and per GPU, and MFU = model FLOPs / (step time x GPUs x peak), with model FLOPs per token
= 6 x (non-embedding params + output layer) + 12 x layers x hidden x length / 2 (causal attention,
forward + backward), x 4/3 with full recomputation; peak = --peak-tflops (default: 989 for H100/H200
bf16 dense). On a machine without CUDA it runs the same code on CPU over gloo (a smoke test, no MFU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {
    # The embedded tiny-qwen2 shape (real vocabulary).
    "tiny": dict(
        hidden_size=64, intermediate_size=192, num_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    # ~1.2B parameters: a Qwen2.5-1.5B-like shape with 16 layers.
    "1b": dict(
        hidden_size=2048, intermediate_size=5632, num_layers=16, num_attention_heads=16, num_key_value_heads=2
    ),
}


def model_flops_per_token(cfg, length: int, recompute_full: bool) -> float:
    """Training FLOPs per token (forward + backward) of the dense decoder at this sequence length."""
    from swe_megatron.train.memory_plan import params_per_layer

    dense = cfg.num_layers * params_per_layer(cfg) + cfg.vocab_size * cfg.hidden_size  # + output layer
    flops = 6 * dense + 12 * cfg.num_layers * cfg.hidden_size * length / 2
    return flops * (4 / 3 if recompute_full else 1)


def _worker(rank: int, world: int, port: int, a: argparse.Namespace) -> None:
    from swe_megatron.config.schema import ModelConfig, OptimConfig, ParallelConfig, Recompute
    from swe_megatron.train import parallel
    from swe_megatron.train.packing import TrainSample
    from swe_megatron.train.step import LossSpec, Trainer

    cfg = dataclasses.replace(ModelConfig(tie_word_embeddings=False), params_dtype=a.dtype, **SHAPES[a.model])
    par = ParallelConfig(
        tensor_parallel=a.tp,
        pipeline_parallel=a.pp,
        context_parallel=a.cp,
        sequence_parallel=a.sp,
        use_distributed_optimizer=a.distributed_optimizer,
        recompute=Recompute(a.recompute),
        micro_batch_tokens=a.micro_batch_tokens,
        world_size=world,
    )
    parallel.init_distributed(rank, world, master_port=port)
    parallel.init_model_parallel(par, seed=0)
    trainer = Trainer(cfg, par, OptimConfig(lr=1e-5), total_steps=a.warmup + a.steps)
    g = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(a.trajectories):
        mask = torch.rand(a.length, generator=g) < 0.5
        mask[0] = False
        samples.append(TrainSample(torch.randint(0, cfg.vocab_size, (a.length,), generator=g), mask))
    times = []
    for step in range(a.warmup + a.steps):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        trainer.update(samples, 1, LossSpec("sft"))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - start)
    if rank == 0:
        step_s = statistics.median(times)
        tokens = a.trajectories * a.length
        out = {
            "model": a.model,
            "params_b": round(
                sum(p.numel() for p in trainer.model.module.parameters()) * a.tp * a.pp / 1e9, 3
            ),
            "layout": f"TP{a.tp} PP{a.pp} CP{a.cp} DP{world // (a.tp * a.pp * a.cp)}"
            + (" SP" if a.sp else "")
            + (" distopt" if a.distributed_optimizer else ""),
            "dtype": a.dtype,
            "recompute": a.recompute,
            "gpus": world if torch.cuda.is_available() else 0,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "step_s": round(step_s, 4),
            "tokens_per_s": round(tokens / step_s, 1),
            "tokens_per_s_per_gpu": round(tokens / step_s / world, 1),
        }
        if torch.cuda.is_available():
            flops = model_flops_per_token(trainer.model_cfg, a.length, a.recompute == "full") * tokens
            out["mfu"] = round(flops / (step_s * world * a.peak_tflops * 1e12), 4)
            out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        print(json.dumps(out), flush=True)
    parallel.destroy()


def main(argv: list[str] | None = None) -> None:
    """Parse the layout and run it on --gpus processes."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--gpus", type=int, default=1, help="processes (one per GPU)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism (needs TP > 1)")
    p.add_argument("--distributed-optimizer", action="store_true")
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--trajectories", type=int, default=16)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument(
        "--peak-tflops", type=float, default=989.0, help="per-GPU dense peak for MFU (H100/H200 bf16)"
    )
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        a.dtype = "float32"  # CPU smoke run
    import torch.multiprocessing as mp

    from swe_megatron.train.parallel import free_port

    mp.start_processes(_worker, args=(a.gpus, free_port(), a), nprocs=a.gpus, start_method="spawn")


if __name__ == "__main__":
    main()
